"""How a producer's encoded records reach the supervisor: one mailbox slot, a bounded local
queue and one sender thread.

A send becomes `Pending` records (end to end in one buffer, with a callback for their answer
rows). `enqueue` puts them on the local queue, which the sender thread drains: it coalesces
whatever is queued into one mailbox request (up to the slot's record and byte limits, never
mixing wait and no-wait records), sends it and waits for its answer while the next batch
accumulates. Many threads calling send() therefore cost one request per group, not one per
message. A caller that waits, with the slot idle and its records fitting one request, sends
them from its own thread with no Pending (`request_now`). The queue is bounded in bytes: when
the store is behind, enqueueing blocks up to `enqueue_timeout_s` and then answers
OS_PAGE_CACHE_BUSY (not stored).

Restarts (ipc.reattach): before publishing a request the sender looks whether its supervisor is
still alive and READY; when it is not, it waits up to `reattach_timeout_s` for the next one,
claims a slot in the new mailbox and sends there. A request is sent again only when it is
certain that nothing of it was stored: it was never published to the old supervisor, or the old
one answered it SERVICE_NOT_AVAILABLE because it was stopping (it refuses before appending).

Failure statuses: SERVICE_NOT_AVAILABLE when no supervisor came back within the reattach bound
(the queued records fail with it at once, not one bound each); OUTCOME_UNKNOWN when the
supervisor exited with the request published and unanswered (it may or may not be stored, and
it is not sent again, so it is never stored twice); UNKNOWN_ERROR when a live supervisor gave no
answer within the response timeout (the records may still be stored; the slot is replaced);
MESSAGE_ILLEGAL when the supervisor refused the request as a whole.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from engine.errors import ServiceNotAvailableError, StoreClosedError, StoreError
from engine.formats.record.encode_many import EncodedRecords
from engine.status import SERVICE_NOT_AVAILABLE_CODE, PutStatus
from ipc.batch_result import failed_rows
from ipc.control_block import ControlBlock, StoreState
from ipc.mailbox import Mailbox, ProducerSlot, RequestFlag
from ipc.reattach import SupervisorWatch, wait_for_supervisor
from ipc.run_info import RunInfo, run_dir

log = logging.getLogger(__name__)

RESPONSE_MARGIN_S = 5.0
MAX_RESENDS = 3  # a request the store refused while stopping, sent again to the next supervisors


class Pending:
    """Encoded records of one send call waiting in the local queue, and where results go.

    Records lie end to end in `blob` from its start (encode_many.encode_records,
    encode_many.encode_columns); `deliver(where, rows, reason)` receives the answer rows of a
    run of them at once, `where` being their places in the caller's batch: slice(first, end),
    or `indexes[first:end]` when some messages of the batch were refused before encoding."""

    __slots__ = ("blob", "count", "cursor", "deliver", "indexes", "nbytes", "sizes", "starts", "wait")

    def __init__(self, encoded: EncodedRecords, deliver: Callable[[object, np.ndarray, str | None], None],
                 wait: bool, indexes: np.ndarray | None = None):
        self.blob = encoded.buf
        self.starts = encoded.starts
        self.sizes = encoded.sizes
        self.count = len(encoded.starts)
        self.indexes = indexes
        self.wait = wait
        self.deliver = deliver
        self.cursor = 0
        self.nbytes = len(encoded.buf)

    def start_of(self, index: int) -> int:
        """Where record `index` starts in `blob` (its end when index == count)."""
        return 0 if index == 0 else self.nbytes if index == self.count else int(self.starts[index])

    def places(self, first: int, end: int) -> slice | np.ndarray:
        """Where records first..end-1 belong in the caller's batch."""
        return slice(first, end) if self.indexes is None else self.indexes[first:end]


class StoreLink(NamedTuple):
    """One attached supervisor: its control block, run info, mailbox and a watch on its process."""

    ctl: ControlBlock
    info: RunInfo
    mailbox: Mailbox
    watch: SupervisorWatch

    def serving(self) -> bool:
        """The supervisor is alive and READY (a stopping one refuses every request)."""
        return self.watch.alive() and self.ctl.store_state is StoreState.READY

    def close(self) -> None:
        """Unmap and close this process's handles; nothing shared is written."""
        self.watch.close()
        self.mailbox.close()
        self.ctl.close()


class _Request(NamedTuple):
    """One mailbox request: byte runs to send back to back, their record count, the wait flag,
    and where the records came from: (pending, first, end) record cursors."""

    pieces: list[memoryview]
    count: int
    wait: bool
    runs: list[tuple[Pending, int, int]]
    nbytes: int


