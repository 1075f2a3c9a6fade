"""What one record contributes to the derived structures: a consume-queue entry and index keys.

Shared by the in-process store, the dispatcher and index-builder processes, recovery and the
Spark rebuild, so all of them build byte-identical consume queues and index files. Every
step is idempotent: re-dispatching a record that is already there changes nothing. Which
records enter a queue, which are indexed and what an entry's tag field holds is
engine.record_rules'.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from engine.formats.index_file import index_key, shard_of
from engine.formats.key_batch import index_key_values
from engine.formats.record import RecordHeader
from engine.formats.record.dispatch_columns import DispatchColumns
from engine.index.shard import ShardIndex
from engine.queues.table import ConsumeQueueTable
from engine.record_rules import (
    enters_consume_queue,
    held_out_of_queue_mask,
    is_unindexed_rollback,
    scheduled_tag_column,
    tag_field_function,
    unindexed_rollback_mask,
)
from engine.topics.system import SCHEDULE_TOPIC
from engine.tuning import QUEUE_GROUP_MAX_STRETCHES


def index_keys(header: RecordHeader) -> list[str]:
    """The keys a record is indexed under: UNIQ_KEY first, then each KEYS token (none for a
    RocketMQ rollback)."""
    if is_unindexed_rollback(header.sys_flag, header.queue_offset):
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
    if not enters_consume_queue(header.sys_flag, header.queue_offset) \
            or header.commit_pos < table.tombstone_of(header.topic):
        return False
    queue = table.get_or_create(header.topic, header.queue_id)
    tag = tag_field_function(table.delay_levels_ms)(header.topic, header.queue_id, header.store_ts_ms,
                                                    header.tags_code)
    return queue.put_entries([header.queue_offset], [header.commit_pos], [header.total_size], [tag]) > 0


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
# The same rules over DispatchColumns (engine.formats.record.dispatch_columns), so a batch dispatch writes
# the bytes the per-record functions above write for the same records.


class KeyColumns(NamedTuple):
    """What an index shard needs of each key it indexes (ShardIndex.put_hashes), in key order."""

    key_hash: np.ndarray
    commit_pos: np.ndarray
    store_ts_ms: np.ndarray


def consumable_rows(cols: DispatchColumns) -> np.ndarray:
    """Rows that enter a consume queue (engine.record_rules.ENTERS_CONSUME_QUEUE)."""
    held_out = held_out_of_queue_mask(cols.sys_flag, cols.queue_offset)
    return np.flatnonzero(~held_out) if held_out.any() else np.arange(cols.count)


def dispatch_columns_to_consume_queues(table: ConsumeQueueTable, cols: DispatchColumns,
                                       rows: np.ndarray | None = None) -> int:
    """dispatch_to_consume_queue for every consumable record, one put_entries per queue; returns
    the entries written. `rows` restricts it to those records (recovery skips broken queues).
    A deleted topic's records below its tombstone (table.tombstones) are skipped."""
    rows = consumable_rows(cols) if rows is None else rows
    written = 0
    for (topic, queue_id), sel in queue_groups(cols, rows):
        floor = table.tombstone_of(topic)  # a deleted topic's records enter no queue again
        if floor and int(cols.commit_pos[sel[0]]) < floor:
            sel = sel[cols.commit_pos[sel] >= floor]
            if not len(sel):
                continue
        queue = table.get_or_create(topic, queue_id)
        tags = cols.tags_code[sel] if topic != SCHEDULE_TOPIC else \
            scheduled_tag_column(cols.store_ts_ms[sel], queue_id, table.delay_levels_ms)
        written += queue.put_entries(cols.queue_offset[sel], cols.commit_pos[sel], cols.total_size[sel], tags)
    return written


def queue_groups(cols: DispatchColumns, rows: np.ndarray) -> list[tuple[tuple[str, int], np.ndarray]]:
    """((topic, queue_id), rows of that queue in record order) for the given rows, queues in
    order of first appearance. Records come in stretches of one queue (a batch goes to one
    queue), so the stretches are found and joined per queue; many short ones are sorted."""
    if not len(rows):
        return []
    group_key = (cols.topic_index[rows] << 32) | cols.queue_id[rows]
    edges = np.flatnonzero(group_key[1:] != group_key[:-1]) + 1
    if len(edges) > QUEUE_GROUP_MAX_STRETCHES:
        order = np.argsort(group_key, kind="stable")
        edges = np.flatnonzero(np.diff(group_key[order])) + 1
        rows, group_key = rows[order], group_key[order]
    bounds = [0, *edges.tolist(), len(rows)]
    stretches: dict[int, list[np.ndarray]] = {}
    for key, lo, hi in zip(group_key[bounds[:-1]].tolist(), bounds[:-1], bounds[1:], strict=True):
        stretches.setdefault(key, []).append(rows[lo:hi])
    return [((cols.topics[key >> 32], key & 0xFFFFFFFF),
             parts[0] if len(parts) == 1 else np.concatenate(parts)) for key, parts in stretches.items()]


