"""What one record contributes to the derived structures: a consume-queue entry and index keys.

Shared by the in-process store, the dispatcher and index-builder processes, recovery and the
Spark rebuild, so all of them build byte-identical consume queues and index files. Every
step is idempotent: re-dispatching a record that is already there changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from engine.consume_queue import ConsumeQueueTable
from engine.formats.index_file import index_key, shard_of
from engine.formats.key_batch import index_key_values
from engine.formats.record import TX_TYPE_MASK, RecordHeader, TxType
from engine.formats.record_scan import DispatchColumns
from engine.hash_index import ShardIndex

_NOT_CONSUMABLE = (TxType.PREPARED, TxType.ROLLBACK)
_PREPARED, _ROLLBACK = int(TxType.PREPARED), int(TxType.ROLLBACK)  # plain ints for numpy: an
# IntEnum operand costs an attribute lookup through Enum per array operation


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


# ---------------------------------------------------------------- many records at once
# The same rules over DispatchColumns (engine.formats.record_scan), so a batch dispatch writes
# the bytes the per-record functions above write for the same records.


def consumable_rows(cols: DispatchColumns) -> np.ndarray:
    """Rows that enter a consume queue (enters_consume_queue, vectorized)."""
    tx = cols.sys_flag & TX_TYPE_MASK
    return np.flatnonzero((tx != _PREPARED) & (tx != _ROLLBACK))


def dispatch_columns_to_consume_queues(table: ConsumeQueueTable, cols: DispatchColumns,
                                       rows: np.ndarray | None = None) -> int:
    """dispatch_to_consume_queue for every consumable record, one put_batch per queue; returns
    the entries written. `rows` restricts it to those records (recovery skips broken queues)."""
    rows = consumable_rows(cols) if rows is None else rows
    written = 0
    for (topic, queue_id), sel in queue_groups(cols, rows):
        queue = table.get_or_create(topic, queue_id)
        written += queue.put_batch(cols.queue_offset[sel], cols.commit_pos[sel], cols.total_size[sel],
                                   cols.tags_code[sel])
    return written


def queue_groups(cols: DispatchColumns, rows: np.ndarray) -> list[tuple[tuple[str, int], np.ndarray]]:
    """((topic, queue_id), rows of that queue in record order) for the given rows."""
    if not len(rows):
        return []
    group_key = (cols.topic_index[rows] << 32) | cols.queue_id[rows]
    if (group_key == group_key[0]).all():
        return [((cols.topics[int(cols.topic_index[rows[0]])], int(cols.queue_id[rows[0]])), rows)]
    keys, inverse = np.unique(group_key, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(keys) + 1))
    return [((cols.topics[int(key >> 32)], int(key & 0xFFFFFFFF)), rows[order[lo:hi]])
            for key, lo, hi in zip(keys.tolist(), bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)]


def key_hashes_and_shards(cols: DispatchColumns, shard_count: int) -> tuple[np.ndarray, np.ndarray]:
    """index_key_hash and shard (CRC32C % shard_count, as shard_of) of every `topic#key`."""
    prefixes = [index_key(topic, "") for topic in cols.topics]
    return index_key_values(prefixes, cols.topic_index[cols.key_rows], cols.key_blob, cols.key_starts,
                            cols.key_ends, shard_count)


def dispatch_columns_to_shard(shard: ShardIndex, cols: DispatchColumns, shard_no: int,
                              keys: tuple[np.ndarray, np.ndarray]) -> int:
    """dispatch_to_shard for every record: index this shard's keys of the records it does not
    cover yet (none of a rollback), then mark the last record processed; returns keys put.
    `keys` is key_hashes_and_shards(cols, shard count)."""
    if not cols.count or int(cols.commit_pos[-1]) < shard.processed_pos:
        return 0
    hashes, shards = keys
    rows = cols.key_rows
    tx = cols.sys_flag[rows] & TX_TYPE_MASK
    take = np.flatnonzero((shards == shard_no) & (cols.commit_pos[rows] >= shard.processed_pos)
                          & (tx != _ROLLBACK))
    if len(take):
        shard.put_hashes(hashes[take], cols.commit_pos[rows[take]], cols.store_ts_ms[rows[take]])
    shard.mark_processed(cols.end_pos)
    return len(take)


def dispatch_columns(table: ConsumeQueueTable, shards: list[ShardIndex],
                     cols: DispatchColumns) -> tuple[int, int]:
    """Consume queues and every index shard; returns (entries written, keys put)."""
    written = dispatch_columns_to_consume_queues(table, cols)
    keys = key_hashes_and_shards(cols, len(shards))
    keys_put = sum(dispatch_columns_to_shard(shard, cols, n, keys) for n, shard in enumerate(shards))
    return written, keys_put