def _cut_request(queue: collections.deque[Pending], mailbox: Mailbox) -> _Request:
    """Up to one slot's worth (records and bytes) of the queued records with the first one's
    wait flag; moves the cursors and pops the pendings taken whole."""
    wait = queue[0].wait
    pieces: list[memoryview] = []
    runs: list[tuple[Pending, int, int]] = []
    count = nbytes = 0
    while queue and queue[0].wait == wait and count < mailbox.max_batch:
        pending = queue[0]
        first = pending.cursor
        base = pending.start_of(first)
        room = mailbox.data_bytes - nbytes
        end = pending.count
        if end - first > mailbox.max_batch - count or pending.nbytes - base > room:
            end = _fitting_end(pending, first, mailbox.max_batch - count, room)
            if end == first:
                break  # the next record does not fit this request
        stop = pending.start_of(end)
        pieces.append(memoryview(pending.blob)[base:stop])
        runs.append((pending, first, end))
        count += end - first
        nbytes += stop - base
        pending.cursor = end
        if end < pending.count:
            break
        queue.popleft()
    return _Request(pieces, count, wait, runs, nbytes)


def _fitting_end(pending: Pending, first: int, max_records: int, room_bytes: int) -> int:
    """The end of the longest run of records from `first` within both limits."""
    last = min(pending.count, first + max_records)
    ends = pending.starts[first:last] + pending.sizes[first:last]
    return first + int(np.searchsorted(ends - pending.start_of(first), room_bytes, side="right"))


