"""The supervisor's put path: producer mailbox requests in, stamped commitlog records out.

One sweep (called from the supervisor loop after sem-sup is posted or a timer runs out):

1. take every published, not yet appended request (MailboxServer.pending_slots);
2. copy their bytes out of shared memory, back to back in one private buffer (so a producer
   cannot change a record between its check and its append), cut each request into records
   and check each record's structure (request_check, whole-array operations) -- a bad record
   gets MESSAGE_ILLEGAL and never reaches the log, a request whose framing is broken gets it
   for all its records; the good ones go on;
3. assign queue offsets from the topic-queue table and append the good records of all the
   sweep's requests with one CommitLog.append_stampable (stamp queue offsets, commit
   positions, store time and CRC32Cs in the private copy with numpy, then one pwrite per
   segment run): a burst of requests pays the append's fixed cost once;
4. publish the written position once for the sweep;
5. answer: under async flush, or for a request without WAIT_FOR_FLUSH, at once; under sync
   flush the request waits for the group commit and is answered PUT_OK when the published
   flushed position passes its last record, or FLUSH_DISK_TIMEOUT at its deadline
   (sync_flush_timeout_ms after it was appended; the records stay in the log either way).
   When no flush runs, the loop flushes the sweep itself (GroupCommit.flush_if_idle) and
   answers; otherwise the flush thread answers the requests its flush made durable (right after
   its sync). A flush of the loop's own stuck on the disk for STUCK_FLUSH_S lets the idle flush
   thread serve new requests (sweep_if_stuck), so they still get FLUSH_DISK_TIMEOUT at their
   deadline from the deadline thread (workers/flush_waiters.py holds the waiting requests and
   answers them); `_sweep_lock` keeps sweeps one at a time.

A sweep of a few records that all pass (send-and-wait: a few one-record requests) goes
steps 2-5 with lists, tuples and struct instead (_serve_few, CommitLog.append_few, packed
answer rows): numpy's fixed cost per call outweighs the work of a few records
(docs/DECISIONS.md#small-batches-scalar). Anything else goes the batch way, which says why.

Each answer's latency (from the sweep that took the request to the answer) goes into a tally
of the answering thread, added to the control block's put latency histogram once per answered
batch (ipc/put_latency.py): nothing per record, one group write per batch.

Answers are result rows packed in a bytearray (the batch way fills them through a numpy view)
and copied into the slot's results area; nothing is pickled. While the store
stops, `admitting` is False and new requests are answered SERVICE_NOT_AVAILABLE (not stored).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass

import numpy as np

from engine.config import FlushPolicy, StoreConfig
from engine.errors import BadInputError, DiskFullError, RecordRefusedError, StoreError
from engine.files.filesystem import disk_usage_ratio
from engine.formats.record.encode_many import EncodedRecords
from engine.log.commitlog import CommitLog
from engine.refusal import Refusal
from engine.retention.expiry import is_disk_full
from engine.status import PUT_OK_CODE, PutStatus
from engine.topics.live import LiveTopics
from engine.topics.table import TopicChange, TopicTable
from engine.tuning import STRUCT_PATH_MAX_RECORDS
from ipc.mailbox import (
    REFUSAL_DTYPE,
    RESULT_DTYPE,
    RESULT_ROW,
    RESULT_SIZE,
    MailboxServer,
    PendingRequest,
    RequestFlag,
)
from ipc.put_latency import LatencyTally
from workers.flush_waiters import FlushWaiters, Waiting, status_rows, unstore_rows
from workers.group_commit import GroupCommit
from workers.request_check import CheckedRequest, RecordChecker, merge_checked

DISK_CHECK_INTERVAL_S = 1.0
STUCK_FLUSH_S = 0.05  # the loop's own flush taking longer: the flush thread serves new requests
WAITS = int(RequestFlag.WAIT_FOR_FLUSH)  # an int: IntFlag operators cost ~1 us a request

log = logging.getLogger(__name__)


@dataclass
class _Served:
    """A request of the sweep: its checked records (None when its framing is broken), where its
    bytes start in the sweep's private copy, its answer rows and how many of its records are in."""

    request: PendingRequest
    rows: bytearray  # the answer rows, which `results` views
    results: np.ndarray
    checked: CheckedRequest | None
    base: int
    waits: bool
    stored: int = 0

    @property
    def good(self) -> np.ndarray | slice:
        """The rows of its records that passed the check."""
        return np.empty(0, np.int64) if self.checked is None else self.checked.good_rows


