"""Scan and rebuild benchmark: `python -m tools.spark.bench_scan --store DIR --master local[1]`.

Measures, on one store:
- planning: the driver's chain walk that places range bounds at record starts (SAMPLE), and
  the executor-side walk a WALK range pays to reach the middle of a segment;
- decode rate of one core without Spark (the per-executor ceiling);
- the Spark scan (count and sum over every row: every record is decoded into Arrow);
- rebuild of consume queues and index from a copy of the commitlog.
`--make-mb N` first writes a store of about N MiB of ~1 KiB messages if DIR does not exist.
Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from engine.config import StoreConfig
from engine.message import Message
from engine.store import MessageStore
from tools.spark import jobs
from tools.spark.partitions import (
    BlockReader,
    ScanFilter,
    SplitMode,
    first_record_at,
    plan_scan,
    pread_reader,
)
from tools.spark.scan import read_batches
from tools.spark.source import MqstoreReader, parse_options

MiB = 1 << 20


def make_store(root: Path, size_mb: int, segment_mb: int, body_bytes: int = 1000) -> None:
    """About `size_mb` MiB of messages over 4 topics x 4 queues, keys on every message."""
    config = StoreConfig(commitlog_file_size=segment_mb * MiB, queue_count=4)
    store = MessageStore.open(root, config)
    try:
        n, body = 0, os.urandom(body_bytes)
        while store.commitlog.written_pos < size_mb * MiB:
            batch = [Message(f"topic-{(n + i) % 4}", body, tags="bench", keys=(f"k{n + i}",),
                             queue_id=(n + i) % 4) for i in range(1000)]
            store.put_batch(batch)
            n += len(batch)
    finally:
        store.close()


def _timed(fn):
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def measure_planning(store: str, target_bytes: int) -> dict:
    out = {}
    for mode in SplitMode:
        reader = MqstoreReader(parse_options({"path": store, "splitMode": mode.value,
                                              "maxPartitionBytes": str(target_bytes)}))
        parts, seconds = _timed(reader.partitions)
        out[mode.value] = {"partitions": len(parts), "plan_s": round(seconds, 3)}
    layout = reader.layout
    seg = layout.segments[0]
    with open(seg.path, "rb") as f:
        blocks = BlockReader(pread_reader(f.fileno()))
        middle = layout.segment_bytes // 2
        _, seconds = _timed(lambda: first_record_at(blocks, 0, middle, layout.segment_bytes))
    out["walk_to_mid_segment_s"] = round(seconds, 3)
    return out


def measure_decode(store: str, target_bytes: int) -> dict:
    """One core, no Spark: decode every record of every range into Arrow batches."""
    reader = MqstoreReader(parse_options({"path": store, "maxPartitionBytes": str(target_bytes)}))
    ranges = plan_scan(reader.layout, ScanFilter(), target_bytes=target_bytes)

    def run():
        rows = size = 0
        for rng in ranges:
            for batch in read_batches(rng, reader.spec):
                rows += batch.num_rows
                size += sum(batch.column("size").to_pylist())
        return rows, size

    (rows, size), seconds = _timed(run)
    return _rates(rows, size, seconds)


def _rates(rows: int, size: int, seconds: float) -> dict:
    return {"records": rows, "bytes": size, "seconds": round(seconds, 3),
            "records_per_s": round(rows / seconds), "mb_per_s": round(size / MiB / seconds, 1)}


def measure_spark_scan(spark, store: str, target_bytes: int) -> dict:
    df = jobs.read_store(spark, store, maxPartitionBytes=str(target_bytes))
    row, seconds = _timed(lambda: df.selectExpr("count(*) AS n", "sum(size) AS bytes").first())
    return {**_rates(row.n, row.bytes or 0, seconds), "partitions": df.rdd.getNumPartitions()}


def measure_rebuild(spark, store: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="mqstore-bench-") as tmp:
        copy = Path(tmp) / "store"
        copy.mkdir()
        shutil.copytree(Path(store) / "commitlog", copy / "commitlog")
        shutil.copy(Path(store) / "store.json", copy / "store.json")
        report, seconds = _timed(lambda: jobs.rebuild(spark, copy))
    return {"seconds": round(seconds, 3), "queues": report.queues, "cq_entries": report.cq_entries,
            "index_keys": sum(report.index_keys.values())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.spark.bench_scan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", required=True)
    p.add_argument("--master", default="local[*]")
    p.add_argument("--make-mb", type=int, help="write a store of about this many MiB first")
    p.add_argument("--segment-mb", type=int, default=64, help="segment size of a --make-mb store")
    p.add_argument("--max-partition-mb", type=int, default=128)
    p.add_argument("--skip-rebuild", action="store_true")
    args = p.parse_args(argv)
    store, target_bytes = str(Path(args.store).resolve()), args.max_partition_mb * MiB
    result: dict = {"store": store, "master": args.master}
    if args.make_mb and not Path(store).exists():
        _, seconds = _timed(lambda: make_store(Path(store), args.make_mb, args.segment_mb))
        result["make_s"] = round(seconds, 1)
    result["planning"] = measure_planning(store, target_bytes)
    result["decode_one_core"] = measure_decode(store, target_bytes)
    spark = jobs.spark_session(args.master, {"spark.ui.showConsoleProgress": "false"}, "mqstore-bench")
    try:
        spark.sparkContext.setLogLevel("ERROR")
        result["spark_scan"] = measure_spark_scan(spark, store, target_bytes)
        if not args.skip_rebuild:
            result["rebuild"] = measure_rebuild(spark, store)
    finally:
        spark.stop()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
