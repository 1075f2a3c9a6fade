"""Reading the records that derived data points at, where one bad record never hides the rest.

A consume-queue span or the hits of a key query name commit positions; each record there is
decoded and checked at Verify.MQSTORE (structure, BODYCRC, CRC32C of the whole record). A record
whose bytes are bad is passed over: logged at WARNING with its position and returned as a
SkippedRecord, so its neighbours are delivered and a reader's next offset moves past it.
`skip` is that report for every read path (the consumer's columns read included); each scan
catches corruption in one place.

A sound record that is not the one its consume-queue entry names (another topic, queue or
offset) is a different fault: the consume queue is wrong, CorruptConsumeQueueError says so, and
recovery rebuilds the queue from the commitlog.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from engine.errors import CorruptConsumeQueueError, CorruptRecordError
from engine.formats.record import Record, Verify
from engine.status import SkippedRecord

if TYPE_CHECKING:
    from engine.filters.subscription import Subscription
    from engine.log.commitlog import CommitLog
    from engine.queues.consume_queue import ConsumeQueue

log = logging.getLogger(__name__)


class RecordsRead(NamedTuple):
    """The records a read delivers, in order, and the corrupt ones it passed over."""

    records: list[Record]
    skipped: list[SkippedRecord]


def skip(skipped: list[SkippedRecord], record: SkippedRecord) -> None:
    """Report a corrupt record passed over: a WARNING naming its position, and `skipped`."""
    where = "" if record.queue_offset is None else \
        f" ({record.topic}/{record.queue_id} offset {record.queue_offset})"
    log.warning("skipped a corrupt record at commit position %d%s: %s", record.commit_pos, where,
                record.reason)
    skipped.append(record)


class SubscribedRead(NamedTuple):
    """What a subscribed read delivers and how many entries it examined (the next offset is
    the first offset plus `examined`: entries passed over by the filter are behind it)."""

    records: list[Record]
    skipped: list[SkippedRecord]
    examined: int


def read_queue_records(commitlog: CommitLog, queue: ConsumeQueue, first_offset: int,
                       commit_positions: Sequence[int]) -> RecordsRead:
    """The records of `queue`'s entries from `first_offset` (their commit positions, in order).

    Entries whose records retention deleted (below the log's min position) are left out, corrupt
    records skipped; an entry naming a sound record of another queue or offset raises
    CorruptConsumeQueueError."""
    records: list[Record] = []
    skipped: list[SkippedRecord] = []
    for i, commit_pos in enumerate(commit_positions):
        record = _read_entry(commitlog, queue, first_offset + i, commit_pos, skipped)
        if record is not None:
            records.append(record)
    return RecordsRead(records, skipped)


def read_subscribed_records(commitlog: CommitLog, queue: ConsumeQueue, first_offset: int,
                            entries: np.ndarray, subscription: Subscription,
                            max_count: int) -> SubscribedRead:
    """Up to `max_count` records of `subscription` among `queue`'s `entries` (CQ_DTYPE rows
    from `first_offset`): tagsCode picks the candidates, each record read confirms. The read
    stops after the max_count-th record (RocketMQ stops at the next entry), else examines all."""
    records: list[Record] = []
    skipped: list[SkippedRecord] = []
    positions = entries["commit_pos"].tolist()
    for i in np.flatnonzero(subscription.candidates(entries["tags_code"])).tolist():
        record = _read_entry(commitlog, queue, first_offset + i, positions[i], skipped)
        if record is not None and subscription.matches(record):
            records.append(record)
            if len(records) == max_count:
                return SubscribedRead(records, skipped, i + 1)
    return SubscribedRead(records, skipped, len(entries))


def _read_entry(commitlog: CommitLog, queue: ConsumeQueue, queue_offset: int, commit_pos: int,
                skipped: list[SkippedRecord]) -> Record | None:
    """The record of one entry; None when retention deleted it or its bytes are bad (skipped)."""
    if commit_pos < commitlog.min_pos:
        return None  # expired by retention
    try:
        record = commitlog.read_at(commit_pos, verify=Verify.MQSTORE)
    except CorruptRecordError as exc:
        skip(skipped, SkippedRecord(commit_pos, exc.reason, queue.topic, queue.queue_id, queue_offset))
        return None
    if (record.topic, record.queue_id, record.queue_offset) != (queue.topic, queue.queue_id, queue_offset):
        raise CorruptConsumeQueueError(
            f"entry {queue_offset} of {queue.topic}/{queue.queue_id} points at a record of "
            f"{record.topic}/{record.queue_id} offset {record.queue_offset}",
            path=str(queue.segments.directory), queue_offset=queue_offset)
    return record


def read_key_records(commitlog: CommitLog, positions: Iterable[int], topic: str, key: str,
                     begin_ms: int, end_ms: int, *, max_count: int, end_pos: int,
                     tombstone_pos: int = 0) -> RecordsRead:
    """Up to `max_count` records of `topic` with `key` (a KEYS token or UNIQ_KEY) stored in
    [begin_ms, end_ms], oldest first, from an index query's candidate `positions`.

    Hash collisions and other topics are filtered out; positions below the log's min position
    (retention) or the topic's `tombstone_pos` (a deleted topic's records, as dispatch skips
    them), or at or past `end_pos` (not yet readable) are left out; corrupt records skipped."""
    records: list[Record] = []
    skipped: list[SkippedRecord] = []
    for commit_pos in sorted(set(positions)):
        if len(records) == max_count:
            break
        if not max(commitlog.min_pos, tombstone_pos) <= commit_pos < end_pos:
            continue
        try:
            record = commitlog.read_at(commit_pos, verify=Verify.MQSTORE)
        except CorruptRecordError as exc:
            skip(skipped, SkippedRecord(commit_pos, exc.reason))
            continue
        if record.topic == topic and (key == record.uniq_key or key in record.keys) \
                and begin_ms <= record.store_ts_ms <= end_ms:
            records.append(record)
    return RecordsRead(records, skipped)
