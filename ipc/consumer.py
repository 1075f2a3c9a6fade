"""Consumer: reads a running store's queues from a co-located process, read-only.

    with Consumer("./data", "billing") as consumer:
        result = consumer.pull("orders", 0, max_count=32, timeout_ms=1000)  # long poll
        for record in result.messages:
            ...
        consumer.commit("orders", 0, result.next_offset)
        for record in consumer.iterate("orders", follow=True):  # every queue of the topic
            ...

A consumer maps the consume queues and the commitlog read-only (Access.READ_ONLY), adopting
files as they appear. It only ever reads records below the dispatcher's published
`dispatched_pos`, which under sync flush never passes the flushed position: a consumer never
sees a message that a crash could take back. Each record read is checked against the entry
that led to it (topic, queue id, queue offset), so a torn entry can never hand out a wrong
message.

Long polling waits on the published position through the waiter table (ipc.wakeup): the
dispatcher posts the consumer's own semaphore after each batch; no busy loop. Committed offsets
live in config/consumerOffset.json (ipc.consumer_offsets). Statuses are RocketMQ's
(engine.status.GetStatus); the constructor raises ServiceNotAvailableError at once when no
supervisor runs on the store.
"""

from __future__ import annotations

import bisect
import os
import time
from collections.abc import Iterator
from pathlib import Path

from engine.commitlog import CommitLog
from engine.consume_queue import ConsumeQueue, ConsumeQueueTable
from engine.errors import BadInputError, CorruptConsumeQueueError, ServiceNotAvailableError
from engine.formats.record import Record, Verify
from engine.mapped_file import Access
from engine.message import validate_queue_id
from engine.naming import validate_topic
from engine.status import GetResult, GetStatus
from engine.store_dir import read_meta
from ipc.consumer_offsets import ConsumerOffsets, validate_group
from ipc.producer import attach_running_store
from ipc.run_info import run_dir
from ipc.wakeup import ConsumerWaiter, WaiterTable

DEFAULT_MAX_COUNT = 32
_MOVES = (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE, GetStatus.OFFSET_TOO_SMALL,
          GetStatus.OFFSET_OVERFLOW_BADLY)
MAX_PULL_COUNT = 4096


