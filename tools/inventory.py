"""What a store holds, for operators: topics and queues, consumer groups, and their lag.

`topic_overview` joins the topic table (config/topics.json) to the queues, so a topic created
by `mqstore topic create` is listed before its first message.

Read-only and safe on a live store as on a stopped one: the commitlog and consume queues are
mapped Access.READ_ONLY (as a Consumer maps them) and config/consumerOffset.json is only read.
On a live store a queue ends where the dispatcher's published `dispatched_pos` ends (an entry
past it may be half written); on a stopped one every valid entry counts. A queue's min offset
is the first entry whose record retention has not deleted (ConsumeQueue.correct_min_offset).

Lag of a group on a queue counts the messages it has still to read: from its committed offset,
or from the queue's min offset when retention deleted what lay below it or it never committed,
to the max offset. Lag in time is the age of the first of those messages (0 when caught up).
A committed offset past the queue's end or below zero is flagged (`offset_problem`): a consumer
refuses it until `mqstore groups --reset` moves it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.errors import (
    BadInputError,
    NotAStoreError,
    ServiceNotAvailableError,
    StoreError,
)
from engine.files.disk_use import queue_disk_use
from engine.files.mapped_file import Access
from engine.files.store_dir import StoreKind, holder_pid, inspect_store_dir, read_meta, refuse_foreign_store
from engine.formats.record import V4_HEADER_SIZE, store_ts_at
from engine.log.commitlog import CommitLog
from engine.queues.consume_queue import Boundary, ConsumeQueue
from engine.queues.table import ConsumeQueueTable
from engine.topics.table import TopicTableFile, perm_text
from ipc.consumer import visible_max
from ipc.consumer_offsets import ConsumerOffsets, validate_group
from ipc.control_block import ControlBlock
from ipc.refused_offsets import RefusedOffset, find_refused, read_refused

_SIZE_CHUNK_ENTRIES = 65536  # entries summed per read: ~1.3 MB of consume queue at a time


@dataclass(frozen=True)
class QueueRow:
    """One consume queue: its readable offsets, the bytes of their records and their age, and
    the disk its own files allocate beside the bytes of them its entries fill (engine.files.disk_use)."""

    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    messages: int
    stored_bytes: int
    oldest_store_time_ms: int | None
    newest_store_time_ms: int | None
    cq_allocated_bytes: int
    cq_used_bytes: int

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TopicRow:
    """One topic: its configuration (config/topics.json; None for a topic whose queues are on
    disk but that the table lacks, until the next start adopts it) and its queues."""

    topic: str
    read_queues: int | None
    write_queues: int | None
    perm: str | None
    queues: tuple[QueueRow, ...]


@dataclass(frozen=True)
class QueueSpan:
    """A queue's readable offsets [min_offset, max_offset), and an offset looked up by time."""

    min_offset: int
    max_offset: int
    at_time_offset: int | None


@dataclass(frozen=True)
class CommittedOffset:
    """One queue a group committed: the next queue offset it will read, and when."""

    topic: str
    queue_id: int
    committed_offset: int
    commit_time_ms: int | None
    refused: bool = False  # recorded as refused until reset (ipc.refused_offsets)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GroupRow:
    """One consumer group: what it committed, over how many queues, and when last."""

    group: str
    topics: tuple[str, ...]
    queue_count: int
    committed: tuple[CommittedOffset, ...]
    last_commit_time_ms: int | None

    def as_dict(self) -> dict:
        return {"group": self.group, "topics": list(self.topics), "queue_count": self.queue_count,
                "committed": [c.as_dict() for c in self.committed],
                "last_commit_time_ms": self.last_commit_time_ms}


@dataclass(frozen=True)
class LagRow:
    """One group on one queue: how far behind the queue's end it is, in messages and time."""

    group: str
    topic: str
    queue_id: int
    committed_offset: int | None
    min_offset: int
    max_offset: int
    lag_messages: int
    lag_ms: int
    last_commit_time_ms: int | None
    offset_problem: str | None = None  # the committed offset lies outside the queue: why
    refused: bool = False  # a consumer or the starting supervisor recorded it as refused

    def as_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------- tables
def topic_table(store_dir: str | Path) -> list[QueueRow]:
    """Every consume queue of the store, sorted by topic and queue id."""
    with _StoreView.open(Path(store_dir)) as view:
        return [view.queue_row(queue) for queue in view.queues()]


def topic_overview(store_dir: str | Path) -> list[TopicRow]:
    """Every configured topic, with no message yet or not, and every topic with queues, sorted;
    TopicFileError when config/topics.json is not a topic table."""
    queue_rows = topic_table(store_dir)
    table = TopicTableFile(store_dir).load()
    by_topic: dict[str, list[QueueRow]] = {}
    for row in queue_rows:
        by_topic.setdefault(row.topic, []).append(row)
    out = []
    for topic in sorted(set(by_topic) | set(table.topics)):
        queues = tuple(by_topic.get(topic, ()))
        config = table.topics.get(topic)
        if config is None:
            out.append(TopicRow(topic, None, None, None, queues))
        else:
            out.append(TopicRow(topic, config.read_queue_count, config.write_queue_count,
                                perm_text(config.perm), queues))
    return out


