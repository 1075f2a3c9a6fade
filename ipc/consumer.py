"""Consumer: reads a running store's queues from a co-located process, read-only.

    with Consumer("./data", "billing") as consumer:
        result = consumer.pull("orders", 0, max_count=32, timeout_ms=1000)  # long poll
        for record in result.messages:
            ...
        columns = consumer.pull_columns("orders", 0, max_count=1024)  # numpy columns, no Records
        consumer.commit("orders", 0, result.next_offset)
        for record in consumer.iterate("orders", follow=True):  # every queue of the topic
            ...

A consumer maps the consume queues and the commitlog read-only (Access.READ_ONLY), adopting
files as they appear. It only ever reads records below the dispatcher's published
`dispatched_pos`, which under sync flush never passes the flushed position: a consumer never
sees a message that a crash could take back. Each record read is checked against the entry
that led to it (topic, queue id, queue offset), so a torn entry can never hand out a wrong
message. A record whose own bytes are bad (a checksum fails, a torn header) is passed over and
reported (engine.log.record_reads: a WARNING and the result's `skipped`), so the good records
around it are delivered and the next offset moves past it.

A queue's min offset is the first entry whose record still exists: each read looks whether
retention deleted the commitlog's first segment and skips the entries pointing below what
remains at once (ConsumeQueue.correct_min_offset, a binary search).

`pull_columns` is the batch read (well under 1 us of consumer CPU per message): the records of a pull
are gathered as numpy columns (engine.formats.record.view), bodies are views of the mapping and
the checks against the entries run on whole arrays. It checks structure, not CRCs: the
dispatcher scans at Verify.STRUCTURE too, so below `dispatched_pos` the checksums were checked
only on the way in (the supervisor's request check verifies BODYCRC before the append, the store
seals the CRC32C) and by recovery after a crash; a bit flipped on disk since then goes unseen
unless the caller asks for Record objects (`ColumnsResult.records`, Verify.MQSTORE) or uses `pull`
(see docs/DECISIONS.md#structure-checks-after-append).
A caller reading many queues sweeps them with `pull_columns` and, when a sweep found nothing,
sleeps in `wait_for_more(bound)` with the `dispatched_pos` it read before the sweep.

Long polling waits on the published position through the waiter table (ipc.wakeup): the
dispatcher posts the consumer's own semaphore after each batch; no busy loop. Committed offsets
live in config/consumerOffset.json (ipc.consumer_offsets); `iterate` writes them on a timer
(`commit_interval_ms`) and when it ends, not after every batch. Statuses are RocketMQ's
(engine.status.GetStatus); the constructor raises ServiceNotAvailableError at once when no
supervisor runs on the store.

Groups: `iterate(topic)` and `assignment(topic)` subscribe. A CLUSTERING member (the default)
joins its group on the topic and reads only the queues RocketMQ's average allocation gives it
over the group's live members (ipc.group_share): liveness and ownership are flocks the kernel
drops at death, a queue is let go only after its marks are written, and only its owner commits
it. BROADCASTING reads every queue with offsets of its own instance. `pull`, `pull_columns` and
`iterate(queue_ids=...)` are the assign API: the queues named, no membership.
`seek_to_time(topic, ts_ms)` starts every queue of a topic at a store time (a binary search
over the consume queue), on a running store.

Restarts (ipc.reattach): when the supervisor exits (a clean stop or a crash), the next pull,
wait or iteration step waits up to `reattach_timeout_s` for the next one and goes on there; a
long poll in progress survives it (its own timeout still counts), and ServiceNotAvailableError
names the bound when no supervisor came back.
"""

from __future__ import annotations

import bisect
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from engine.errors import (
    BadInputError,
    CommittedOffsetError,
    CorruptConsumeQueueError,
    CorruptRecordError,
    QueueNotOwnedError,
    ServiceNotAvailableError,
    StoreClosedError,
)
from engine.files.mapped_file import Access
from engine.files.naming import validate_topic
from engine.files.store_dir import read_meta
from engine.filters.subscription import Subscription, subscription_of
from engine.formats.record import V4_HEADER_SIZE, Record, Verify, decode_record, store_ts_at
from engine.formats.record.view import RecordView, entry_mismatches, gather_records
from engine.log.commitlog import CommitLog
from engine.log.record_reads import read_subscribed_records, skip
from engine.message import validate_queue_id
from engine.queues.consume_queue import Boundary, ConsumeQueue
from engine.queues.table import ConsumeQueueTable
from engine.status import GetResult, GetStatus, SkippedRecord
from engine.topics.table import TopicDefaults, TopicTableFile, perm_text
from ipc.consumer_offsets import ConsumerOffsets, broadcast_offsets_path, validate_group
from ipc.group_members import GroupMembership
from ipc.group_roster import MessageModel
from ipc.group_share import REBALANCE_INTERVAL_S, GroupShare
from ipc.producer import attach_running_store
from ipc.queue_locks import borrow_free_queue_locks
from ipc.reattach import (
    DEFAULT_REATTACH_TIMEOUT_S,
    SupervisorWatch,
    validate_reattach_timeout,
    wait_for_supervisor,
)
from ipc.refused_offsets import (
    RefusedOffset,
    clear_refused,
    find_refused,
    read_refused,
    record_refused,
    refusal_message,
)
from ipc.run_info import run_dir
from ipc.store_log import append_to_store_log
from ipc.wakeup import ConsumerWaiter, WaiterTable