def key_hashes_and_shards(cols: DispatchColumns, shard_count: int) -> tuple[np.ndarray, np.ndarray]:
    """index_key_hash and shard (CRC32C % shard_count, as shard_of) of every `topic#key`."""
    prefixes = [index_key(topic, "") for topic in cols.topics]
    return index_key_values(prefixes, cols.topic_index[cols.key_rows], cols.key_blob, cols.key_starts,
                            cols.key_ends, shard_count)


def shard_key_columns(cols: DispatchColumns, shard_count: int,
                      keys: tuple[np.ndarray, np.ndarray] | None = None) -> list[KeyColumns]:
    """Per shard, the KeyColumns of every key dispatch_to_shard would index (none of a
    rollback), in record order, UNIQ_KEY first: one hash and shard computation for all shards.
    `keys` is key_hashes_and_shards(cols, shard_count) if the caller has it."""
    hashes, shards = key_hashes_and_shards(cols, shard_count) if keys is None else keys
    rows = cols.key_rows
    rollback = unindexed_rollback_mask(cols.sys_flag[rows], cols.queue_offset[rows])
    if rollback.any():
        keep = np.flatnonzero(~rollback)
        hashes, shards, rows = hashes[keep], shards[keep], rows[keep]
    if shard_count == 1:
        return [KeyColumns(hashes, cols.commit_pos[rows], cols.store_ts_ms[rows])]
    order = np.argsort(shards, kind="stable")
    bounds = np.zeros(shard_count + 1, dtype=np.int64)
    np.cumsum(np.bincount(shards, minlength=shard_count), out=bounds[1:])
    hashes, rows = hashes[order], rows[order]
    positions, times = cols.commit_pos[rows], cols.store_ts_ms[rows]
    return [KeyColumns(hashes[lo:hi], positions[lo:hi], times[lo:hi])
            for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)]


def put_key_columns(shard: ShardIndex, keys: KeyColumns, end_pos: int) -> int:
    """Index the keys of records [.., end_pos) that the shard does not cover yet (commit_pos at
    or past processed_pos), then mark end_pos processed; returns keys put. Idempotent."""
    if end_pos <= shard.processed_pos:
        return 0
    take = keys
    if len(keys.commit_pos) and int(keys.commit_pos[0]) < shard.processed_pos:
        sel = np.flatnonzero(keys.commit_pos >= shard.processed_pos)
        take = KeyColumns(keys.key_hash[sel], keys.commit_pos[sel], keys.store_ts_ms[sel])
    if len(take.key_hash):
        shard.put_hashes(take.key_hash, take.commit_pos, take.store_ts_ms)
    shard.mark_processed(end_pos)
    return len(take.key_hash)


def dispatch_columns_to_shard(shard: ShardIndex, cols: DispatchColumns, shard_no: int,
                              keys: tuple[np.ndarray, np.ndarray]) -> int:
    """dispatch_to_shard for every record: index this shard's keys of the records it does not
    cover yet (none of a rollback), then mark the last record processed; returns keys put.
    `keys` is key_hashes_and_shards(cols, shard count)."""
    if not cols.count or int(cols.commit_pos[-1]) < shard.processed_pos:
        return 0
    hashes, shards = keys
    rows = cols.key_rows
    indexed = ~unindexed_rollback_mask(cols.sys_flag[rows], cols.queue_offset[rows])
    take = np.flatnonzero((shards == shard_no) & indexed)
    columns = KeyColumns(hashes[take], cols.commit_pos[rows[take]], cols.store_ts_ms[rows[take]])
    return put_key_columns(shard, columns, cols.end_pos)


def dispatch_columns(table: ConsumeQueueTable, shards: list[ShardIndex],
                     cols: DispatchColumns) -> tuple[int, int]:
    """Consume queues and every index shard; returns (entries written, keys put)."""
    written = dispatch_columns_to_consume_queues(table, cols)
    per_shard = shard_key_columns(cols, len(shards))
    keys_put = sum(put_key_columns(shard, keys, cols.end_pos)
                   for shard, keys in zip(shards, per_shard, strict=True))
    return written, keys_put