class SlotSender:
    """Sends Pending records through one claimed mailbox slot; see the module docstring.

    `connect()` attaches to the supervisor serving the store now (ServiceNotAvailableError when
    none does); it is called once here and again after each restart, with the wait around it."""

    def __init__(self, root: Path, connect: Callable[[], StoreLink], *, reattach_timeout_s: float,
                 max_pending_bytes: int, enqueue_timeout_s: float | None):
        self.root = root
        self._connect = connect
        self._reattach_timeout_s = reattach_timeout_s
        self.link: StoreLink | None = None  # None between a lost supervisor and the next one
        self.slot: ProducerSlot | None = None
        self._attach(connect())
        self._enqueue_timeout_s = (self._response_timeout_s if enqueue_timeout_s is None
                                   else enqueue_timeout_s)
        self._max_pending_bytes = max_pending_bytes
        self.queue: collections.deque[Pending] = collections.deque()
        self._pending_bytes = 0
        self._lock = threading.Lock()  # the condition's; `with` on it costs no Python call
        self._cond = threading.Condition(self._lock)
        self._closing = False
        self._busy = False  # a request is in flight (the sender thread's, or a caller's: send_or_enqueue)
        self._unanswered_seq: int | None = None  # written, its answer not yet taken
        self._thread = threading.Thread(target=self._send_loop, name="mqstore-producer", daemon=True)
        self._thread.start()

    @property
    def closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Send what is queued, stop the sender thread, give the slot back."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            while self._busy:  # a caller's request in flight still uses the slot
                self._cond.wait()
        self._thread.join()
        self._drop_link()

    def forget(self) -> None:
        """In a forked child: let go of the inherited slot and mappings without writing anything
        shared or unlocking the parent's slot claim; the sender thread did not survive the fork."""
        if self.slot is not None:
            self.slot.forget()
        if self.link is not None:
            self.link.close()
        self.link = self.slot = None
        self._closing = True

    # ------------------------------------------------------------------------------ the link
    def _attach(self, link: StoreLink) -> None:
        """Claim a slot in `link`'s mailbox and make it the current link (closes it on failure)."""
        self.info, self.mailbox = link.info, link.mailbox
        self._response_timeout_s = link.info.sync_flush_timeout_ms / 1000.0 + RESPONSE_MARGIN_S
        try:
            self.slot = self._claim_slot(link)
        except BaseException:
            link.close()
            raise
        self.link = link

    def _claim_slot(self, link: StoreLink) -> ProducerSlot:
        """A free slot in `link`'s mailbox, waiting up to the response timeout for one."""
        return ProducerSlot.claim(link.mailbox, run_dir(self.root), alive=link.watch.alive,
                                  timeout_s=self._response_timeout_s)

    def _drop_link(self) -> None:
        """Give the slot back and detach from a supervisor that is gone or stopping."""
        if self.slot is not None:
            self.slot.release()
        if self.link is not None:
            self.link.close()
        self.link = self.slot = None
        self._unanswered_seq = None

    def _ensure_link(self) -> None:
        """A link to a serving supervisor: the current one, or the next one (bounded wait)."""
        if self.link is not None and self.slot is not None and self.link.serving():
            return
        self._drop_link()
        link = wait_for_supervisor(self.root, self._connect, self._reattach_timeout_s)
        self._attach(link)
        log.info("producer reattached to the supervisor (pid %d)", link.info.supervisor_pid)

    # ------------------------------------------------------------------------------ queueing
    def enqueue(self, pendings: list[Pending]) -> None:
        """Queue the records for the sender thread. Many that fit the queue's bound go in
        together, with one wake-up: one by one, the sender thread woken by the first would
        send it alone and the rest would wait a whole round trip behind it."""
        if len(pendings) > 1 and self._enqueue_together(pendings):
            return
        for pending in pendings:
            self._enqueue_one(pending)

    def _enqueue_together(self, pendings: list[Pending]) -> bool:
        """Queue all of `pendings` at once if they fit the bound now; False (none queued) if not."""
        if self._closing:
            raise StoreClosedError("the producer is closed", path=str(self.root))
        nbytes = sum(pending.nbytes for pending in pendings)
        with self._cond:
            if self._pending_bytes and self._pending_bytes + nbytes > self._max_pending_bytes:
                return False
            self.queue.extend(pendings)
            self._pending_bytes += nbytes
            self._cond.notify_all()
        return True

    def send_or_enqueue(self, pendings: list[Pending]) -> None:
        """For a caller that waits for the answer anyway: when nothing is queued or in flight,
        send from the calling thread (no hand-off to the sender thread and back, which cost
        the producer two thread switches per request); otherwise enqueue."""
        if len(pendings) != 1 or not self._claim_idle_slot():
            self.enqueue(pendings)
            return
        try:
            queue = collections.deque(pendings)
            while queue:  # more records than one request holds go in several
                self._perform(_cut_request(queue, self.mailbox))
        finally:
            self._free_slot()

    def request_now(self, data: bytes, count: int) -> tuple[np.ndarray, str | None] | None:
        """For a caller that waits: `count` records (`data`, end to end) sent as one request
        from the calling thread, with no Pending, queue or result builder on the way (they
        cost a one-record send more than its encoding); the answer rows and the reason as
        _request gives them. None, and nothing sent, when they need more than one request or
        the slot is busy: then Pending and send_or_enqueue."""
        if count > self.mailbox.max_batch or len(data) > self.mailbox.data_bytes \
                or not self._claim_idle_slot():
            return None
        try:
            rows, reason = self._answer([data], count, True)
        finally:
            self._free_slot()
        self._fail_queued_if_gone(rows, reason)
        return rows, reason

    def _claim_idle_slot(self) -> bool:
        with self._lock:
            if self.queue or self._busy or self._closing:
                return False
            self._busy = True
            return True

    def _enqueue_one(self, pending: Pending) -> None:
        if self._closing:
            raise StoreClosedError("the producer is closed", path=str(self.root))
        deadline = time.monotonic() + self._enqueue_timeout_s
        with self._cond:
            while (self._pending_bytes and
                   self._pending_bytes + pending.nbytes > self._max_pending_bytes):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    reason = (f"the store is behind: {self._pending_bytes} bytes have been queued "
                              f"in this producer for over {self._enqueue_timeout_s:g} s")
                    break
                self._cond.wait(remaining)
            else:
                reason = None
                self.queue.append(pending)
                self._pending_bytes += pending.nbytes
                self._cond.notify_all()
        if reason is not None:
            self.fail_pending(pending, PutStatus.OS_PAGE_CACHE_BUSY, reason)

    @staticmethod
    def fail_pending(pending: Pending, status: PutStatus, reason: str) -> None:
        first, end = pending.cursor, pending.count
        pending.deliver(pending.places(first, end), failed_rows(end - first, status), reason)

    def _fail_queued(self, reason: str) -> None:
        """No supervisor came back: everything queued fails now rather than one wait each."""
        with self._cond:
            pendings = list(self.queue)
            self.queue.clear()
            self._pending_bytes = 0
            self._cond.notify_all()
        for pending in pendings:
            self.fail_pending(pending, PutStatus.SERVICE_NOT_AVAILABLE, reason)

    def _take_request(self) -> _Request | None:
        """Block for queued records; take up to one request's worth (None once closing with
        nothing queued)."""
        with self._cond:
            while not self.queue or self._busy:
                if self._closing and not self.queue:
                    return None
                self._cond.wait()
            self._busy = True
            request = _cut_request(self.queue, self.mailbox)
            self._pending_bytes -= request.nbytes
            self._cond.notify_all()
        return request

    def _send_loop(self) -> None:
        while True:
            request = self._take_request()
            if request is None:
                return
            try:
                self._perform(request)
            finally:
                self._free_slot()

    def _free_slot(self) -> None:
        """The request in flight is answered. Only the sender thread with records queued and
        close() wait for that: waking the idle sender thread after every blocking send (a
        notify_all with nothing queued) cost the producer a thread switch per request."""
        with self._lock:
            self._busy = False
            if self.queue or self._closing:
                self._cond.notify_all()

    # ------------------------------------------------------------------------------ requests
    def _perform(self, request: _Request) -> None:
        """Send one request, wait for its answer and deliver the rows to their senders."""
        rows, reason = self._answer(request.pieces, request.count, request.wait)
        at = 0
        for pending, first, end in request.runs:
            pending.deliver(pending.places(first, end), rows[at:at + end - first], reason)
            at += end - first
        self._fail_queued_if_gone(rows, reason)

    def _answer(self, pieces: list[bytes | memoryview], count: int, wait: bool
                ) -> tuple[np.ndarray, str | None]:
        """_request's answer; an unexpected error becomes UNKNOWN_ERROR rows (a caller waits
        for them)."""
        try:
            return self._request(pieces, count, wait)
        except Exception as exc:  # never leave a caller's Future unresolved
            log.exception("producer request failed")
            return failed_rows(count, PutStatus.UNKNOWN_ERROR), str(exc)

    def _fail_queued_if_gone(self, rows: np.ndarray, reason: str | None) -> None:
        """No supervisor came back for this request: the queued records fail too."""
        if reason is not None and rows["status"][0] == SERVICE_NOT_AVAILABLE_CODE:
            self._fail_queued(reason)

    def _request(self, pieces: list[bytes | memoryview], count: int, wait: bool
                 ) -> tuple[np.ndarray, str | None]:
        """The answer rows of one request (mailbox.RESULT_DTYPE), and the reason when they were
        made here rather than by the supervisor. Sent again to the next supervisor only while
        nothing of it can have been stored (see the module docstring)."""
        flags = RequestFlag.WAIT_FOR_FLUSH if wait else RequestFlag.NONE
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        for _ in range(MAX_RESENDS + 1):
            try:
                self._ensure_link()
            except StoreError as exc:  # none came back, or no slot is free in the new mailbox
                return failed_rows(count, PutStatus.SERVICE_NOT_AVAILABLE), str(exc)
            answer = self._exchange(data, count, flags)
            if answer is not None:
                return answer
        reason = f"the store stopped {MAX_RESENDS + 1} times while this request waited; not stored"
        return failed_rows(count, PutStatus.SERVICE_NOT_AVAILABLE), reason

    def _exchange(self, data: bytes | memoryview, count: int, flags: RequestFlag
                  ) -> tuple[np.ndarray, str | None] | None:
        """One request through the current slot; None when it was certainly not stored and the
        supervisor is gone or stopping (send it to the next one)."""
        link, alive = self.link, self.link.watch.alive
        if self._unanswered_seq is not None:  # a caller was interrupted (Ctrl-C) waiting for it
            try:
                self.slot.wait_answered(self._unanswered_seq, self._response_timeout_s, alive)
                self._unanswered_seq = None
            except ServiceNotAvailableError:
                if not alive():
                    self._drop_link()
                    return None  # this request was not published yet
                self._replace_slot()
        try:
            seq = self._unanswered_seq = self.slot.write_request(data, count=count, flags=flags)
            rows = self.slot.wait_response(seq, self._response_timeout_s, alive)
            self._unanswered_seq = None
        except ServiceNotAvailableError as exc:
            if alive():
                self._replace_slot()
                reason = (f"no answer within {self._response_timeout_s:g} s; the messages may "
                          f"still be stored ({exc})")
                return failed_rows(count, PutStatus.UNKNOWN_ERROR), reason
            self._drop_link()
            reason = (f"the supervisor (pid {link.info.supervisor_pid}) exited with this request "
                      f"unanswered: the messages may or may not be stored ({exc})")
            return failed_rows(count, PutStatus.OUTCOME_UNKNOWN), reason
        except StoreError as exc:  # the supervisor refused the request as a whole
            self._unanswered_seq = None
            return failed_rows(count, PutStatus.MESSAGE_ILLEGAL), str(exc)
        # the first row decides the common case without a whole-array compare
        if rows["status"][0] == SERVICE_NOT_AVAILABLE_CODE \
                and (rows["status"] == SERVICE_NOT_AVAILABLE_CODE).all() \
                and link.ctl.store_state is not StoreState.READY:
            self._drop_link()  # refused by a stopping supervisor, before any append
            return None
        return rows, None

    def _replace_slot(self) -> None:
        """After a timeout the old request is still in flight: take a fresh slot."""
        self._unanswered_seq = None
        self.slot.release()
        self.slot = self._claim_slot(self.link)