log = logging.getLogger(__name__)
DEFAULT_MAX_COUNT = 32
_MOVES = (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE, GetStatus.OFFSET_TOO_SMALL,
          GetStatus.OFFSET_OVERFLOW_BADLY)
MAX_PULL_COUNT = 4096
SUPERVISOR_CHECK_INTERVAL_S = 0.05
DEFAULT_COMMIT_INTERVAL_MS = 1000
# a committed offset past its queue's end is judged once the dispatcher caught up, waiting this long
DISPATCH_CATCH_UP_TIMEOUT_MS = 2000
UNJUDGED_QUEUE_END = 2**63 - 1  # the dispatcher did not catch up: no end to judge against


@dataclass(frozen=True, slots=True)
class ColumnsResult:
    """What `Consumer.pull_columns` read from one queue: GetResult's status and offsets, the
    records as one RecordView per commitlog segment they lie in (in queue order), and the
    records passed over because they have no sound frame or, under a subscription, properties
    that do not decode (not delivered, next_offset past them)."""

    status: GetStatus
    views: list[RecordView] = field(default_factory=list)
    next_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0
    skipped: list[SkippedRecord] = field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(view.count for view in self.views)

    def records(self, verify: Verify = Verify.MQSTORE) -> list[Record]:
        """The records as Record objects, decoded and checked at `verify` (as `pull` does); one
        that fails the check is passed over and reported (a WARNING, and added to `skipped`)."""
        records = []
        for view in self.views:
            for i, pos in enumerate((view.commit_pos - view.base_pos).tolist()):
                try:
                    records.append(decode_record(view.buf, pos, verify=verify, base_pos=view.base_pos))
                except CorruptRecordError as exc:
                    if all(s.commit_pos != exc.pos for s in self.skipped):
                        skip(self.skipped, SkippedRecord(exc.pos, exc.reason, view.topic(i),
                                                         int(view.queue_id[i]), int(view.queue_offset[i])))
        return records


class _Span(NamedTuple):
    """The consume-queue entries a read covers, from `offset`, and the queue's visible range."""

    queue: ConsumeQueue
    offset: int
    entries: np.ndarray
    low: int
    high: int