def group_table(store_dir: str | Path) -> list[GroupRow]:
    """Every consumer group that committed an offset, sorted by name."""
    root = Path(store_dir)
    require_store(root)
    offsets, times = ConsumerOffsets(root).peek_with_times()
    refused = read_refused(root)
    rows: dict[str, list[CommittedOffset]] = {}
    for key, queues in offsets.items():
        topic, group = _split_key(key)
        for queue_id, offset in queues.items():
            commit_ms = times.get(key, {}).get(queue_id)
            is_refused = find_refused(refused, group, topic, queue_id, offset) is not None
            rows.setdefault(group, []).append(CommittedOffset(topic, queue_id, offset, commit_ms, is_refused))
    return [_group_row(group, committed) for group, committed in sorted(rows.items())]


def lag_table(store_dir: str | Path, group: str | None = None) -> list[LagRow]:
    """Lag per group and queue of every topic the group committed on (each queue of the topic,
    committed or not); one group's rows when `group` is given (BadInputError if unknown)."""
    root = Path(store_dir)
    groups = group_table(root)
    if group is not None:
        validate_group(group)
        groups = [row for row in groups if row.group == group]
        if not groups:
            raise BadInputError("group", f"{group!r} has committed no offset in this store",
                                path=str(root))
    refused = read_refused(root)
    with _StoreView.open(root) as view:
        return [row for g in groups for row in view.lag_rows(g, refused)]


def topic_spans(store_dir: str | Path, topic: str, ts_ms: int | None = None) -> dict[int, QueueSpan]:
    """[min, max) of each queue of `topic` that exists (as `topics` shows them), and with
    `ts_ms` the offset of the first message stored at or after it (clamped into the span)."""
    with _StoreView.open(Path(store_dir)) as view:
        spans = {}
        for queue in view.queues():
            if queue.topic != topic:
                continue
            low, high = view.span(queue)
            at = None if ts_ms is None else min(max(view.offset_for_time(queue, ts_ms), low), high)
            spans[queue.queue_id] = QueueSpan(low, high, at)
        return spans


def _group_row(group: str, committed: list[CommittedOffset]) -> GroupRow:
    committed.sort(key=lambda c: (c.topic, c.queue_id))
    times = [c.commit_time_ms for c in committed if c.commit_time_ms is not None]
    return GroupRow(group, tuple(sorted({c.topic for c in committed})), len(committed),
                    tuple(committed), max(times, default=None))


def _split_key(key: str) -> tuple[str, str]:
    """`<topic>@<group>` of the offsets file; a topic may not hold '@', so the first one splits."""
    topic, _, group = key.partition("@")
    return topic, group


def require_store(root: Path) -> None:
    kind = inspect_store_dir(root)  # NotAStoreError for a file or a foreign directory
    if kind is StoreKind.NEW:
        raise NotAStoreError("no store here", path=str(root),
                             hint="point --store at a store directory")
    if kind is StoreKind.ROCKETMQ:
        refuse_foreign_store(root, "the operator tables read mqstore stores only")
    read_meta(root)  # FormatVersionError for a newer store