class Consumer:
    """A consumer group member reading one store; not thread-safe (one per thread)."""

    def __init__(self, store_dir: str | os.PathLike, group: str):
        self.group = validate_group(group)
        self.root = Path(store_dir)
        self._ctl, self.info = attach_running_store(self.root)
        try:
            meta = read_meta(self.root)
            self.commitlog = CommitLog.open(self.root, meta.commitlog_file_size, Access.READ_ONLY)
            self.queues = ConsumeQueueTable(self.root, meta.consume_queue_entries, Access.READ_ONLY)
        except BaseException:
            self._ctl.close()
            raise
        self.offsets = ConsumerOffsets(self.root)
        self._table: WaiterTable | None = None
        self._waiter: ConsumerWaiter | None = None
        self._closed = False

    # ------------------------------------------------------------------------------ pull
    def pull(self, topic: str, queue_id: int, offset: int | None = None,
             max_count: int = DEFAULT_MAX_COUNT, timeout_ms: int = 0) -> GetResult:
        """Up to `max_count` messages of one queue from `offset` (default: the committed offset,
        else the queue's min offset). With `timeout_ms`, waits that long for a first message."""
        validate_topic(topic)
        validate_queue_id(queue_id, self.info.queue_count)
        _require_count("max_count", max_count, 1, MAX_PULL_COUNT)
        _require_count("timeout_ms", timeout_ms, 0, 2**31)
        if offset is None:
            offset = self.committed(topic, queue_id)
        elif not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise BadInputError("offset", f"{offset!r} is not a non-negative int")
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            self._require_supervisor()
            bound = self._ctl.dispatched_pos
            result = self._read(topic, queue_id, offset, max_count, bound)
            remaining = deadline - time.monotonic()
            if result.status is GetStatus.FOUND or remaining <= 0 or result.status not in (
                    GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.OFFSET_OVERFLOW_ONE):
                return result
            self._wait_past(bound, remaining)

    def _read(self, topic: str, queue_id: int, offset: int | None, max_count: int,
              bound: int) -> GetResult:
        queue = self.queues.get(topic, queue_id)
        if queue is None:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, next_offset=offset or 0)
        queue.refresh()
        low = queue.min_offset
        high = _visible_max(queue, bound)
        if offset is None:
            offset = low
        if high <= low and offset <= low:
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
        entries = queue.entries(offset, min(max_count, high - offset))
        messages: list[Record] = []
        min_pos = self.commitlog.min_pos
        for i, commit_pos in enumerate(entries["commit_pos"].tolist()):
            if commit_pos < min_pos:
                continue  # expired by retention
            record = self.commitlog.read_at(commit_pos, verify=Verify.MQSTORE)
            if (record.topic, record.queue_id, record.queue_offset) != (topic, queue_id, offset + i):
                raise CorruptConsumeQueueError(
                    f"entry {offset + i} of {topic}/{queue_id} points at a record of "
                    f"{record.topic}/{record.queue_id} offset {record.queue_offset}",
                    path=str(queue.segments.directory), queue_offset=offset + i)
            messages.append(record)
        status = GetStatus.FOUND if messages else GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, messages, offset + len(entries), low, high)

    def _wait_past(self, bound: int, timeout_s: float) -> None:
        if self._waiter is None:
            self._table = WaiterTable.attach(self.root)
            self._waiter = ConsumerWaiter.register(self._table, run_dir(self.root))
        ctl = self._ctl
        self._waiter.wait(lambda: ctl.dispatched_pos > bound or not ctl.supervisor_alive(),
                          min(timeout_s, 1.0))

    def _require_supervisor(self) -> None:
        if not self._ctl.supervisor_alive():
            raise ServiceNotAvailableError("the store's supervisor is gone", path=str(self.root),
                                           hint="start it with `mqstore start`")

    # ------------------------------------------------------------------------------ iterate
    def iterate(self, topic: str, *, follow: bool = False, poll_timeout_ms: int = 1000,
                max_count: int = DEFAULT_MAX_COUNT, auto_commit: bool = True) -> Iterator[Record]:
        """Every message of `topic` across its queues, from the committed offsets.

        Without `follow` it stops when every queue is drained; with it, it long-polls for more.
        With `auto_commit`, a queue's offset is committed once its batch was consumed (at least
        once: a consumer killed mid-batch sees that batch again)."""
        validate_topic(topic)
        offsets = {qid: self.committed(topic, qid) for qid in range(self.info.queue_count)}
        while True:
            self._require_supervisor()
            bound = self._ctl.dispatched_pos
            found = False
            for queue_id, offset in offsets.items():
                result = self._read(topic, queue_id, offset, max_count, bound)
                if result.status is GetStatus.FOUND:
                    found = True
                    yield from result.messages
                if result.status in _MOVES and result.next_offset != offset:
                    offsets[queue_id] = result.next_offset
                    if auto_commit:
                        self.commit(topic, queue_id, result.next_offset)
            if found:
                continue
            if not follow:
                return
            self._wait_past(bound, poll_timeout_ms / 1000.0)

    # ------------------------------------------------------------------------------ offsets
    def committed(self, topic: str, queue_id: int) -> int | None:
        """The group's committed next offset of a queue, or None."""
        return self.offsets.get(topic, self.group, queue_id)

    def commit(self, topic: str, queue_id: int, offset: int) -> None:
        """Persist the group's next offset of a queue (atomic replace, previous kept as .bak)."""
        validate_queue_id(queue_id, self.info.queue_count)
        self.offsets.commit(topic, self.group, queue_id, offset)

    # ------------------------------------------------------------------------------ lifetime
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._waiter is not None:
            self._waiter.close()
            self._table.close()
        self.queues.close()
        self.commitlog.close()
        self._ctl.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _visible_max(queue: ConsumeQueue, bound: int) -> int:
    """The end of the queue as far as records below `bound` (the dispatched position) go."""
    high = queue.max_offset
    if queue.max_commit_end <= bound:
        return high
    low = queue.min_offset

    def end_of(queue_offset: int) -> int:
        entry = queue.entry(queue_offset)
        return entry.commit_pos + entry.size if entry is not None else bound + 1

    return low + bisect.bisect_right(range(low, high), bound, key=end_of)


def _require_count(name: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadInputError(name, f"{value!r} is not an int in {low}..{high}")