class Appender:
    """Serves the mailbox: checks, appends and answers producer requests."""

    def __init__(self, commitlog: CommitLog, server: MailboxServer, group_commit: GroupCommit,
                 config: StoreConfig, next_offsets: dict[tuple[str, int], int], *, root,
                 topics: LiveTopics):
        self.commitlog = commitlog
        self.server = server
        self.group_commit = group_commit
        self.config = config
        self.root = root
        self.sync = config.flush is FlushPolicy.SYNC
        self.topics = topics
        self.checker = RecordChecker(max_body_bytes=config.max_body_bytes,
                                     segment_bytes=config.commitlog_file_size, route=topics.route)
        self.next_offsets = next_offsets
        self.admitting = True
        self.waiters = FlushWaiters(server, group_commit, config.sync_flush_timeout_ms)
        self._sweep_lock = threading.Lock()  # the loop's sweep, or the flush thread's while it is stuck
        self._own_flush_since: float | None = None  # when the loop began a flush of its own
        self._disk_checked = 0.0
        self._disk_full = False
        self._copy_buf = bytearray()  # holds each request's private copy in turn (_private_copy)
        self.appended_msgs = 0
        self.write_error: OSError | StoreError | None = None  # a failed commitlog write stops the store

    @property
    def waiting_count(self) -> int:
        return len(self.waiters)

    def next_deadline(self) -> float | None:
        return self.waiters.next_deadline()

    def answer_flushed(self) -> None:
        """Answer the waiting requests the flush passed or whose deadline passed (any thread)."""
        self.waiters.answer_flushed()

    def sweep(self) -> int:
        """Append every new request, publish, flush (or have it flushed), answer what can be
        answered; messages appended."""
        with self._sweep_lock:
            appended, written = self._append_new()
        # everything written is flushed under sync (WAIT=false too, just not awaited), also what
        # the flush thread appended while this thread's last flush was stuck (sweep_if_stuck)
        if self.sync and written > self.group_commit.published_flushed:
            self._own_flush_since = time.monotonic()
            try:
                flushed = self.group_commit.flush_if_idle(written)
            finally:
                self._own_flush_since = None
            if not flushed:
                self.group_commit.request(written)
        self.answer_flushed()
        return appended

    def append_store_made(self, records: EncodedRecords, topics: list[str], queue_ids: list[int]) -> int:
        """The one door for records the store makes itself, past the producers' check (which
        refuses system topics and store-set properties): delivered delayed messages now, the
        retry path's %RETRY% and %DLQ% records later. Appends them with the next queue offsets,
        publishes the written position and returns where the last one ends (DiskFullError: nothing
        was written)."""
        keys = list(zip(topics, queue_ids, strict=True))
        with self._sweep_lock:
            self._configure_store_made(set(keys))
            counters = {key: itertools.count(self.next_offsets.get(key, 0)) for key in set(keys)}
            offsets = [next(counters[key]) for key in keys]
            positions = self.commitlog.append_encoded(records.buf, records.starts, records.sizes, offsets,
                                                      time.time_ns() // 1_000_000)
            self.next_offsets.update({key: next(counter) for key, counter in counters.items()})
            self.group_commit.publish_written(len(keys))
        return int(positions[-1] + records.sizes[-1])

    def _configure_store_made(self, keys: set[tuple[str, int]]) -> None:
        """The topics store-made records go to, created as a first send creates one (a delayed
        message's real topic may be new, or deleted since): the record is acknowledged, so a
        refusal of the topic rule is logged, never a reason to drop it."""
        for topic, queue_id in sorted(keys):
            try:
                self.topics.route(topic, queue_id)
            except RecordRefusedError as exc:
                log.warning("delivering to %s queue %d although its topic rule refuses it: %s",
                            topic, queue_id, exc)

    def sweep_if_stuck(self) -> None:
        """From the idle flush thread: while the loop's own flush has been stuck on the disk for
        STUCK_FLUSH_S, append new requests here, so they are stored and answered at their
        deadline rather than after the disk. Their flush is the loop's, once it is back (their
        posts of sem-sup still wait for it). A disk that blocks writes too (fsfreeze) holds this
        sweep in its write; the deadline thread still answers what is registered."""
        since = self._own_flush_since
        if since is None or time.monotonic() - since < STUCK_FLUSH_S:
            return
        if not self._sweep_lock.acquire(blocking=False):
            return
        try:
            self._append_new()
        finally:
            self._sweep_lock.release()

    def _append_new(self) -> tuple[int, int]:
        """Serve every new request; (messages appended, the written position published)."""
        pending = self.server.pending_slots()
        appended = 0
        if pending:
            answered = LatencyTally()  # the requests this sweep answers at once (not those that wait)
            taken_ns = time.monotonic_ns()
            requests = self._not_taken(pending)
            status = self._refusal() if requests else None
            if status is not None:
                for request in requests:
                    self.server.complete_rows(request.slot_index, request.seq,
                                              status_rows(request.count, status))
                    answered.observe(time.monotonic_ns() - taken_ns)
                    self._count_failed(status, request.count)
            elif requests:
                few = self._serve_few(requests, taken_ns, answered)
                appended = self._serve(requests, taken_ns, answered) if few is None else few
            if answered.count:
                self.group_commit.ctl.add_put_latencies(answered)
            self.appended_msgs += appended
        return appended, self.group_commit.publish_written(appended)

    def change_topic(self, change: TopicChange) -> TopicTable:
        """Apply an operator's topic change between sweeps: a delete's tombstone is the
        written end, flushed, above every record taken so far, and the topic's queue offsets restart."""
        with self._sweep_lock:
            return self.topics.apply(change, self.next_offsets, self.group_commit.flush_written)

    def _not_taken(self, pending: list[PendingRequest]) -> list[PendingRequest]:
        """The requests neither waiting for a flush nor answered by the flush thread since
        pending_slots() listed them (none may be appended twice)."""
        waiters, answered = self.waiters, self.server.is_answered
        with waiters.lock:
            return [request for request in pending if not waiters.holds(request.slot_index, request.seq)
                    and not answered(request.slot_index, request.seq)]

    def _waits(self, request: PendingRequest) -> bool:
        """Whether the flush answers `request` (a sync store, asked to wait), not its sweep."""
        return self.sync and bool(int(request.flags) & WAITS)

    def _refusal(self) -> PutStatus | None:
        """Why no request is taken now (the store stops, the disk is full), or None."""
        if not self.admitting:
            return PutStatus.SERVICE_NOT_AVAILABLE
        if self._is_disk_full():
            return PutStatus.DISK_FULL
        return None

    def _serve_few(self, requests: list[PendingRequest], taken_ns: int,
                   answered: LatencyTally) -> int | None:
        """_serve of a sweep of a few records whose every record passes the check, with lists,
        tuples and struct instead of numpy and per-request objects (send-and-wait: one record a
        request, a few requests a sweep; docs/DECISIONS.md#small-batches-scalar); messages
        appended. None, having done nothing, when the sweep is larger or a request fails the
        check: _serve then serves it and says what is wrong."""
        if sum(request.count for request in requests) > STRUCT_PATH_MAX_RECORDS:
            return None
        blob = bytearray().join([request.data for request in requests])  # the private copy
        routes = self._check_few(requests, blob)
        if routes is None:
            return None
        sizes, offsets, taken = self._few_offsets(routes)
        store_ts_ms = time.time_ns() // 1_000_000
        answers: list[tuple[PendingRequest, bytearray | bytes, bool]] = []

        def register(positions: list[int]) -> None:  # before the write, as _append's fill_rows
            deadline, at, pack = time.monotonic() + self.waiters.timeout_s, 0, RESULT_ROW.pack
            for request, checked in zip(requests, routes, strict=True):
                rows = bytearray().join([pack(PUT_OK_CODE, route[3], positions[at + k], offsets[at + k],
                                              store_ts_ms) for k, route in enumerate(checked)])
                at += len(checked)
                waits = self._waits(request)
                answers.append((request, rows, waits))
                if waits:
                    self.waiters.add(request.slot_index, Waiting(
                        request.seq, positions[at - 1] + sizes[at - 1], deadline, rows, taken_ns))

        try:
            self.commitlog.append_few(blob, sizes, offsets, store_ts_ms, before_write=register)
        except DiskFullError as exc:  # nothing was written
            log.warning("disk full while appending: %s", exc)
            unstored = self._unstored_few(requests, answers, PutStatus.DISK_FULL)
        except (OSError, StoreError) as exc:  # the disk refused a write or a roll: the loop stops
            self.write_error = exc
            unstored = self._unstored_few(requests, answers, PutStatus.UNKNOWN_ERROR)
        else:
            self.next_offsets.update(taken)  # only once the records are in: no offset is skipped
            self._answer_now([(request, rows) for request, rows, waits in answers if not waits],
                             taken_ns, answered)
            return len(sizes)
        self._answer_now(unstored, taken_ns, answered)
        return 0

    def _check_few(self, requests: list[PendingRequest], blob: bytearray) -> list | None:
        """RecordChecker.check_few of each request laid in `blob`: their routes, or None when
        one fails."""
        routes, base = [], 0
        with memoryview(blob) as view:
            for request in requests:
                end = base + len(request.data)
                checked = self.checker.check_few(view, base, end, request.count)
                if checked is None:
                    return None
                routes.append(checked)
                base = end
        return routes

    def _few_offsets(self, routes: list) -> tuple[list[int], list[int], dict]:
        """Each record's size and queue offset, and the next free offset of each (topic, queue
        id) the records take."""
        next_offsets, taken, sizes, offsets = self.next_offsets, {}, [], []
        for checked in routes:
            for _, size, topic, queue_id in checked:
                key = (topic, queue_id)
                offset = taken.get(key)
                if offset is None:
                    offset = next_offsets.get(key, 0)
                taken[key] = offset + 1
                sizes.append(size)
                offsets.append(offset)
        return sizes, offsets, taken

    def _unstored_few(self, requests: list[PendingRequest], answers: list, status: PutStatus
                      ) -> list[tuple[PendingRequest, bytearray | bytes]]:
        """_serve_few's append failed: take its requests back from the waiters (unless a deadline
        answered one already); every request with its rows, each record now `status` (rows made
        for the requests the append failed before reaching)."""
        failed = 0
        for request, rows, waits in answers:
            if waits:
                self.waiters.take_back(request.slot_index, request.seq)
            failed += unstore_rows(rows, status)
        unreached = requests[len(answers):]
        self._count_failed(status, failed + sum(request.count for request in unreached))
        return [(request, rows) for request, rows, _ in answers] + \
            [(request, status_rows(request.count, status)) for request in unreached]

    def _answer_now(self, answers: list[tuple[PendingRequest, bytearray | bytes]], taken_ns: int,
                    answered: LatencyTally) -> None:
        """Answer requests that do not wait for the flush, with one answer time for them all.
        A deadline may have answered a waiting request while its write failed: not twice."""
        answered_ns = time.monotonic_ns()
        for request, rows in answers:
            if not self.server.is_answered(request.slot_index, request.seq):
                self.server.complete_rows(request.slot_index, request.seq, rows)
                answered.observe(answered_ns - taken_ns)

    def _serve(self, requests: list[PendingRequest], taken_ns: int, answered: LatencyTally) -> int:
        """Check each request, append the good records of all of them at once, answer those that
        do not wait for the flush (tallied in `answered`); messages appended."""
        data = self._private_copy([request.data for request in requests])
        batch: list[_Served] = []
        base = 0
        for request in requests:
            rows = bytearray(request.count * RESULT_SIZE)
            results = np.frombuffer(rows, dtype=RESULT_DTYPE)
            end = base + len(request.data)
            checked = self._check(request, data[base:end], results)
            waits = self._waits(request)
            batch.append(_Served(request, rows, results, checked, base, waits))
            base = end
        stored = self._append(data, [served for served in batch if served.checked is not None],
                              taken_ns)
        self._answer_now([(served.request, served.rows) for served in batch
                          if not (served.stored and served.waits)],  # the flush answers those
                         taken_ns, answered)
        return stored

    def _private_copy(self, pieces: list[memoryview]) -> memoryview:
        """The requests' records copied out of their slots, back to back, so a producer cannot
        change a record between its check and its append. The buffer is kept across sweeps: a
        new one each time costs more in page faults than the copy (docs/DECISIONS.md#checksums-on-views)."""
        total = sum(len(piece) for piece in pieces)
        if len(self._copy_buf) < total:
            self._copy_buf = bytearray(total)
        copy = memoryview(self._copy_buf)[:total]
        at = 0
        for piece in pieces:
            copy[at:at + len(piece)] = piece
            at += len(piece)
        return copy

    def _check(self, request: PendingRequest, data: memoryview,
               results: np.ndarray) -> CheckedRequest | None:
        try:
            checked = self.checker.check_request(data, request.count)
        except BadInputError as exc:
            log.warning("slot %d (pid %d): malformed request: %s", request.slot_index,
                        request.owner_pid, exc)
            results["status"] = PutStatus.MESSAGE_ILLEGAL
            results.view(REFUSAL_DTYPE)["refusal"] = Refusal.MALFORMED_REQUEST
            self._count_failed(PutStatus.MESSAGE_ILLEGAL, request.count)
            return None
        if not checked.reasons:
            return checked
        refusals = results.view(REFUSAL_DTYPE)  # a refused row carries why (engine.refusal)
        failed: dict[PutStatus, int] = {}
        for i, reason in checked.reasons.items():
            log.warning("slot %d (pid %d): record %d refused: %s", request.slot_index,
                        request.owner_pid, i, reason)
            refusals[i] = (reason.put_status, reason.refusal, reason.limit, reason.found, 0)
            failed[reason.put_status] = failed.get(reason.put_status, 0) + 1
        for status, count in failed.items():
            self._count_failed(status, count)
        return checked

    def _append(self, data: memoryview, batch: list[_Served], taken_ns: int) -> int:
        """Assign queue offsets and append the good records of every checked request of the
        sweep with one CommitLog.append_stampable; returns how many. A request that waits for the
        flush is registered with the waiters, its rows filled in, before the write (before_write),
        so the deadline thread can answer it even while the write hangs on a stalled disk."""
        if not batch:
            return 0
        merged = merge_checked(data, [(served.base, served.checked) for served in batch])
        if not merged.count:
            return 0
        keys = list(zip(merged.topics, merged.queue_ids, strict=True))
        counters = {key: itertools.count(self.next_offsets.get(key, 0)) for key in set(keys)}
        offsets = np.array([next(counters[key]) for key in keys], dtype=np.int64)
        taken = {key: next(counter) for key, counter in counters.items()}  # the next free offset
        store_ts_ms = time.time_ns() // 1_000_000

        def fill_rows(positions: np.ndarray) -> None:
            ends = positions + merged.records.sizes
            now = time.monotonic()
            for served, (first, end) in zip(batch, merged.spans, strict=True):
                if first == end:
                    continue
                rows, results = served.good, served.results
                results["status"][rows] = PutStatus.PUT_OK
                results["queue_id"][rows] = merged.queue_ids[first:end]
                results["commit_pos"][rows] = positions[first:end]
                results["queue_offset"][rows] = offsets[first:end]
                results["store_ts_ms"][rows] = store_ts_ms
                served.stored = end - first
                if served.waits:
                    self.waiters.add(served.request.slot_index, Waiting(
                        served.request.seq, int(ends[end - 1]), now + self.waiters.timeout_s,
                        served.rows, taken_ns))

        try:
            self.commitlog.append_stampable(merged.records, offsets, store_ts_ms, before_write=fill_rows)
        except DiskFullError as exc:  # nothing was written (append_stampable is all or nothing)
            log.warning("disk full while appending: %s", exc)
            return self._unstored(batch, PutStatus.DISK_FULL)
        except (OSError, StoreError) as exc:  # the disk refused a write or a roll (EIO, EROFS):
            self.write_error = exc                # the loop stops the store
            return self._unstored(batch, PutStatus.UNKNOWN_ERROR)
        self.next_offsets.update(taken)  # only once the records are in: no offset is skipped
        return merged.count

    def _unstored(self, batch: list[_Served], status: PutStatus) -> int:
        """The append failed: take the requests back from the waiters (unless a deadline answered
        one already) and mark their good records `status`; 0 records stored."""
        for served in batch:
            self.waiters.take_back(served.request.slot_index, served.request.seq)
        failed = 0
        for served in batch:
            rows = served.results["status"][served.good]
            failed += len(rows)
            served.results["status"][served.good] = status
            served.stored = 0
        self._count_failed(status, failed)
        return 0

    def _count_failed(self, status: PutStatus, count: int) -> None:
        """Publish `count` answers of a failed status (a PUT_OK is counted by appended_msgs: the
        common path publishes nothing more)."""
        if count:
            self.group_commit.ctl.count_put_statuses({status: count})

    def _is_disk_full(self) -> bool:
        now = time.monotonic()
        if now - self._disk_checked >= DISK_CHECK_INTERVAL_S:
            self._disk_checked = now
            full = is_disk_full(disk_usage_ratio(self.root), self.config)
            if full != self._disk_full:
                log.warning("disk %s", "full: refusing puts with DISK_FULL" if full else
                            "has room again: accepting puts")
            self._disk_full = full
        return self._disk_full