# ---------------------------------------------------------------------------------- reading
class _StoreView:
    """The commitlog and consume queues mapped read-only, bounded by what is dispatched."""

    def __init__(self, root: Path, commitlog: CommitLog, table: ConsumeQueueTable,
                 bound_pos: int | None):
        self.root = root
        self.commitlog = commitlog
        self.table = table
        self.bound_pos = bound_pos  # None: a stopped store, every valid entry counts
        self.now_ms = time.time_ns() // 1_000_000

    @classmethod
    @contextmanager
    def open(cls, root: Path) -> Iterator[_StoreView]:
        require_store(root)
        bound_pos = dispatched_bound(root)
        meta = read_meta(root)
        commitlog = CommitLog.open(root, meta.commitlog_file_size, Access.READ_ONLY)
        try:
            table = ConsumeQueueTable.load(root, meta.consume_queue_entries, Access.READ_ONLY)
            try:
                yield cls(root, commitlog, table, bound_pos)
            finally:
                table.close()
        finally:
            commitlog.close()

    def queues(self) -> list[ConsumeQueue]:
        return sorted(self.table, key=lambda q: (q.topic, q.queue_id))

    def span(self, queue: ConsumeQueue) -> tuple[int, int]:
        """[min_offset, max_offset) of the entries whose records exist and are dispatched."""
        end = queue.max_offset if self.bound_pos is None else visible_max(queue, self.bound_pos)
        low = queue.correct_min_offset(self.commitlog.min_pos, end)
        return min(low, end), end

    def queue_row(self, queue: ConsumeQueue) -> QueueRow:
        low, high = self.span(queue)
        disk = queue_disk_use(queue.segments.directory)
        return QueueRow(queue.topic, queue.queue_id, low, high, high - low,
                        _entry_bytes(queue, low, high), self.store_time_ms(queue, low, high),
                        self.store_time_ms(queue, high - 1, high), disk.allocated_bytes, disk.used_bytes)

    def lag_rows(self, group: GroupRow, refused: list[RefusedOffset]) -> list[LagRow]:
        committed = {(c.topic, c.queue_id): c for c in group.committed}
        rows = []
        for queue in self.queues():
            if queue.topic not in group.topics:
                continue
            commit = committed.pop((queue.topic, queue.queue_id), None)
            rows.append(self.lag_row(group.group, queue, commit))
        for commit in committed.values():  # a queue whose files are gone (dropped, not created)
            rows.append(LagRow(group.group, commit.topic, commit.queue_id, commit.committed_offset,
                               0, 0, 0, 0, commit.commit_time_ms, offset_problem(commit.committed_offset, 0)))
        rows = [_marked_refused(row, refused) for row in rows]
        return sorted(rows, key=lambda r: (r.topic, r.queue_id))

    def lag_row(self, group: str, queue: ConsumeQueue, commit: CommittedOffset | None) -> LagRow:
        low, high = self.span(queue)
        offset = None if commit is None else commit.committed_offset
        next_offset = low if offset is None else min(max(offset, low), high)
        oldest_ms = self.store_time_ms(queue, next_offset, high)
        lag_ms = 0 if oldest_ms is None else max(self.now_ms - oldest_ms, 0)
        return LagRow(group, queue.topic, queue.queue_id, offset, low, high, high - next_offset,
                      lag_ms, None if commit is None else commit.commit_time_ms,
                      offset_problem(offset, queue.max_offset))

    def offset_for_time(self, queue: ConsumeQueue, ts_ms: int) -> int:
        """The first queue offset stored at or after `ts_ms` (ConsumeQueue.offset_for_time)."""
        def store_ts_of(commit_pos: int, _size: int) -> int:
            if self.commitlog.segments.find(commit_pos) is None:
                self.commitlog.refresh()
            return store_ts_at(self.commitlog.read_bytes(commit_pos, V4_HEADER_SIZE), 0)

        return queue.offset_for_time(ts_ms, Boundary.LOWER, store_ts_of, self.commitlog.min_pos)

    def store_time_ms(self, queue: ConsumeQueue, queue_offset: int, high: int) -> int | None:
        """STORETIMESTAMP of the record at `queue_offset`; None outside [min, high) or when
        its record cannot be read (retention removed it since the offsets were read)."""
        if not queue.min_offset <= queue_offset < high:
            return None
        entry = queue.entry(queue_offset)
        if entry is None:
            return None
        try:
            if self.commitlog.segments.find(entry.commit_pos) is None:
                self.commitlog.refresh()  # a segment the writer created after this view opened
            return store_ts_at(self.commitlog.read_bytes(entry.commit_pos, V4_HEADER_SIZE), 0)
        except (StoreError, OSError):
            return None


def _marked_refused(row: LagRow, refused: list[RefusedOffset]) -> LagRow:
    """The row, marked when its committed offset has a refusal on record (it holds however
    the queue grew since)."""
    if row.committed_offset is None:
        return row
    entry = find_refused(refused, row.group, row.topic, row.queue_id, row.committed_offset)
    if entry is None:
        return row
    return dataclasses.replace(row, refused=True, offset_problem=(
        f"refused (found {'below zero' if entry.offset < 0 else f'past the end {entry.queue_end_seen}'} "
        f"by {entry.where}): reset it"))


def offset_problem(committed_offset: int | None, max_offset: int) -> str | None:
    """Why a committed offset lies outside its queue (a consumer refuses to read from it), or
    None; compared with the entries on disk, as the consumer does."""
    if committed_offset is None:
        return None
    if committed_offset < 0:
        return "below zero: reset it"
    if committed_offset > max_offset:
        return f"past the end {max_offset}: reset it"
    return None


def dispatched_bound(root: Path) -> int | None:
    """The running supervisor's published `dispatched_pos`, or None when none runs."""
    try:
        ctl = ControlBlock.attach(root)
    except ServiceNotAvailableError:
        return None
    try:
        if holder_pid(root) != ctl.supervisor_pid:
            return None  # a dead supervisor's leftover shared memory
        return ctl.dispatched_pos
    finally:
        ctl.close()


def _entry_bytes(queue: ConsumeQueue, low: int, high: int) -> int:
    """The sum of the record sizes of entries [low, high), read in chunks."""
    total = 0
    offset = low
    while offset < high:
        entries = queue.entries(offset, min(_SIZE_CHUNK_ENTRIES, high - offset))
        if not len(entries):
            break
        total += int(entries["size"].sum(dtype="int64"))
        offset += len(entries)
    return total
