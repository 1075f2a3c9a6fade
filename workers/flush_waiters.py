"""Appended requests that wait for the group commit (sync flush), and their answers.

A sweep registers each request that waits with its answer rows (RESULT_ROWs, PUT_OK) before its
write (FlushWaiters.add), so a write that hangs on a stalled disk cannot keep it from its
deadline. Whichever thread sees the published flushed position pass its last record answers it;
one whose deadline (sync_flush_timeout_ms after it was appended) passes first is answered
FLUSH_DISK_TIMEOUT, its records staying in the log. The supervisor loop, the flush thread
(after each sync) and DeadlineWatch (a thread that touches no file) all answer through
`answer_flushed`, under one lock; each answered batch adds its latencies to the control block
once (ipc/put_latency.py).
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from typing import NamedTuple

from engine.status import PUT_OK_CODE, PutStatus
from ipc.mailbox import RESULT_ROW, RESULT_SIZE, MailboxServer
from ipc.put_latency import LatencyTally
from workers.group_commit import GroupCommit

DEADLINE_POLL_S = 0.05  # how soon the deadline thread sees a request registered while it was idle
_STATUS = struct.Struct("<i")  # a result row's first field (mailbox.RESULT_FIELDS)

log = logging.getLogger(__name__)


class Waiting(NamedTuple):
    """An appended request waiting for the group commit, with its answer rows (RESULT_ROWs)."""

    seq: int
    end_pos: int
    deadline: float
    rows: bytearray
    taken_ns: int  # when the sweep took it out of its slot (monotonic), for the latency histogram


def status_rows(count: int, status: PutStatus) -> bytes:
    """The answer rows of `count` records that all got `status` and nothing else."""
    return RESULT_ROW.pack(int(status), 0, 0, 0, 0) * count


def set_status(rows: bytearray, status: PutStatus) -> int:
    """Mark every PUT_OK row of `rows` `status`; how many there were."""
    changed = 0
    for at in range(0, len(rows), RESULT_SIZE):
        if _STATUS.unpack_from(rows, at)[0] == PUT_OK_CODE:
            _STATUS.pack_into(rows, at, int(status))
            changed += 1
    return changed


def unstore_rows(rows: bytearray, status: PutStatus) -> int:
    """Mark every PUT_OK row of `rows` `status`, as a record that was not stored (its append
    failed): the rest of the row zeroed, so no position (or refusal code) is read out of it."""
    changed = 0
    for at in range(0, len(rows), RESULT_SIZE):
        if _STATUS.unpack_from(rows, at)[0] == PUT_OK_CODE:
            RESULT_ROW.pack_into(rows, at, int(status), 0, 0, 0, 0)
            changed += 1
    return changed


class FlushWaiters:
    """The waiting requests by slot; `lock` guards them (a sweep adds, any thread answers)."""

    def __init__(self, server: MailboxServer, group_commit: GroupCommit, timeout_ms: int):
        self.server = server
        self.group_commit = group_commit
        self.timeout_ms = timeout_ms
        self.timeout_s = timeout_ms / 1000.0
        self.lock = threading.Lock()
        self.by_slot: dict[int, Waiting] = {}

    def __len__(self) -> int:
        return len(self.by_slot)

    def holds(self, slot_index: int, seq: int) -> bool:
        """Whether request `seq` of a slot waits (under `lock`)."""
        waiting = self.by_slot.get(slot_index)
        return waiting is not None and waiting.seq == seq

    def add(self, slot_index: int, waiting: Waiting) -> None:
        with self.lock:
            self.by_slot[slot_index] = waiting

    def take_back(self, slot_index: int, seq: int) -> None:
        """Its append failed: it waits no more (unless a deadline answered it already)."""
        with self.lock:
            if self.holds(slot_index, seq):
                del self.by_slot[slot_index]

    def next_deadline(self) -> float | None:
        if not self.by_slot:  # the loop asks once a sweep; mostly its own flush answered all
            return None
        with self.lock:
            return min((waiting.deadline for waiting in self.by_slot.values()), default=None)

    def answer_flushed(self) -> None:
        """Answer waiting requests the flushed position passed, or whose deadline passed (any
        thread). The timeouts are logged after they are all answered (the log may be on the
        stalled disk)."""
        if not self.by_slot:
            return
        timed_out = []
        answered = LatencyTally()
        with self.lock:
            flushed = self.group_commit.published_flushed
            now = time.monotonic()
            now_ns = time.monotonic_ns()  # one answer time for the batch: they share one flush
            for slot_index, waiting in list(self.by_slot.items()):
                if waiting.end_pos <= flushed:
                    pass
                elif now >= waiting.deadline:
                    timed_out.append(slot_index)
                    failed = set_status(waiting.rows, PutStatus.FLUSH_DISK_TIMEOUT)
                    if failed:
                        self.group_commit.ctl.count_put_statuses({PutStatus.FLUSH_DISK_TIMEOUT: failed})
                else:
                    continue
                del self.by_slot[slot_index]
                self.server.complete_rows(slot_index, waiting.seq, waiting.rows)
                answered.observe(now_ns - waiting.taken_ns)
        if answered.count:
            self.group_commit.ctl.add_put_latencies(answered)
        if timed_out:
            log.warning("flush did not reach the records of %d request(s) within %d ms: "
                        "FLUSH_DISK_TIMEOUT (slots %s)", len(timed_out), self.timeout_ms, timed_out)


class DeadlineWatch:
    """A thread that answers waiting requests at their deadline (FLUSH_DISK_TIMEOUT). The
    supervisor loop does so too, but on a stalled disk (fsfreeze) the loop hangs in its write
    or its sync, and the flush thread in its sync or (sweep_if_stuck) its write; this thread
    touches no file, so the answer still comes."""

    def __init__(self, waiters: FlushWaiters):
        self._waiters = waiters
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flush-deadlines", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while True:
            deadline = self._waiters.next_deadline()
            wait_s = DEADLINE_POLL_S if deadline is None else \
                min(DEADLINE_POLL_S, max(0.0, deadline - time.monotonic()))
            if self._stop.wait(wait_s):
                return
            if deadline is not None and time.monotonic() >= deadline:
                self._waiters.answer_flushed()
