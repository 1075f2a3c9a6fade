"""Rebuild consume queues and index files from the commitlog, in parallel (`mqstore spark rebuild`).

Two Spark stages of plain tasks (no DataFrame shuffle, no Python object per record):
1. spill: one task per scan range reads it (dispatch view, the batch path of scan.py) and
   writes, per consume queue and per index shard, its entries and keys (with index_key_hash
   and shard from engine.dispatch.record.key_hashes_and_shards) in commit order to
   .rebuild/spill/q/<topic>/<queue>/<range>.npy and .rebuild/spill/k/<shard>/<range>.npy;
2. write: one task per consume queue and per shard concatenates its spills in range order
   (= commit order) and writes them with the engine's batch writers, as the single-process
   dispatcher does: ConsumeQueue.put_entries (entries sorted by queue offset) and
   ShardIndex.put_hashes (keys in commit order; within a record UNIQ_KEY, then each KEYS
   token). So the files are byte for byte what dispatch writes; only index file names differ
   (they are creation times). Parallelism: ranges in stage 1, queues + shards in stage 2 (one
   shard is one sequential writer, as in the dispatcher).

Step order (each step leaves the store as it was, or rebuilt):
1. refuse a store that is running (lock held) or crashed (abort present: recover it first);
2. write everything (spills included) under <root>/.rebuild/ (the executors must see the
   store directory, e.g. a shared file system on a cluster);
3. swap: move the old consumequeue/ and index/ aside into .rebuild/, move the new ones in;
4. write a checkpoint that says both are durable up to the end of the data; remove .rebuild/.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.dispatch.record import consumable_rows, key_hashes_and_shards, queue_groups
from engine.errors import BadInputError, ReadOnlyStoreError, StoreLockedError
from engine.files.filesystem import ensure_dir, fsync_dir, remove_tree
from engine.files.mapped_file import Access
from engine.files.naming import ABORT_FILE, CONSUMEQUEUE_DIR, INDEX_DIR
from engine.files.store_dir import holder_pid
from engine.formats.record.dispatch_columns import DispatchColumns
from engine.index.shard import ShardIndex
from engine.log.commitlog import CommitLog
from engine.queues.consume_queue import ConsumeQueue
from engine.record_rules import scheduled_tag_column
from engine.recovery.checkpoint import write_checkpoint
from engine.recovery.durable_times import CheckpointTimes
from engine.topics.system import SCHEDULE_TOPIC
from tools.spark.layout import StoreFormat, StoreLayout, read_layout
from tools.spark.options import parse_options
from tools.spark.partitions import ScanRange
from tools.spark.scan import ScanSpec, read_batches
from tools.spark.source import MqstoreReader
from tools.spark.tasks import run_tasks

STAGING_DIR = ".rebuild"
SPILL_DIR = "spill"
_QUEUE_SPILL = np.dtype([("queue_offset", "<i8"), ("commit_pos", "<i8"), ("size", "<i8"),
                         ("tags_code", "<i8")])
_KEY_SPILL = np.dtype([("key_hash", "<i8"), ("commit_pos", "<i8"), ("store_ts_ms", "<i8")])
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
    started = time.monotonic()
    root = Path(store).resolve()
    layout = read_layout(root)
    check_rebuildable(root, layout)
    staging = root / STAGING_DIR
    remove_tree(staging)
    for name in (CONSUMEQUEUE_DIR, INDEX_DIR, SPILL_DIR):
        ensure_dir(staging / name)
    report = RebuildReport(str(root))
    reader = MqstoreReader(parse_options({"path": str(root), "view": "dispatch"}))
    ranges = [rng for p in reader.partitions() for rng in p.value]
    say(f"rebuild: scanning the commitlog ({len(ranges)} ranges)")
    spill = functools.partial(spill_range, str(staging), reader.spec, layout.index_shards,
                              layout.delay_levels_ms)
    spilled = run_tasks(spark, spill, list(enumerate(ranges)))
    report.data_end_pos = max((end for end, _ in spilled), default=0) or layout.min_pos
    queues = sorted({queue for _, queue_keys in spilled for queue in queue_keys})
    say(f"rebuild: writing {len(queues)} consume queues and {layout.index_shards} index shards")
    tasks = [("shard", shard) for shard in range(layout.index_shards)] + [("queue", q) for q in queues]
    written = run_tasks(spark, functools.partial(write_task, str(staging), layout), tasks)
    for kind, key, count, files in written:
        if kind == "queue":
            report.queues += 1
            report.cq_entries += count
        else:
            report.index_keys[key], report.index_files[key] = count, files
    remove_tree(staging / SPILL_DIR)
    say("rebuild: swapping in the new files")
    _swap_in(root, staging)
    _write_final_checkpoint(root, layout, report.data_end_pos)
    remove_tree(staging)
    report.duration_s = time.monotonic() - started
    return report


# ------------------------------------------------------------------ stage 1: spill


def dispatch_columns_of(batch: pa.RecordBatch) -> DispatchColumns:
    """DispatchColumns of a dispatch-view Arrow batch (index keys as spans of the list
    column's string data, topics dictionary-encoded); rollbacks already have no keys."""
    keys = batch.column("index_keys")
    list_offsets = keys.offsets.to_numpy().astype(np.int64)
    values = keys.values
    str_offsets = np.frombuffer(values.buffers()[1], dtype=np.int32)[values.offset:]
    lo, hi = int(list_offsets[0]), int(list_offsets[-1])
    data = values.buffers()[2]
    topics = pc.dictionary_encode(batch.column("topic"))

    def col(name: str) -> np.ndarray:
        return batch.column(name).to_numpy().astype(np.int64)

    return DispatchColumns(
        commit_pos=col("commit_pos"), total_size=col("size"), queue_id=col("queue_id"),
        queue_offset=col("queue_offset"), sys_flag=col("sys_flag"), store_ts_ms=col("store_ts_ms"),
        tags_code=col("tags_code"), topics=topics.dictionary.to_pylist(),
        topic_index=topics.indices.to_numpy().astype(np.int64),
        key_rows=np.repeat(np.arange(batch.num_rows), np.diff(list_offsets)),
        key_blob=data.to_pybytes() if data is not None else b"",
        key_starts=str_offsets[lo:hi].astype(np.int64), key_ends=str_offsets[lo + 1:hi + 1].astype(np.int64))


def spill_range(staging: str, spec: ScanSpec, shard_count: int, delay_levels_ms: tuple[int, ...],
                task: tuple[int, ScanRange]) -> tuple[int, list[tuple[str, int]]]:
    """Executor side: read one range (dispatch view) and write, per queue and per shard, its
    entries and keys in commit order to spill/<q|k>/.../<range number>.npy under staging.
    Returns (end of its last record, the queues it has entries for)."""
    number, rng = task
    entries: dict[tuple[str, int], list[np.ndarray]] = {}
    keys: dict[int, list[np.ndarray]] = {}
    end_pos = 0
    for batch in read_batches(rng, spec):
        cols = dispatch_columns_of(batch)
        end_pos = max(end_pos, cols.end_pos)
        for queue, rows in queue_groups(cols, consumable_rows(cols)):
            tags = cols.tags_code[rows] if queue[0] != SCHEDULE_TOPIC else \
                scheduled_tag_column(cols.store_ts_ms[rows], queue[1], delay_levels_ms)
            entries.setdefault(queue, []).append(_records(_QUEUE_SPILL, cols.queue_offset[rows],
                                                          cols.commit_pos[rows], cols.total_size[rows], tags))
        if len(cols.key_rows):
            hashes, shards = key_hashes_and_shards(cols, shard_count)
            for shard in np.unique(shards).tolist():
                rows = cols.key_rows[shards == shard]
                keys.setdefault(shard, []).append(_records(_KEY_SPILL, hashes[shards == shard],
                                                           cols.commit_pos[rows], cols.store_ts_ms[rows]))
    name = f"{number:08d}.npy"
    for (topic, queue_id), parts in entries.items():
        _save(Path(staging, SPILL_DIR, "q", topic, str(queue_id), name), parts)
    for shard, parts in keys.items():
        _save(Path(staging, SPILL_DIR, "k", str(shard), name), parts)
    return end_pos, sorted(entries)


def _records(dtype: np.dtype, *columns: np.ndarray) -> np.ndarray:
    out = np.empty(len(columns[0]), dtype=dtype)
    for name, column in zip(dtype.names, columns, strict=True):
        out[name] = column
    return out


def _save(path: Path, parts: list[np.ndarray]) -> None:
    ensure_dir(path.parent)
    np.save(path, np.concatenate(parts))


def _load_spills(directory: Path) -> np.ndarray | None:
    """One queue's or shard's spills in range order (= commit order), None if it has none."""
    paths = sorted(directory.glob("*.npy")) if directory.is_dir() else []
    return np.concatenate([np.load(p) for p in paths]) if paths else None


# ------------------------------------------------------------------ stage 2: write


def write_task(staging: str, layout: StoreLayout, task: tuple) -> tuple[str, object, int, int]:
    """Executor side: write one consume queue or one index shard from its spills; returns
    (kind, queue or shard, entries or keys written, index files)."""
    kind, key = task
    spill = Path(staging, SPILL_DIR)
    if kind == "queue":
        topic, queue_id = key
        data = _load_spills(spill / "q" / topic / str(queue_id))
        data = data[np.argsort(data["queue_offset"], kind="stable")]
        queue = ConsumeQueue.load(Path(staging), topic, queue_id, layout.consume_queue_entries,
                                  Access.READ_WRITE)
        try:
            written = queue.put_entries(data["queue_offset"], data["commit_pos"], data["size"],
                                        data["tags_code"])
            queue.flush()
        finally:
            queue.close()
        return kind, tuple(key), written, 0
    data = _load_spills(spill / "k" / str(key))
    index = ShardIndex.load(Path(staging), key, layout.index_slot_count, layout.index_entry_count,
                            Access.READ_WRITE)
    try:
        if data is not None:
            index.put_hashes(data["key_hash"], data["commit_pos"], data["store_ts_ms"])
        index.sync()
        files = len(index.files)
    finally:
        index.close()
    return kind, key, 0 if data is None else len(data), files


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
    """Every structure is whole to `end_pos`; RocketMQ's times are those of what it holds."""
    commitlog = CommitLog.open(root, layout.segment_bytes, Access.READ_ONLY)
    try:
        times = CheckpointTimes(commitlog, root, layout.index_shards)
        shard_positions = tuple(end_pos for _ in range(layout.index_shards))
        write_checkpoint(root, times.checkpoint(end_pos, end_pos, shard_positions))
    finally:
        commitlog.close()
