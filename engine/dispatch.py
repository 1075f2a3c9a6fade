"""What one record contributes to the derived structures: a consume-queue entry and index keys.

Shared by the in-process store, the dispatcher and index-builder processes, recovery and the
Spark rebuild, so all of them build byte-identical consume queues and index files. Every
step is idempotent: re-dispatching a record that is already there changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.consume_queue import ConsumeQueueTable
from engine.formats.index_file import shard_of
from engine.formats.record import TX_TYPE_MASK, RecordHeader, TxType
from engine.hash_index import ShardIndex

_NOT_CONSUMABLE = (TxType.PREPARED, TxType.ROLLBACK)


def enters_consume_queue(sys_flag: int) -> bool:
    """Only non-transactional and committed messages are consumable (RocketMQ BuildConsumeQueue)."""
    return (sys_flag & TX_TYPE_MASK) not in _NOT_CONSUMABLE


def index_keys(header: RecordHeader) -> list[str]:
    """The keys a record is indexed under: UNIQ_KEY first, then each KEYS token (not for rollbacks)."""
    if (header.sys_flag & TX_TYPE_MASK) == TxType.ROLLBACK:
        return []
    keys = [header.uniq_key] if header.uniq_key else []
    keys.extend(k for k in header.keys if k)
    return keys


def keys_by_shard(header: RecordHeader, shard_count: int) -> dict[int, list[str]]:
    """Split a record's index keys by shard (CRC32C of `topic#key` modulo the shard count)."""
    out: dict[int, list[str]] = {}
    for key in index_keys(header):
        out.setdefault(shard_of(header.topic, key, shard_count), []).append(key)
    return out


def dispatch_to_consume_queue(table: ConsumeQueueTable, header: RecordHeader) -> bool:
    """Write the record's consume-queue entry; False when it was already there (or not consumable)."""
    if not enters_consume_queue(header.sys_flag):
        return False
    queue = table.get_or_create(header.topic, header.queue_id)
    return queue.put(header.queue_offset, header.commit_pos, header.total_size, header.tags_code)


def dispatch_to_shard(shard: ShardIndex, header: RecordHeader, keys: Iterable[str]) -> int:
    """Index the record's keys of this shard unless the shard already covers it; returns keys put."""
    end_pos = header.commit_pos + header.total_size
    if header.commit_pos < shard.processed_pos:
        return 0
    count = 0
    for key in keys:
        shard.put(header.topic, key, header.commit_pos, header.store_ts_ms)
        count += 1
    shard.mark_processed(end_pos)
    return count
