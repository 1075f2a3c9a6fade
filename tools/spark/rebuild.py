"""Rebuild consume queues and index files from the commitlog, in parallel (`mqstore spark rebuild`).

Every record carries its topic, queue id and queue offset, so each consume queue is written
by one task from its records sorted by queue offset, independently of the others. Index
keys are placed in their shard (CRC32C of `topic#key`), and each shard is written by one
task in commit order (within a record: UNIQ_KEY, then each KEYS token), exactly the order
the dispatcher puts them. Both use the engine's own writers (engine.consume_queue,
engine.hash_index), so the files are byte for byte what dispatch writes; only index file
names differ (they are creation times).

Step order (each step leaves the store as it was, or rebuilt):
1. refuse a store that is running (lock held) or crashed (abort present: recover it first);
2. write everything under <root>/.rebuild/ (the executors must see the store directory,
   e.g. a shared file system on a cluster);
3. swap: move the old consumequeue/ and index/ aside into .rebuild/, move the new ones in;
4. write a checkpoint that says both are durable up to the end of the data; remove .rebuild/.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine.checkpoint import write_checkpoint
from engine.consume_queue import ConsumeQueue
from engine.errors import BadInputError, ReadOnlyStoreError, StoreLockedError
from engine.formats.checkpoint import Checkpoint
from engine.formats.index_file import shard_of
from engine.hash_index import ShardIndex
from engine.mapped_file import Access, ensure_dir, fsync_dir, remove_tree
from engine.naming import ABORT_FILE, CONSUMEQUEUE_DIR, INDEX_DIR
from engine.store_dir import holder_pid
from tools.spark.layout import StoreFormat, StoreLayout, read_layout

STAGING_DIR = ".rebuild"
CONSUMABLE_SQL = "(sys_flag & 12) NOT IN (4, 12)"  # engine.dispatch.enters_consume_queue
KEY_ROWS_DDL = "shard int, commit_pos long, seq int, topic string, key string, store_ts_ms long"
PUT_BATCH_ENTRIES = 4096
Say = Callable[[str], None]


@dataclass
class RebuildReport:
    store: str
    queues: int = 0
    cq_entries: int = 0
    index_keys: dict[int, int] = field(default_factory=dict)
    index_files: dict[int, int] = field(default_factory=dict)
    data_end_pos: int = 0
    duration_s: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def check_rebuildable(root: Path, layout: StoreLayout) -> None:
    if layout.format is not StoreFormat.MQSTORE:
        raise ReadOnlyStoreError("a RocketMQ-written store is never written by mqstore", path=str(root))
    pid = holder_pid(root)
    if pid is not None:
        raise StoreLockedError(f"store is in use by pid {pid}", path=str(root), hint="stop it first")
    if (root / ABORT_FILE).exists():
        raise BadInputError("store", "the last run crashed (abort file present); run `mqstore "
                            "recover` first so the commitlog ends at a valid record")


def rebuild(spark, store: str | Path, *, say: Say = lambda _: None) -> RebuildReport:
    """Rebuild consume queues and index of `store` from its commitlog; see the module doc."""
    from tools.spark.jobs import read_store

    started = time.monotonic()
    root = Path(store).resolve()
    layout = read_layout(root)
    check_rebuildable(root, layout)
    staging = root / STAGING_DIR
    remove_tree(staging)
    for name in (CONSUMEQUEUE_DIR, INDEX_DIR):
        ensure_dir(staging / name)
    report = RebuildReport(str(root))
    records = read_store(spark, str(root), view="dispatch").persist()
    try:
        say("rebuild: scanning the commitlog")
        report.data_end_pos = int(records.selectExpr("max(commit_pos + size)").first()[0] or layout.min_pos)
        say("rebuild: writing consume queues")
        _write_queues(spark, records, staging, layout, report)
        say("rebuild: writing index shards")
        _write_shards(spark, records, staging, layout, report)
    finally:
        records.unpersist()
    say("rebuild: swapping in the new files")
    _swap_in(root, staging)
    _write_final_checkpoint(root, layout, report.data_end_pos)
    remove_tree(staging)
    report.duration_s = time.monotonic() - started
    return report


def _write_queues(spark, records, staging: Path, layout: StoreLayout, report: RebuildReport) -> None:
    parallelism = spark.sparkContext.defaultParallelism
    rows = (records.where(CONSUMABLE_SQL)
            .select("topic", "queue_id", "queue_offset", "commit_pos", "size", "tags_code")
            .repartition(parallelism, "topic", "queue_id")
            .sortWithinPartitions("topic", "queue_id", "queue_offset")
            .rdd.mapPartitions(functools.partial(write_queue_rows, str(staging),
                                                 layout.consume_queue_entries))
            .collect())
    report.queues = len(rows)
    report.cq_entries = sum(entries for _, _, entries in rows)


def write_queue_rows(staging: str, entries_per_file: int, rows: Iterator) -> Iterator[tuple[str, int, int]]:
    """Executor side: write the queues of this partition (rows sorted by queue, then offset);
    yields (topic, queue_id, entries written) per queue."""
    for (topic, queue_id), queue_rows in itertools.groupby(rows, key=lambda r: (r.topic, r.queue_id)):
        queue = ConsumeQueue.load(Path(staging), topic, queue_id, entries_per_file, Access.READ_WRITE)
        written = 0
        try:
            while chunk := list(itertools.islice(queue_rows, PUT_BATCH_ENTRIES)):
                offsets, positions, sizes, tags = zip(*((r.queue_offset, r.commit_pos, r.size, r.tags_code)
                                                        for r in chunk), strict=True)
                written += queue.put_batch(offsets, positions, sizes, tags)
            queue.flush()
        finally:
            queue.close()
        yield topic, queue_id, written


def _write_shards(spark, records, staging: Path, layout: StoreLayout, report: RebuildReport) -> None:
    shards = layout.index_shards
    keyed = records.where("size(index_keys) > 0").select("commit_pos", "topic", "store_ts_ms", "index_keys")
    rows = (spark.createDataFrame(keyed.rdd.flatMap(functools.partial(key_rows, shards)), KEY_ROWS_DDL)
            .repartition(shards, "shard")
            .sortWithinPartitions("shard", "commit_pos", "seq")
            .rdd.mapPartitions(functools.partial(write_shard_rows, str(staging), layout.index_slot_count,
                                                 layout.index_entry_count))
            .collect())
    report.index_keys = {shard: keys for shard, keys, _ in rows}
    report.index_files = {shard: files for shard, _, files in rows}


def key_rows(shard_count: int, row) -> Iterator[tuple]:
    """Executor side: one row per index key of a record, with its shard and its place in the record."""
    for seq, key in enumerate(row.index_keys):
        yield shard_of(row.topic, key, shard_count), row.commit_pos, seq, row.topic, key, row.store_ts_ms


def write_shard_rows(staging: str, slot_count: int, entry_count: int,
                     rows: Iterator) -> Iterator[tuple[int, int, int]]:
    """Executor side: put the keys of this partition's shards in commit order; yields
    (shard, keys put, index files) per shard."""
    for shard, shard_rows in itertools.groupby(rows, key=lambda r: r.shard):
        index = ShardIndex.load(Path(staging), shard, slot_count, entry_count, Access.READ_WRITE)
        count = 0
        try:
            for r in shard_rows:
                index.put(r.topic, r.key, r.commit_pos, r.store_ts_ms)
                count += 1
            index.sync()
            files = len(index.files)
        finally:
            index.close()
        yield shard, count, files


def _swap_in(root: Path, staging: Path) -> None:
    """Old trees go into staging (removed with it), new ones take their place."""
    for name in (CONSUMEQUEUE_DIR, INDEX_DIR):
        live, new = root / name, staging / name
        if live.exists():
            os.replace(live, staging / f"{name}.old")
        os.replace(new, live)
    fsync_dir(root)
    fsync_dir(staging)


def _write_final_checkpoint(root: Path, layout: StoreLayout, end_pos: int) -> None:
    now = int(time.time() * 1000)
    write_checkpoint(root, Checkpoint(
        physic_msg_ts_ms=now, logics_msg_ts_ms=now, index_msg_ts_ms=now, confirm_commit_pos=end_pos,
        commitlog_flushed_pos=end_pos, cq_durable_pos=end_pos,
        index_durable_pos=tuple(end_pos for _ in range(layout.index_shards))))
