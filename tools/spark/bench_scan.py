"""Scan and rebuild benchmark: `python -m tools.spark.bench_scan --store DIR --master local[1]`.

Measures, on one store:
- planning: the driver's chain walk that places range bounds at record starts (SAMPLE), and
  the executor-side walk a WALK range pays to reach the middle of a segment;
- decode rate of one core without Spark (the per-executor ceiling), of every column and of
  bodies alone;
- the Spark scan (count and sum over every row: every record is decoded into Arrow), median
  of --runs, page cache warm (one untimed scan first), load average beside each run;
- the body scan of issue #23: `count(*), sum(length(body))` through the mqstore source (all
  columns, and with `.schema("body binary")`, which decodes only bodies) against Spark's
  Parquet scan of the same rows (the store exported once with df.write.parquet), runs
  alternated, medians of --runs, MB/s of body bytes and of store bytes, wall and CPU seconds
  (the JVM and its Python workers), the ratio to Parquet; beside them the floor of any Python
  data source: one that hands Spark ready-made Arrow batches of as many bodies of the same
  length (no reading, no decoding);
- rebuild of consume queues and index from a copy of the commitlog: the Spark job, and the
  single-process paths (the dispatcher's batch dispatch over the log; recovery REBUILD).
`--make-mb N` first writes a store of about N MiB of ~1 KiB messages if DIR does not exist
(`--body-kind random` or `json`).
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

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from engine.config import StoreConfig
from engine.dispatch.record import dispatch_columns
from engine.errors import CorruptRecordError
from engine.files.mapped_file import Access
from engine.files.store_dir import config_for_store, read_meta
from engine.formats.record import Verify
from engine.message import Message
from engine.recovery.recover import RecoveryMode
from engine.store import MessageStore
from engine.store_open import close_parts, open_parts
from tools.spark import jobs
from tools.spark.bench_bodies import BodyKind, BodyMaker
from tools.spark.options import parse_options
from tools.spark.partitions import (
    BlockReader,
    ScanFilter,
    SplitMode,
    first_record_at,
    plan_scan,
    pread_reader,
)
from tools.spark.read_plan import RowSelection
from tools.spark.scan import read_batches
from tools.spark.source import MqstoreReader

MiB = 1 << 20


def make_store(root: Path, size_mb: int, segment_mb: int, body_bytes: int = 1000,
               body_kind: BodyKind = BodyKind.RANDOM, seed: int = 0) -> None:
    """About `size_mb` MiB of messages over 4 topics x 4 queues, keys on every message, each
    body distinct (equal bodies would let Parquet's dictionary encoding store one, and its
    scan of them would measure nothing): random bytes or JSON-like text events."""
    bodies = BodyMaker(body_kind, body_bytes, seed)
    config = StoreConfig(commitlog_file_size=segment_mb * MiB, queue_count=4, flush="async")
    store = MessageStore.open(root, config)
    try:
        n = 0
        while store.commitlog.written_pos < size_mb * MiB:
            batch = [Message(f"topic-{(n + i) % 4}", body, tags="bench", keys=(f"k{n + i}",),
                             queue_id=(n + i) % 4) for i, body in enumerate(bodies.batch(n, 1000))]
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

    return _cpu_rates(run)


def measure_decode_bodies(store: str, target_bytes: int) -> dict:
    """One core, no Spark: what the body scan's tasks do (`.schema("body binary")`: only
    bodies decoded); bytes are body bytes."""
    reader = MqstoreReader(parse_options({"path": store, "maxPartitionBytes": str(target_bytes)}),
                           RowSelection(columns=("body",)))

    def run():
        rows = size = 0
        for part in reader.partitions():
            for batch in reader.read(part):
                rows += batch.num_rows
                size += pc.sum(pc.binary_length(batch.column("body"))).as_py() or 0
        return rows, size

    return _cpu_rates(run)


def _cpu_rates(run) -> dict:
    """_rates of `run` (-> rows, bytes) with this process's CPU seconds: one core's wall time
    is the machine's load as much as the decode's."""
    cpu_before = time.process_time()
    (rows, size), seconds = _timed(run)
    return {**_rates(rows, size, seconds), "cpu_s": round(time.process_time() - cpu_before, 3)}


def _rates(rows: int, size: int, seconds: float) -> dict:
    return {"records": rows, "bytes": size, "seconds": round(seconds, 3),
            "records_per_s": round(rows / seconds), "mb_per_s": round(size / MiB / seconds, 1)}


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _median_runs(fn, runs: int) -> dict:
    """Run `fn` (-> rates dict) `runs` times; the median run by seconds, every run with the
    1-minute load average before it."""
    results = []
    for _ in range(runs):
        load = _load()
        results.append({**fn(), "load_before": load})
    ordered = sorted(results, key=lambda r: r["seconds"])
    return {"median": ordered[len(ordered) // 2], "runs": results}


def measure_spark_scan(spark, store: str, target_bytes: int, runs: int = 3) -> dict:
    """count(*) and sum(size) over every row: every record is decoded into Arrow (page cache
    warm: one untimed scan first)."""
    df = jobs.read_store(spark, store, maxPartitionBytes=str(target_bytes))
    query = df.selectExpr("count(*) AS n", "sum(size) AS bytes")
    query.first()

    def once():
        row, seconds = _timed(query.first)
        return _rates(row.n, row.bytes or 0, seconds)

    return {**_median_runs(once, runs), "partitions": df.rdd.getNumPartitions()}


FLOOR_SOURCE = "mqstore_bench_floor"
FLOOR_BATCH_ROWS = 4096


class _FloorReader(DataSourceReader):
    def __init__(self, rows: int, body_bytes: int, partitions: int):
        self.rows, self.body_bytes, self.partition_count = rows, body_bytes, partitions

    def partitions(self) -> list[InputPartition]:
        share = -(-self.rows // self.partition_count)
        return [InputPartition(min(share, self.rows - i * share)) for i in range(self.partition_count)]

    def read(self, partition: InputPartition):
        n = min(FLOOR_BATCH_ROWS, partition.value)
        offsets = np.arange(0, self.body_bytes * n + 1, self.body_bytes, dtype=np.int32)
        bodies = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                        pa.py_buffer(bytes(self.body_bytes * n))])
        batch = pa.RecordBatch.from_arrays([bodies], names=["body"])
        left = partition.value
        while left > 0:
            yield batch.slice(0, min(n, left))
            left -= n


class FloorSource(DataSource):
    """`rows` bodies of `bodyBytes` each as ready-made Arrow batches over `partitions` tasks:
    what any Python data source pays to hand Spark its rows, reading and decoding nothing."""

    @classmethod
    def name(cls) -> str:
        return FLOOR_SOURCE

    def schema(self) -> str:
        return "body binary"

    def reader(self, schema) -> _FloorReader:
        return _FloorReader(int(self.options["rows"]), int(self.options["bodyBytes"]),
                            int(self.options["partitions"]))


BODY_QUERY = ("count(*) AS n", "sum(length(body)) AS body_bytes")


def _tree_cpu_s() -> float:
    """CPU seconds of this process and its descendants (the JVM, the Python workers), reaped
    children included."""
    total = 0.0
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def _body_scan_once(query, store_bytes: int) -> dict:
    cpu_before = _tree_cpu_s()
    row, seconds = _timed(query.first)
    cpu_s = _tree_cpu_s() - cpu_before
    return {"records": row.n, "body_bytes": row.body_bytes, "seconds": round(seconds, 3),
            "cpu_s": round(cpu_s, 2), "body_mb_per_s": round(row.body_bytes / MiB / seconds, 1),
            "store_mb_per_s": round(store_bytes / MiB / seconds, 1)}


def measure_body_scan(spark, store: str, target_bytes: int, parquet_dir: Path, runs: int = 3) -> dict:
    """`count(*), sum(length(body))` over every row: the mqstore source with all columns and
    with `.schema("body binary")`, and Spark's Parquet scan of the same rows (exported to
    `parquet_dir` once). Runs alternate between the three; page cache warm (one untimed
    run of each first)."""
    df = jobs.read_store(spark, store, maxPartitionBytes=str(target_bytes))
    if not parquet_dir.exists():
        _, seconds = _timed(lambda: df.drop("store").write.parquet(str(parquet_dir)))
        export_s = round(seconds, 1)
    else:
        export_s = None
    totals = df.selectExpr("sum(size) AS b", *BODY_QUERY).first()
    store_bytes, partitions = totals.b, df.rdd.getNumPartitions()
    spark.dataSource.register(FloorSource)
    queries = {
        "mqstore": df.selectExpr(*BODY_QUERY),
        "mqstore_body_schema": spark.read.format("mqstore").schema("body binary")
        .option("maxPartitionBytes", str(target_bytes)).load(store).selectExpr(*BODY_QUERY),
        "parquet": spark.read.parquet(str(parquet_dir)).selectExpr(*BODY_QUERY),
        "python_source_floor": spark.read.format(FLOOR_SOURCE).options(
            rows=str(totals.n), bodyBytes=str(totals.body_bytes // max(totals.n, 1)),
            partitions=str(partitions)).load().selectExpr(*BODY_QUERY),
    }
    results: dict[str, list[dict]] = {name: [] for name in queries}
    for query in queries.values():
        query.first()
    for _ in range(runs):
        for name, query in queries.items():
            results[name].append({**_body_scan_once(query, store_bytes), "load_before": _load()})
    out: dict = {"store_bytes": store_bytes, "parquet_dir": str(parquet_dir), "export_s": export_s,
                 "parquet_bytes": sum(f.stat().st_size for f in parquet_dir.rglob("*") if f.is_file()),
                 "partitions": partitions}
    for name, rows in results.items():
        ordered = sorted(rows, key=lambda r: r["seconds"])
        out[name] = {"median": ordered[len(ordered) // 2], "runs": rows}
    parquet_s = out["parquet"]["median"]["seconds"]
    peers = ("mqstore", "mqstore_body_schema", "python_source_floor")
    out["ratio_to_parquet"] = {name: round(parquet_s / out[name]["median"]["seconds"], 3) for name in peers}
    # CPU seconds move less with other sessions' load than wall time: each side's median
    cpu_s = {name: _median([r["cpu_s"] for r in rows]) for name, rows in results.items()}
    out["cpu_ratio_to_parquet"] = {name: round(cpu_s["parquet"] / cpu_s[name], 3) for name in peers}
    return out


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _copy_commitlog(store: str, parent: Path) -> Path:
    copy = Path(tempfile.mkdtemp(prefix="rebuild-", dir=parent)) / "store"
    copy.mkdir()
    shutil.copytree(Path(store) / "commitlog", copy / "commitlog")
    shutil.copy(Path(store) / "store.json", copy / "store.json")
    return copy


def measure_rebuild(spark, store: str, runs: int = 1) -> dict:
    """`jobs.rebuild` on a copy of the commitlog (and store.json)."""
    def once():
        copy = _copy_commitlog(store, Path(store).parent)
        try:
            report, seconds = _timed(lambda: jobs.rebuild(spark, copy))
        finally:
            shutil.rmtree(copy.parent)
        return {"seconds": round(seconds, 3), "queues": report.queues, "cq_entries": report.cq_entries,
                "index_keys": sum(report.index_keys.values())}

    return _median_runs(once, runs)


def dispatch_log(root: Path) -> tuple[int, int]:
    """The single-process dispatcher's path (MessageStore._dispatch_until) over the whole log
    into empty consume queues and index: BatchScanner runs (structure checked) ->
    dispatch_columns; then flush and sync. Returns (entries, keys)."""
    config = config_for_store(read_meta(root), StoreConfig())
    parts = open_parts(root, config, Access.READ_WRITE)
    entries = keys = 0
    try:
        try:
            for run in parts.commitlog.scan_batches(parts.commitlog.min_pos, verify=Verify.STRUCTURE):
                written, put = dispatch_columns(parts.queues, parts.shards, run.columns())
                entries, keys = entries + written, keys + put
        except CorruptRecordError:  # the unwritten end of the last segment
            pass
        parts.queues.flush_all()
        for shard in parts.shards:
            shard.sync()
    finally:
        close_parts(parts)
    return entries, keys


def measure_engine_rebuild(store: str, runs: int = 1) -> dict:
    """The single-process rebuilds of the same commitlog copy: the dispatcher path
    (dispatch_log) and MessageStore.open(recovery=REBUILD) (which also checks every CRC)."""
    def dispatcher():
        copy = _copy_commitlog(store, Path(store).parent)
        try:
            (entries, keys), seconds = _timed(lambda: dispatch_log(copy))
        finally:
            shutil.rmtree(copy.parent)
        return {"seconds": round(seconds, 3), "cq_entries": entries, "index_keys": keys}

    def recovery():
        copy = _copy_commitlog(store, Path(store).parent)
        try:
            _, seconds = _timed(lambda: MessageStore.open(copy, recovery=RecoveryMode.REBUILD).close())
        finally:
            shutil.rmtree(copy.parent)
        return {"seconds": round(seconds, 3)}

    return {"dispatcher": _median_runs(dispatcher, runs), "recovery_rebuild": _median_runs(recovery, runs)}


def _body_scan(spark, store: str, target_bytes: int, args) -> dict:
    if args.parquet_dir:
        return measure_body_scan(spark, store, target_bytes, Path(args.parquet_dir).resolve(), args.body_runs)
    scratch = Path(tempfile.mkdtemp(prefix="bench-parquet-", dir=Path(store).parent))
    try:
        return measure_body_scan(spark, store, target_bytes, scratch / "parquet", args.body_runs)
    finally:
        shutil.rmtree(scratch)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.spark.bench_scan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", required=True)
    p.add_argument("--master", default="local[*]")
    p.add_argument("--make-mb", type=int, help="write a store of about this many MiB first")
    p.add_argument("--segment-mb", type=int, default=1024, help="segment size of a --make-mb store")
    p.add_argument("--body-kind", choices=[k.value for k in BodyKind], default=BodyKind.RANDOM.value,
                   help="bodies of a --make-mb store: distinct random bytes (Parquet's worst case) "
                   "or distinct JSON-like text events (compressible)")
    p.add_argument("--max-partition-mb", type=int, default=128)
    p.add_argument("--runs", type=int, default=3, help="timed Spark scans (median reported)")
    p.add_argument("--body-runs", type=int, default=3,
                   help="timed body scans against Parquet, alternated (0: none)")
    p.add_argument("--parquet-dir", help="the store exported to Parquet (written once if absent; "
                   "default: a temporary directory beside the store, removed after)")
    p.add_argument("--rebuild-runs", type=int, default=0, help="timed Spark rebuilds (0: none)")
    p.add_argument("--engine-rebuild-runs", type=int, default=0,
                   help="timed single-process rebuilds (no Spark)")
    p.add_argument("--skip-planning", action="store_true")
    p.add_argument("--skip-scan", action="store_true", help="skip the count and sum(size) scan")
    p.add_argument("--skip-decode", action="store_true")
    args = p.parse_args(argv)
    store, target_bytes = str(Path(args.store).resolve()), args.max_partition_mb * MiB
    result: dict = {"store": store, "master": args.master, "load_start": _load()}
    if args.make_mb and not Path(store).exists():
        _, seconds = _timed(lambda: make_store(Path(store), args.make_mb, args.segment_mb,
                                                  body_kind=BodyKind(args.body_kind)))
        result["make_s"] = round(seconds, 1)
    if not args.skip_planning:
        result["planning"] = measure_planning(store, target_bytes)
    if not args.skip_decode:
        result["decode_one_core"] = {**measure_decode(store, target_bytes), "load_before": _load()}
        result["decode_bodies_one_core"] = {**measure_decode_bodies(store, target_bytes),
                                            "load_before": _load()}
    if args.runs or args.rebuild_runs or args.body_runs:
        spark = jobs.spark_session(args.master, {"spark.ui.showConsoleProgress": "false"}, "mqstore-bench")
        try:
            spark.sparkContext.setLogLevel("ERROR")
            if args.body_runs:
                result["body_scan"] = _body_scan(spark, store, target_bytes, args)
            if args.runs and not args.skip_scan:
                result["spark_scan"] = measure_spark_scan(spark, store, target_bytes, args.runs)
            if args.rebuild_runs:
                result["rebuild"] = measure_rebuild(spark, store, args.rebuild_runs)
        finally:
            spark.stop()
    if args.engine_rebuild_runs:
        result["engine_rebuild"] = measure_engine_rebuild(store, args.engine_rebuild_runs)
    result["load_end"] = _load()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