class Consumer:
    """A consumer group member reading one store; not thread-safe (one per thread). Usable in a
    child made by os.fork(): the child waits on a waiter entry of its own. While open it holds
    its group's membership lock (ipc.group_members), so the group's offsets are not reset under it.

    `iterate(topic)` and `assignment(topic)` subscribe: under MessageModel.CLUSTERING (the
    default) the member joins its group on the topic and reads only the queues the group gives
    it (ipc.group_share); under BROADCASTING it reads every queue, with offsets of its own
    (`instance_name`). `pull`, `pull_columns` and `iterate(queue_ids=...)` read the queues named
    (the assign API), joining nothing."""

    def __init__(self, store_dir: str | os.PathLike, group: str, *,
                 model: MessageModel = MessageModel.CLUSTERING, instance_name: str | None = None,
                 reattach_timeout_s: float = DEFAULT_REATTACH_TIMEOUT_S):
        self.group = validate_group(group)
        self.model, self.instance_name = _validate_model(model, instance_name)
        self.root = Path(store_dir)
        self._reattach_timeout_s = validate_reattach_timeout(reattach_timeout_s)
        self._ctl, self.info = attach_running_store(self.root)
        opened: list = [self._ctl]  # closed again, newest first, if a later step fails
        try:
            self._watch = SupervisorWatch(self._ctl.supervisor_pid)
            opened.append(self._watch)
            # the group's live consumers are the holders of this lock (`mqstore groups --reset`)
            self._membership = GroupMembership(self.root, self.group)
            opened.append(self._membership)
            meta = read_meta(self.root)
            self.commitlog = CommitLog.open(self.root, meta.commitlog_file_size, Access.READ_ONLY)
            opened.append(self.commitlog)
            self.queues = ConsumeQueueTable(self.root, meta.consume_queue_entries, Access.READ_ONLY)
        except BaseException:
            for resource in reversed(opened):
                resource.close()
            raise
        self.offsets = ConsumerOffsets(self.root) if self.instance_name is None else ConsumerOffsets(
            self.root, broadcast_offsets_path(self.root, self.instance_name))
        self._shares: dict[str, GroupShare] = {}  # topic: this member's share of its queues
        self._positions: dict[tuple[str, int], int] = {}  # (topic, queue id): seek_to_time's
        self._topic_file = TopicTableFile(self.root)
        self._table: WaiterTable | None = None
        self._waiter: ConsumerWaiter | None = None
        self._closed = False
        self._uncommitted: dict[tuple[str, int], int] = {}  # (topic, queue id): iterate's, unwritten
        # (topic, queue id): how many `iterate`s are inside a batch of it (not let go until done)
        self._in_batch: dict[tuple[str, int], int] = {}
        self._iterated_topics: set[str] = set()  # topics a member's `iterate` is live on
        self._tombstones_read: dict[str, int] = {}  # topic: its tombstone (0: none) at its last read here
        self._pid = os.getpid()  # a forked child adopts the consumer on its first call
        self._supervisor_seen_s = -SUPERVISOR_CHECK_INTERVAL_S  # when it was last seen alive

    def read_queue_count(self, topic: str) -> int:
        """How many queues of `topic` a consumer reads (config/topics.json, read again when the
        file changed; the store's default for a topic not created yet)."""
        return self._topic_file.current().read_queue_count(topic, TopicDefaults(self.info.queue_count))

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The consume queue to read, None when there is none: the queues cached here follow the
        topic table's tombstones (one stat), so after a delete and a re-create the old queue is
        never read again, however long this consumer lives."""
        tombstones = self._topic_file.current().tombstones
        if tombstones != self.queues.tombstones:
            self.queues.adopt_tombstones(tombstones)
        self._tombstones_read[topic] = tombstones.get(topic, 0)  # judges this topic's commits
        return self.queues.get_live(topic, queue_id)

    def _require_readable(self, topic: str) -> None:
        """RocketMQ's rule: a topic whose perm lacks read (4) is not read (its broker answers a
        pull NO_PERMISSION); BadInputError, nothing read or committed."""
        config = self._topic_file.current().topics.get(topic)
        if config is not None and not config.readable:
            raise BadInputError("topic", f"{topic}'s perm {perm_text(config.perm)} does not allow reads "
                                "(`mqstore topic update --perm rw`)")

    def _tombstones_seen(self) -> dict[str, int]:
        """Each topic's tombstone as this consumer last read the topic (as it is now for a topic
        it has not read: its offset comes from no read): a commit of a topic deleted since is dropped."""
        return {**self._topic_file.current().tombstones, **self._tombstones_read}

    def topic_exists(self, topic: str) -> bool:
        """Whether `topic` is configured (created, by an operator or by its first message)."""
        return topic in self._topic_file.current().topics

    # ------------------------------------------------------------------------------ pull
    def pull(self, topic: str, queue_id: int, offset: int | None = None,
             max_count: int = DEFAULT_MAX_COUNT, timeout_ms: int = 0, *, tags: str | None = None,
             where: str | None = None) -> GetResult:
        """Up to `max_count` messages of one queue from `offset` (default: the committed offset,
        else the queue's min offset). With `timeout_ms`, waits that long for a first message.

        `tags` ('A || B') and `where` (a property filter) subscribe to part of the queue
        (engine.filters.subscription): what they filter out is passed over (next_offset moves past it)
        and a read examines a bounded span, so it may return NO_MATCHED_MESSAGE at once."""
        subscription = subscription_of(tags, where)
        return self._poll(self._read, topic, queue_id, offset, max_count, timeout_ms, subscription)

    def pull_columns(self, topic: str, queue_id: int, offset: int | None = None,
                     max_count: int = DEFAULT_MAX_COUNT, timeout_ms: int = 0, *, tags: str | None = None,
                     where: str | None = None) -> ColumnsResult:
        """`pull`, read as columns: the records of each commitlog segment as one RecordView
        (numpy columns, bodies as views of the mapping, properties decoded when asked).

        Same statuses, offsets, subscription and long poll as `pull`. Each record is checked
        against its consume-queue entry (sound frame, size, topic, queue id and offset) for the
        whole batch at once, and the tags filter runs on whole arrays; no CRC is checked (`pull`
        checks BODYCRC and CRC32C of every record)."""
        subscription = subscription_of(tags, where)
        return self._poll(self._read_columns, topic, queue_id, offset, max_count, timeout_ms, subscription)

    def _poll(self, read, topic: str, queue_id: int, offset: int | None, max_count: int,
              timeout_ms: int, subscription: Subscription):
        """Validate a pull, then `read` until something is found or `timeout_ms` has passed."""
        self._adopt_if_forked()  # before the positions are looked at: a parent's seek is not the child's
        validate_topic(topic)
        self._require_readable(topic)
        validate_queue_id(queue_id, self.read_queue_count(topic))
        _require_count("max_count", max_count, 1, MAX_PULL_COUNT)
        _require_count("timeout_ms", timeout_ms, 0, 2**31)
        if offset is None:
            offset = self._positions.get((topic, queue_id))
        if offset is None:
            offset = self.committed(topic, queue_id)
        elif not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise BadInputError("offset", f"{offset!r} is not a non-negative int")
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            self._require_supervisor()
            bound = self._ctl.dispatched_pos
            result = read(topic, queue_id, offset, max_count, bound, subscription)
            remaining = deadline - time.monotonic()
            if result.status is GetStatus.FOUND or remaining <= 0 or result.status not in (
                    GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.OFFSET_OVERFLOW_ONE):
                return result
            self._wait_past(bound, remaining)

    def _span(self, topic: str, queue_id: int, offset: int | None, entry_count: int,
              bound: int) -> GetResult | _Span:
        """Up to `entry_count` entries a read from `offset` covers, or the GetResult saying why
        there are none."""
        queue = self._queue(topic, queue_id)
        if queue is None:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, next_offset=offset or 0)
        queue.refresh()
        high = visible_max(queue, bound)
        low = queue.correct_min_offset(self._log_min_pos(), high)
        if offset is None:
            offset = low
        if high <= low and offset == low:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, next_offset=offset, min_offset=low,
                             max_offset=high)
        if offset < low:
            return GetResult(GetStatus.OFFSET_TOO_SMALL, next_offset=low, min_offset=low, max_offset=high)
        if offset == high:
            return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, next_offset=offset, min_offset=low,
                             max_offset=high)
        if offset > high:
            return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, next_offset=high, min_offset=low,
                             max_offset=high)
        return _Span(queue, offset, queue.entries(offset, min(entry_count, high - offset)), low, high)

    def _read(self, topic: str, queue_id: int, offset: int | None, max_count: int,
              bound: int, subscription: Subscription) -> GetResult:
        span = self._span(topic, queue_id, offset, subscription.scan_entries(max_count), bound)
        if isinstance(span, GetResult):
            return span
        read = read_subscribed_records(self.commitlog, span.queue, span.offset, span.entries,
                                       subscription, max_count)
        status = GetStatus.FOUND if read.records else GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, read.records, span.offset + read.examined, span.low, span.high,
                         read.skipped)

    def _read_columns(self, topic: str, queue_id: int, offset: int | None, max_count: int,
                      bound: int, subscription: Subscription) -> ColumnsResult:
        span = self._span(topic, queue_id, offset, subscription.scan_entries(max_count), bound)
        if isinstance(span, GetResult):
            return ColumnsResult(span.status, [], span.next_offset, span.min_offset, span.max_offset)
        end_offset = span.offset + len(span.entries)
        queue_offsets = np.arange(span.offset, end_offset, dtype=np.int64)
        entries = span.entries
        if not subscription.matches_all:  # only the candidates' records are read
            candidates = subscription.candidates(entries["tags_code"])
            entries, queue_offsets = entries[candidates], queue_offsets[candidates]
        commit_pos = entries["commit_pos"].astype(np.int64)
        sizes = entries["size"].astype(np.int64)
        live = commit_pos >= self.commitlog.min_pos  # below: expired by retention
        if not live.all():
            commit_pos, sizes, queue_offsets = commit_pos[live], sizes[live], queue_offsets[live]
        segment_bytes = self.commitlog.segment_bytes
        segment_no = commit_pos // segment_bytes
        cuts = (np.flatnonzero(segment_no[1:] != segment_no[:-1]) + 1).tolist()
        views: list[RecordView] = []
        skipped: list[SkippedRecord] = []
        runs = zip([0, *cuts], [*cuts, len(commit_pos)], strict=True) if len(commit_pos) else ()
        for lo, hi in runs:  # none when every entry was filtered out or expired
            base_pos = int(segment_no[lo]) * segment_bytes
            buf = self._segment_buf(span.queue, base_pos, int(queue_offsets[lo]))
            view = gather_records(buf, commit_pos[lo:hi] - base_pos, base_pos)
            bad = entry_mismatches(view, sizes[lo:hi], topic.encode(), queue_id, queue_offsets[lo:hi])
            if len(bad):
                view = self._drop_torn(span.queue, view, bad, queue_offsets[lo:hi], skipped)
            if view.count:
                views.append(view)
        next_offset = end_offset
        if not subscription.matches_all:
            views, next_offset, corrupt = subscription.subscribed_views(views, max_count, end_offset)
            for record in corrupt:  # properties the filter could not decode: passed over as torn ones are
                skip(skipped, record)
            skipped.sort(key=lambda record: record.queue_offset)
        count = sum(view.count for view in views)
        status = GetStatus.FOUND if count else GetStatus.NO_MATCHED_MESSAGE
        return ColumnsResult(status, views, next_offset, span.low, span.high, skipped)

    @staticmethod
    def _drop_torn(queue: ConsumeQueue, view: RecordView, bad: np.ndarray,
                   queue_offsets: np.ndarray, skipped: list[SkippedRecord]) -> RecordView:
        """`view` without its records that have no sound frame (torn or overwritten bytes: skipped
        and reported); a sound record that is not its entry's means the consume queue is wrong
        (CorruptConsumeQueueError)."""
        framed = view.framed[bad]
        if framed.any():
            i = int(bad[np.argmax(framed)])
            raise CorruptConsumeQueueError(
                f"entry {int(queue_offsets[i])} of {queue.topic}/{queue.queue_id} points at "
                f"{view.describe(i)}", path=str(queue.segments.directory),
                queue_offset=int(queue_offsets[i]))
        for i in bad.tolist():
            skip(skipped, SkippedRecord(int(view.commit_pos[i]), "no sound record frame", queue.topic,
                                        queue.queue_id, int(queue_offsets[i])))
        keep = np.ones(view.count, dtype=bool)
        keep[bad] = False
        return gather_records(view.buf, view.commit_pos[keep] - view.base_pos, view.base_pos)

    def _log_min_pos(self) -> int:
        """The commitlog's first position still on disk. Retention deletes segments from the
        front, so the first mapped segment's file is looked at (one stat) and the view refreshed
        when it is gone: a read never starts below what still exists."""
        if self.commitlog.segments.front_deleted():
            self.commitlog.refresh()
        return self.commitlog.min_pos

    def _segment_buf(self, queue: ConsumeQueue, base_pos: int, queue_offset: int) -> memoryview:
        """The mapping of the commitlog segment starting at `base_pos` (adopted if new)."""
        segment = self.commitlog.segments.find(base_pos)
        if segment is None:
            self.commitlog.refresh()
            segment = self.commitlog.segments.find(base_pos)
        if segment is None:
            raise CorruptConsumeQueueError(
                f"entry {queue_offset} of {queue.topic}/{queue.queue_id} points at commit "
                f"position {base_pos}+, which no commitlog segment holds",
                path=str(queue.segments.directory), queue_offset=queue_offset)
        return segment.buf

    # ------------------------------------------------------------------------------ wait
    @property
    def dispatched_pos(self) -> int:
        """The dispatcher's published position: every record below it can be read."""
        self._require_supervisor()
        return self._ctl.dispatched_pos

    def wait_for_more(self, bound: int, timeout_ms: int) -> bool:
        """Sleep until the dispatched position passes `bound` (read `dispatched_pos` before a
        sweep over many queues, call this when the sweep found nothing) or `timeout_ms` passes;
        True if it passed. No busy loop: the dispatcher posts this consumer's semaphore."""
        _require_count("timeout_ms", timeout_ms, 0, 2**31)
        deadline = time.monotonic() + timeout_ms / 1000.0
        self._require_supervisor()
        while self._ctl.dispatched_pos <= bound:
            self._require_supervisor()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._wait_past(bound, remaining)
        return True

    def _wait_past(self, bound: int, timeout_s: float) -> None:
        if self._waiter is None:
            self._table = WaiterTable.attach(self.root)
            self._waiter = ConsumerWaiter.register(self._table, run_dir(self.root))
        ctl = self._ctl
        self._waiter.wait(lambda: ctl.dispatched_pos > bound or self._supervisor_gone(),
                          min(timeout_s, 1.0))

    def _require_supervisor(self) -> None:
        """When the supervisor is gone (see _supervisor_gone), wait up to reattach_timeout_s for
        the next one and attach to it; ServiceNotAvailableError naming the bound if none came.
        The files stay mapped: a restart keeps them, and reads look for new segments anyway."""
        self._adopt_if_forked()
        if not self._supervisor_gone():
            return
        self._detach()
        try:
            self._ctl, self.info = wait_for_supervisor(
                self.root, lambda: attach_running_store(self.root), self._reattach_timeout_s)
        except ServiceNotAvailableError as exc:
            raise ServiceNotAvailableError(f"the store's supervisor is gone: {exc.message}",
                                           path=str(self.root), hint=exc.hint) from None
        self._watch = SupervisorWatch(self._ctl.supervisor_pid)
        self._supervisor_seen_s = time.monotonic()

    def _adopt_if_forked(self) -> None:
        """In a forked child: the waiter entry, the unwritten offsets and the group lock are the
        parent's; the child joins the group on its own, registers its own waiter when it first
        waits, and starts from what is on disk."""
        if self._pid == os.getpid():
            return
        if self._waiter is not None:
            self._waiter.forget()
            self._table.close()
            self._waiter = self._table = None
        self._uncommitted.clear()
        self._positions.clear()
        self._in_batch.clear()
        self._iterated_topics.clear()
        self._shares.clear()  # the parent's member files and queue locks were closed at fork
        if not self._closed:
            self._membership.rejoin()  # the inherited lock was closed at fork
        self._pid = os.getpid()

    def _detach(self) -> None:
        """Leave the waiter table and the control block of a supervisor that is gone."""
        if self._waiter is not None:
            self._waiter.close()
            self._table.close()
            self._waiter = self._table = None
        if self._ctl is not None:
            self._watch.close()
            self._ctl.close()
            self._ctl = None

    def _supervisor_gone(self) -> bool:
        """True if the supervisor's process is gone, looked at once per
        SUPERVISOR_CHECK_INTERVAL_S at most (the look reads /proc), by pulls and waits alike: a
        consumer woken for every dispatch step would otherwise look each time."""
        now = time.monotonic()
        if now - self._supervisor_seen_s < SUPERVISOR_CHECK_INTERVAL_S:
            return False
        if self._ctl is None or not self._watch.alive():
            return True
        self._supervisor_seen_s = now
        return False

    # ------------------------------------------------------------------------------ iterate
    def iterate(self, topic: str, *, tags: str | None = None, where: str | None = None,
                queue_ids: Iterable[int] | None = None, follow: bool = False, poll_timeout_ms: int = 1000,
                max_count: int = DEFAULT_MAX_COUNT, auto_commit: bool = True,
                on_skipped: Callable[[SkippedRecord], None] | None = None,
                commit_interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS) -> Iterator[Record]:
        """Every message of the topic's queues this consumer reads, from the committed offsets,
        or those of the subscription `tags` / `where` (as `pull`); a corrupt record is passed
        over (logged at WARNING, and handed to `on_skipped` when given).

        Without `queue_ids` it subscribes with its `tags` / `where` (see the class): a CLUSTERING member
        reads the queues its group gives it, rebalanced as members come and go, and commits a
        queue's offset before it lets the queue go; a queue is kept while a batch read from it
        is still being handed out (a rebalance lets it go once the batch is marked), so a member
        that holds a record without asking for the next keeps that queue. One such iterate per
        topic may be live at a time (BadInputError). With `queue_ids` it reads those queues and
        joins nothing. Without `follow` it stops when no queue it reads moves on (a member first
        waits up to `poll_timeout_ms` for the queues its group gives it to be handed over); with
        it, it long-polls for more, across a restart of the store (see `reattach_timeout_s`). A
        committed offset below a queue's min offset moves up to it at once.

        With `auto_commit`, a queue's offset is marked once its batch was consumed and the marks
        are written together at most every `commit_interval_ms` (RocketMQ persists offsets on a
        timer too), before each long-poll wait, before a queue is handed over, when the
        iteration ends or is closed (a `break` out of the loop), and by `flush_offsets` /
        `close`. A consumer killed in between sees again what it read since the last write:
        delivery is at least once. Without `auto_commit` nothing is written for you, not even
        before a hand-over: commit each queue as you go (`commit`), or its next owner reads
        again from the last commit."""
        validate_topic(topic)
        self._require_readable(topic)
        _require_count("commit_interval_ms", commit_interval_ms, 0, 2**31)
        subscription = subscription_of(tags, where)
        assigned = None if queue_ids is None else self._validate_queue_ids(topic, queue_ids)
        share = self._join(topic, subscription) if assigned is None else None
        if share is not None:
            if topic in self._iterated_topics:  # the two would hand out the same queues' messages
                raise BadInputError("topic", f"an iterate over {topic!r} is live in this consumer: "
                                    "close it (or let it end) before starting another")
            self._iterated_topics.add(topic)
        pid = os.getpid()
        offsets: dict[int, int | None] = {}
        interval_s = commit_interval_ms / 1000.0
        started_s = written_at = time.monotonic()
        try:
            while True:
                self._require_supervisor()
                bound = self._ctl.dispatched_pos
                self._follow_owned(topic, offsets, assigned if share is None else self._owned(share, topic))
                moved = False
                for queue_id, offset in list(offsets.items()):
                    if share is not None and queue_id not in share.owned:
                        continue  # let go under an earlier batch of this sweep (by `assignment`)
                    result = self._read(topic, queue_id, offset, max_count, bound, subscription)
                    for skipped in result.skipped if on_skipped is not None else ():
                        on_skipped(skipped)
                    yield from self._hand_out(topic, queue_id, result.messages, share, pid)
                    if result.status in _MOVES and result.next_offset != offset:
                        moved = True
                        offsets[queue_id] = result.next_offset
                        if auto_commit:
                            self._uncommitted[(topic, queue_id)] = result.next_offset
                if self._uncommitted and (not moved or time.monotonic() - written_at >= interval_s):
                    self.flush_offsets()
                    written_at = time.monotonic()
                if moved:
                    continue
                if not follow and not self._awaiting_hand_over(share, started_s, poll_timeout_ms):
                    return
                wait_s = poll_timeout_ms / 1000.0
                if share is not None:  # a member rebalances from its sweeps: wake to see a death
                    wait_s = min(wait_s, REBALANCE_INTERVAL_S)
                self._wait_past(bound, wait_s)
        finally:
            if os.getpid() == pid:
                if share is not None:
                    self._iterated_topics.discard(topic)
                if not self._closed:
                    self.flush_offsets()

    def _hand_out(self, topic: str, queue_id: int, records: list[Record], share: GroupShare | None,
                  pid: int) -> Iterator[Record]:
        """Yield one batch; while inside it, its queue is kept (a rebalance lets it go once the
        batch is done and marked), so no other member reads what this one still hands out."""
        key = (topic, queue_id)
        self._in_batch[key] = self._in_batch.get(key, 0) + 1
        try:
            for record in records:
                yield record
                if os.getpid() != pid:  # the rest of the batch is the parent's to hand out
                    raise StoreClosedError("this iteration belongs to the process that started it "
                                           f"(pid {pid}), not to its forked child", path=str(self.root),
                                           hint="start a new iterate in the child")
                if self._closed:
                    raise StoreClosedError("the consumer was closed during the iteration",
                                           path=str(self.root))
                if share is not None and queue_id not in share.owned:  # never expected: a safety net
                    raise QueueNotOwnedError(self.group, topic, queue_id, share.owned)
        finally:
            if os.getpid() == pid:
                left = self._in_batch.pop(key, 1) - 1
                if left:
                    self._in_batch[key] = left

    @staticmethod
    def _awaiting_hand_over(share: GroupShare | None, started_s: float, poll_timeout_ms: int) -> bool:
        """True while queues the group gives this member are still held by their old owners,
        for up to `poll_timeout_ms` from the start: a draining member waits for its share."""
        return (share is not None and share.owned != share.wanted
                and time.monotonic() - started_s < poll_timeout_ms / 1000.0)

    def _follow_owned(self, topic: str, offsets: dict[int, int | None], owned: list[int]) -> None:
        """Keep `offsets` to the queues read now: a queue gained starts from its committed offset
        (read once its old owner let go of it) or where `seek_to_time` put it, a queue let go
        is forgotten."""
        for queue_id in [queue_id for queue_id in offsets if queue_id not in owned]:
            del offsets[queue_id]
        for queue_id in owned:
            sought = self._positions.pop((topic, queue_id), None)
            if sought is not None:
                offsets[queue_id] = sought
            elif queue_id not in offsets:
                offsets[queue_id] = self.committed(topic, queue_id)

    def assignment(self, topic: str, *, tags: str | None = None, where: str | None = None) -> list[int]:
        """The queue ids of `topic` this member reads now (subscribing on the first call);
        call it before each sweep of `pull_columns` over them: it rebalances as the group
        changes, committing what `iterate` marked on a queue before letting it go."""
        validate_topic(topic)
        return self._owned(self._join(topic, subscription_of(tags, where)), topic)

    def _join(self, topic: str, subscription: Subscription) -> GroupShare:
        """This member's share of `topic` (joining the group on it the first time)."""
        if self._closed:
            raise StoreClosedError("the consumer is closed", path=str(self.root))
        self._adopt_if_forked()
        expression = str(subscription)  # its canonical text: two spellings of one subscription agree
        share = self._shares.get(topic)
        if share is None:
            member = self.instance_name or f"{os.getpid()}-{time.time_ns()}"
            share = self._shares[topic] = GroupShare(self.root, self.group, topic, member, self.model,
                                                     expression)
        elif share.seat.record.expression != expression:
            raise BadInputError("tags", f"{expression!r}: this consumer subscribed {topic} "
                                f"with {share.seat.record.expression!r}")
        return share

    def _owned(self, share: GroupShare, topic: str) -> list[int]:
        self._require_supervisor()
        before = list(share.owned)
        busy = [queue_id for (busy_topic, queue_id) in self._in_batch if busy_topic == topic]
        owned = share.maybe_rebalance(self.read_queue_count(topic),
                                      lambda let_go: self._commit_marked(topic, let_go), busy)
        for queue_id in owned:
            if queue_id not in before:
                # a gained queue starts from its old owner's commit: a mark made while another
                # member owned it (iterate(queue_ids=...)) was never this member's to write
                self._uncommitted.pop((topic, queue_id), None)
        for queue_id in before:
            if queue_id not in owned:  # a seek applies while the queue is this member's, not after
                self._positions.pop((topic, queue_id), None)
        return owned

    def _validate_queue_ids(self, topic: str, queue_ids: Iterable[int]) -> list[int]:
        chosen = list(queue_ids)
        for queue_id in chosen:
            validate_queue_id(queue_id, self.read_queue_count(topic))
        return sorted(set(chosen))

    # ------------------------------------------------------------------------------ seek
    def seek_to_time(self, topic: str, ts_ms: int) -> dict[int, int]:
        """Move the reading of every queue of `topic` to the first message stored at or after
        `ts_ms` (RocketMQ's getOffsetInQueueByTime: a binary search over the consume queue by
        store time; the queue's end when none is that late); the offsets by queue id.

        This consumer's next read of each queue starts there (`iterate`, or `pull` without an
        offset until the queue is committed); nothing is written until it consumes and commits.
        A CLUSTERING member that joined the topic moves only the queues it owns at the call
        (and returns only those), and forgets the position of a queue it lets go: a queue it
        gets later starts from its old owner's commit, never rewound past it."""
        validate_topic(topic)
        if not isinstance(ts_ms, int) or isinstance(ts_ms, bool) or ts_ms < 0:
            raise BadInputError("ts_ms", f"{ts_ms!r} is not a non-negative int (ms since the epoch)")
        self._require_supervisor()
        bound = self._ctl.dispatched_pos
        share = self._shares.get(topic)
        moved = (range(self.read_queue_count(topic)) if share is None or share.locks is None
                 else self._owned(share, topic))
        found = {queue_id: self._offset_at_time(topic, queue_id, ts_ms, bound) for queue_id in moved}
        for queue_id, offset in found.items():
            self._uncommitted.pop((topic, queue_id), None)
            self._positions[(topic, queue_id)] = offset
        return found

    def _offset_at_time(self, topic: str, queue_id: int, ts_ms: int, bound: int) -> int:
        queue = self._queue(topic, queue_id)
        if queue is None:
            return 0
        queue.refresh()

        def store_ts_of(commit_pos: int, _size: int) -> int:
            if self.commitlog.segments.find(commit_pos) is None:
                self.commitlog.refresh()  # a segment the writer made since this consumer looked
            return store_ts_at(self.commitlog.read_bytes(commit_pos, V4_HEADER_SIZE), 0)

        offset = queue.offset_for_time(ts_ms, Boundary.LOWER, store_ts_of, self._log_min_pos())
        return min(offset, visible_max(queue, bound))

    # ------------------------------------------------------------------------------ offsets
    def committed(self, topic: str, queue_id: int) -> int | None:
        """The group's committed next offset of a queue (one `iterate` consumed but has not
        written yet included), or None. A committed offset past the queue's end or below zero
        is refused (CommittedOffsetError): taken as it is, it would skip the queue for good."""
        self._adopt_if_forked()
        pending = self._uncommitted.get((topic, queue_id))
        if pending is not None:
            return pending
        offset = self.offsets.get(topic, self.group, queue_id)
        if offset is None:
            return None
        refused = find_refused(read_refused(self.root), self.group, topic, queue_id, offset)
        if refused is not None:  # found outside once: refused until reset, however the queue grew
            raise CommittedOffsetError(group=self.group, topic=topic, queue_id=queue_id, offset=offset,
                                       max_offset=refused.queue_end_seen, path=str(self.offsets.path))
        queue_end = self._queue_end(topic, queue_id)
        if offset > queue_end:
            queue_end = self._queue_end_once_dispatched(topic, queue_id)
        if not 0 <= offset <= queue_end:
            self._record_refused(topic, queue_id, offset, queue_end)
            raise CommittedOffsetError(group=self.group, topic=topic, queue_id=queue_id, offset=offset,
                                       max_offset=queue_end, path=str(self.offsets.path))
        return offset

    def _record_refused(self, topic: str, queue_id: int, offset: int, queue_end: int) -> None:
        """Write the refusal down so it holds once the queue grows past the offset; a store
        this process cannot write keeps only this refusal (said at WARNING)."""
        entry = RefusedOffset(self.group, topic, queue_id, offset, queue_end, time.time_ns() // 1_000_000,
                              f"consumer pid {os.getpid()}")
        message = refusal_message(entry)
        try:
            record_refused(self.root, [entry])
        except OSError as exc:
            message += f"; not recorded ({exc})"
        log.warning("%s", message)
        append_to_store_log(self.root, "consumer", __name__, logging.WARNING, message)

    def commit(self, topic: str, queue_id: int, offset: int) -> None:
        """Persist the group's next offset of a queue (atomic replace, previous kept as .bak).
        Only an offset below zero is refused here: the consume queue may lag the acknowledged
        message whose next offset this is; a past-the-end offset is caught when read. A
        CLUSTERING member commits only queues it owns, and a CLUSTERING consumer that has not
        joined the topic only queues no live member owns (QueueNotOwnedError)."""
        self._adopt_if_forked()  # a forked child owns none of its parent's queues
        validate_topic(topic)
        validate_queue_id(queue_id, self.read_queue_count(topic))
        share = self._shares.get(topic)
        if share is not None and share.locks is not None and queue_id not in share.owned:
            raise QueueNotOwnedError(self.group, topic, queue_id, share.owned)
        with self._borrowing_queue_locks(topic, [queue_id]) as owned_elsewhere:
            if owned_elsewhere:
                raise QueueNotOwnedError(self.group, topic, queue_id, None)
            self.offsets.commit(topic, self.group, queue_id, offset, tombstones_read=self._tombstones_seen())
        self._uncommitted.pop((topic, queue_id), None)  # an explicit commit wins over iterate's
        self._positions.pop((topic, queue_id), None)  # and over a seek
        # the offset moved on by a deliberate act: its refusal goes (the same value stays refused)
        clear_refused(self.root, self.group, topic, [queue_id], except_offset=offset)

    def _queue_end(self, topic: str, queue_id: int) -> int:
        """The queue's max offset on disk (0 for a queue not created yet); it lags the commitlog
        by what the dispatcher has not reached."""
        queue = self._queue(validate_topic(topic), queue_id)
        if queue is None:
            return 0
        queue.refresh()
        return queue.max_offset

    def _queue_end_once_dispatched(self, topic: str, queue_id: int) -> int:
        """The queue's end once the dispatcher reached what is readable now (waiting up to
        DISPATCH_CATCH_UP_TIMEOUT_MS): every acknowledged message is in the queue then. A
        dispatcher still behind at the deadline leaves the offset unjudged (the end is 2**63-1)."""
        self._require_supervisor()
        readable_pos = self._ctl.readable_pos
        if self._ctl.dispatched_pos < readable_pos and not self.wait_for_more(
                readable_pos - 1, DISPATCH_CATCH_UP_TIMEOUT_MS):
            return UNJUDGED_QUEUE_END
        return self._queue_end(topic, queue_id)

    def flush_offsets(self) -> None:
        """Write the offsets `iterate` consumed since its last write, in one atomic replace; a
        mark on a queue another member owns is dropped unwritten: only a queue's owner commits,
        and a mark kept would later override the owner's commit should the queue come here."""
        self._adopt_if_forked()  # a forked child never writes its parent's marks
        with ExitStack() as borrowed:
            owned_elsewhere = set()
            for topic in {topic for topic, _ in self._uncommitted}:
                queue_ids = [queue_id for marked, queue_id in self._uncommitted if marked == topic]
                owned_elsewhere |= {(topic, queue_id) for queue_id in borrowed.enter_context(
                    self._borrowing_queue_locks(topic, queue_ids))}
            writable = {key: offset for key, offset in self._uncommitted.items()
                        if self._may_commit(*key) and key not in owned_elsewhere}
            if writable:
                self.offsets.commit_many(self.group, writable, tombstones_read=self._tombstones_seen())
        self._uncommitted.clear()

    def _borrowing_queue_locks(self, topic: str, queue_ids: list[int]) -> AbstractContextManager[list[int]]:
        """For a CLUSTERING consumer not joined on `topic`: the queue ids a live member owns,
        the others' locks held for the block (ipc.queue_locks); else nothing to hold."""
        if self.instance_name is not None or topic in self._shares:  # own offsets, or checked by share
            return nullcontext([])
        return borrow_free_queue_locks(self.root, self.group, topic, queue_ids)

    def _may_commit(self, topic: str, queue_id: int) -> bool:
        share = self._shares.get(topic)
        return share is None or share.locks is None or queue_id in share.owned

    def _commit_marked(self, topic: str, queue_ids: list[int]) -> None:
        """Write the marks of queues about to be let go, and forget them."""
        marked = {(topic, queue_id): self._uncommitted.pop((topic, queue_id))
                  for queue_id in queue_ids if (topic, queue_id) in self._uncommitted}
        if marked:
            self.offsets.commit_many(self.group, marked, tombstones_read=self._tombstones_seen())

    # ------------------------------------------------------------------------------ lifetime
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._adopt_if_forked()
        self.flush_offsets()
        for topic, share in self._shares.items():
            share.leave(lambda held, topic=topic: self._commit_marked(topic, held))
        self._shares.clear()
        self._membership.close()
        self._detach()
        self.queues.close()
        self.commitlog.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def visible_max(queue: ConsumeQueue, bound: int) -> int:
    """The end of the queue as far as records below `bound` (the dispatched position) go."""
    high = queue.max_offset
    if queue.max_commit_end <= bound:
        return high
    low = queue.min_offset

    def end_of(queue_offset: int) -> int:
        entry = queue.entry(queue_offset)
        return entry.commit_pos + entry.size if entry is not None else bound + 1

    return low + bisect.bisect_right(range(low, high), bound, key=end_of)


def _validate_model(model: object, instance_name: object) -> tuple[MessageModel, str | None]:
    """The message model and instance name: BROADCASTING needs a name (its offsets are the
    named instance's own, kept across restarts), CLUSTERING takes none (its offsets are the group's)."""
    if not isinstance(model, MessageModel):
        raise BadInputError("model", f"{model!r} is not a MessageModel")
    if model is MessageModel.CLUSTERING:
        if instance_name is not None:
            raise BadInputError("instance_name", "only a BROADCASTING consumer has one")
        return model, None
    if instance_name is None:
        raise BadInputError("instance_name", "a BROADCASTING consumer needs one: its offsets are its own")
    return model, validate_group(instance_name)


def _require_count(name: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadInputError(name, f"{value!r} is not an int in {low}..{high}")
