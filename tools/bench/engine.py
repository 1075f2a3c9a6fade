"""The engine alone, in one process: put_batch, append path, dispatch, verification, key queries.

    .venv/bin/python -m tools.bench.engine [--records N] [--body-bytes 256] [--batch 64]
        [--runs 3] [--json FILE] [--dir DIR] [--only put,append,dispatch,verify,query]

Every message has a `--body-bytes` random body, one key (KEYS) and the UNIQ_KEY the store
makes, so two index keys per record. Each put_batch goes to one queue (RocketMQ sends a batch
to one queue), batches rotating over 8 queues. Figures are medians of `--runs` runs; the
machine's load average is printed beside them because the machine may be shared.

- put: MessageStore.put_batch end to end (encode, append, flush policy, inline dispatch),
  flush=async (the CPU path) and flush=sync (msync per batch);
- append: encode_records + CommitLog.append_encoded (the batch path) beside the scalar one
  (encode_record per message + append_batch), no flush;
- dispatch: scan_batches + dispatch_columns over the commitlog written by `append`, into
  fresh consume queues and index shards (what MessageStore and recovery run);
- verify: a full Verify.MQSTORE scan (scan_batches) of a >= `--verify-gib` commitlog, beside
  plain os.read of the same files in 8 MiB chunks with a warm page cache;
- query: query_by_key p50/p99/max on that store, which holds >= 5M index keys; it is built with
  the batch append and batch dispatch (build time reported), then opened as a MessageStore.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import tempfile
import time
from itertools import islice
from pathlib import Path

import numpy as np

from engine.config import FlushPolicy, GiB, MiB, StoreConfig
from engine.dispatch.record import (
    dispatch_columns,
    dispatch_to_consume_queue,
    dispatch_to_shard,
    keys_by_shard,
)
from engine.errors import CorruptRecordError
from engine.files.mapped_file import Access
from engine.formats.record import Verify, encode_record
from engine.formats.record.encode_many import encode_records
from engine.formats.uniq_key import new_uniq_keys
from engine.index.shard import ShardIndex
from engine.log.commitlog import CommitLog
from engine.message import Message
from engine.queues.table import ConsumeQueueTable
from engine.recovery.checkpoint import write_checkpoint
from engine.recovery.durable_times import CheckpointTimes
from engine.store import MessageStore
from engine.store_open import close_parts, open_parts

TOPIC = "BenchTopic"
QUEUES = 8
READ_CHUNK_BYTES = 8 * MiB
BORN, STORE = ("127.0.0.1", os.getpid() & 0x7FFFFFFF), ("127.0.0.1", 10911)


def _load() -> float:
    return round(os.getloadavg()[0], 2)


class Timer:
    """Wall and CPU (process) time of a block; under load the CPU rate is the steadier one."""

    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def _median_rate(runs: list[tuple[int, Timer]]) -> dict:
    rates = [count / t.wall for count, t in runs]
    cpu_rates = [count / t.cpu for count, t in runs]
    return {"median_per_s": round(statistics.median(rates)), "runs_per_s": [round(r) for r in rates],
            "median_per_cpu_s": round(statistics.median(cpu_rates)), "load_avg_1m": _load()}


class Inputs:
    """Bodies (a pool of random ones, cycled), keys and encoded properties for n messages."""

    def __init__(self, count: int, body_bytes: int, seed: int = 7):
        rnd = random.Random(seed)
        pool = [rnd.randbytes(body_bytes) for _ in range(min(count, 1024))]
        self.count = count
        self.bodies = [pool[i % len(pool)] for i in range(count)]
        self.keys = [f"key-{i:09d}" for i in range(count)]

    def messages(self, lo: int, hi: int) -> list[Message]:
        return [Message(TOPIC, self.bodies[i], keys=(self.keys[i],), queue_id=(lo // 64) % QUEUES)
                for i in range(lo, hi)]

    def props(self, lo: int, hi: int) -> list[bytes]:
        """Encoded KEYS and a fresh UNIQ_KEY per message (what encode_message_properties makes)."""
        uniq = new_uniq_keys(hi - lo)
        return [f"KEYS\x01{key}\x02UNIQ_KEY\x01{u}\x02".encode()
                for key, u in zip(self.keys[lo:hi], uniq, strict=True)]


# ---------------------------------------------------------------- (a) put_batch


def bench_put(work: Path, inputs: Inputs, batch: int, runs: int, flush: FlushPolicy) -> dict:
    config = StoreConfig(flush=flush, index_slot_count=1_000_000, index_entry_count=4_000_000)
    results = []
    batches = [inputs.messages(lo, min(lo + batch, inputs.count)) for lo in range(0, inputs.count, batch)]
    for run in range(runs):
        root = work / f"put-{flush.value}-{run}"
        with MessageStore.open(root, config) as store:
            with Timer() as timer:
                for messages in batches:
                    store.put_batch(messages)
            results.append((inputs.count, timer))
        shutil.rmtree(root)
    return _median_rate(results)


# ---------------------------------------------------------------- (b) append path


def append_batched(log: CommitLog, inputs: Inputs, batch: int, start_offset: int = 0) -> None:
    topic = TOPIC.encode()
    for lo in range(0, inputs.count, batch):
        hi = min(lo + batch, inputs.count)
        enc = encode_records([topic] * (hi - lo), inputs.bodies[lo:hi], inputs.props(lo, hi),
                             [0] * (hi - lo), born_ts_ms=int(time.time() * 1000), born_host=BORN,
                             store_host=STORE)
        log.append_encoded(enc.buf, enc.starts, enc.sizes, range(start_offset + lo, start_offset + hi),
                           int(time.time() * 1000))


def append_scalar(log: CommitLog, inputs: Inputs, batch: int) -> None:
    for lo in range(0, inputs.count, batch):
        hi = min(lo + batch, inputs.count)
        records = [encode_record(TOPIC, inputs.bodies[i], queue_id=0, born_ts_ms=int(time.time() * 1000),
                                 properties={"KEYS": inputs.keys[i], "UNIQ_KEY": u}, born_host=BORN,
                                 store_host=STORE)
                   for i, u in zip(range(lo, hi), new_uniq_keys(hi - lo), strict=True)]
        log.append_batch(records, list(range(lo, hi)), int(time.time() * 1000))


def bench_append(work: Path, inputs: Inputs, batch: int, runs: int) -> tuple[dict, Path, int]:
    out, end_pos = {}, 0
    variants = (("batch", append_batched, batch), ("batch_1024", append_batched, 1024),
                ("scalar", append_scalar, batch))
    for name, append, size in variants:
        results = []
        for run in range(runs):
            root = work / f"append-{name}-{run}"
            log = CommitLog.open(root, GiB, Access.READ_WRITE)
            with Timer() as timer:
                append(log, inputs, size)
            results.append((inputs.count, timer))
            end_pos = log.written_pos if name == "batch" and run == 0 else end_pos
            log.close()
            if not (name == "batch" and run == 0):
                shutil.rmtree(root)
        out[name] = _median_rate(results)
    return out, work / "append-batch-0", end_pos


# ---------------------------------------------------------------- (c) dispatch


def dispatch_log(log: CommitLog, end_pos: int, queues: ConsumeQueueTable, shards: list[ShardIndex]) -> int:
    count = 0
    for run in log.scan_batches(log.min_pos, end_pos, Verify.STRUCTURE):
        cols = run.columns()
        dispatch_columns(queues, shards, cols)
        count += cols.count
    return count


def bench_dispatch(work: Path, log_root: Path, end_pos: int, runs: int, config: StoreConfig) -> dict:
    log = CommitLog.open(log_root, GiB, Access.READ_ONLY)
    results = []
    for run in range(runs):
        root = work / f"dispatch-{run}"
        queues = ConsumeQueueTable.load(root, config.consume_queue_entries, Access.READ_WRITE)
        shards = [ShardIndex.load(root, n, config.index_slot_count, config.index_entry_count,
                                  Access.READ_WRITE) for n in range(config.index_shards)]
        with Timer() as timer:
            count = dispatch_log(log, end_pos, queues, shards)
        results.append((count, timer))
        queues.close()
        for shard in shards:
            shard.close()
        shutil.rmtree(root)
    out = _median_rate(results)
    out["scalar_per_s"] = _dispatch_scalar_rate(work / "dispatch-scalar", log, end_pos, config)
    log.close()
    return out


def _dispatch_scalar_rate(root: Path, log: CommitLog, end_pos: int, config: StoreConfig,
                          limit: int = 50_000) -> int:
    """The record-by-record reference (what MessageStore ran before), over the first records."""
    queues = ConsumeQueueTable.load(root, config.consume_queue_entries, Access.READ_WRITE)
    shards = [ShardIndex.load(root, n, config.index_slot_count, config.index_entry_count,
                              Access.READ_WRITE) for n in range(config.index_shards)]
    count = 0
    with Timer() as timer:
        for header in islice(log.scan_headers(log.min_pos, end_pos), limit):
            dispatch_to_consume_queue(queues, header)
            by_shard = keys_by_shard(header, len(shards))
            for n, shard in enumerate(shards):
                dispatch_to_shard(shard, header, by_shard.get(n, ()))
            count += 1
    queues.close()
    for shard in shards:
        shard.close()
    shutil.rmtree(root)
    return round(count / timer.wall)


# ---------------------------------------------------------------- (d) verification, (e) query


def build_store(root: Path, inputs: Inputs, batch: int, config: StoreConfig) -> dict:
    """A store whose commitlog holds every input, dispatched in batches, closed cleanly."""
    MessageStore.open(root, config).close()
    parts = open_parts(root, config, Access.READ_WRITE)
    started = time.perf_counter()
    append_batched(parts.commitlog, inputs, batch)
    parts.commitlog.flush()
    appended = time.perf_counter()
    dispatch_log(parts.commitlog, parts.commitlog.written_pos, parts.queues, parts.shards)
    parts.queues.flush_all()
    end = parts.commitlog.written_pos
    positions = tuple(shard.sync() for shard in parts.shards)
    times = CheckpointTimes(parts.commitlog, root, len(parts.shards))
    write_checkpoint(root, times.checkpoint(end, end, positions))
    close_parts(parts)
    done = time.perf_counter()
    return {"records": inputs.count, "index_keys": 2 * inputs.count, "commitlog_bytes": end,
            "append_s": round(appended - started, 1), "dispatch_s": round(done - appended, 1)}


def raw_read(spans: list[tuple[Path, int]]) -> int:
    """Plain os.read of the first `size` bytes of each file, READ_CHUNK_BYTES at a time."""
    total = 0
    for path, size in spans:
        fd = os.open(path, os.O_RDONLY)
        try:
            left = size
            while left > 0 and (chunk := os.read(fd, min(READ_CHUNK_BYTES, left))):
                total += len(chunk)
                left -= len(chunk)
        finally:
            os.close(fd)
    return total


def verify_log(log: CommitLog) -> tuple[int, int]:
    """(records, end position): every record checked as decode_record(Verify.MQSTORE) does; the
    scan ends at the unwritten space after the last record (a CorruptRecordError there)."""
    scanner = log.scan_batches(log.min_pos, verify=Verify.MQSTORE)
    records = 0
    try:
        for run in scanner:
            records += run.count
    except CorruptRecordError as exc:
        if "unwritten" not in exc.reason:
            raise
    return records, scanner.pos


def bench_verify(root: Path, runs: int) -> dict:
    log = CommitLog.open(root, GiB, Access.READ_ONLY)
    records, end_pos = verify_log(log)  # and warms the page cache
    spans = [(s.path, min(s.size_bytes, end_pos - log.segments.base_of(s))) for s in log.segments.segments
             if log.segments.base_of(s) < end_pos]
    raw_read(spans)
    reads, scans = [], []
    for _ in range(runs):
        with Timer() as timer:
            read_bytes = raw_read(spans)
        reads.append((read_bytes, timer))
        with Timer() as timer:
            records, _ = verify_log(log)
        scans.append((records, timer))
    scalar_count = min(records, 200_000)
    started = time.perf_counter()
    for _ in islice(log.scan(log.min_pos, verify=Verify.MQSTORE), scalar_count):
        pass
    scalar_s = time.perf_counter() - started
    log.close()
    avg_record = read_bytes / records if records else 0
    read_rate = _median_rate(reads)
    return {"records": records, "file_bytes": read_bytes, "verify": _median_rate(scans),
            "raw_read_warm_bytes_per_s": read_rate["median_per_s"],
            "raw_read_warm_records_per_s_equiv": round(read_rate["median_per_s"] / avg_record),
            "scalar_verify_per_s": round(scalar_count / scalar_s)}


def bench_query(root: Path, inputs: Inputs, config: StoreConfig, queries: int, runs: int) -> dict:
    """Random existing keys; pass 1 right after open (index pages not yet mapped by this
    process, page cache warm), then `runs` more passes over other random keys."""
    rnd = random.Random(11)
    passes = []
    with MessageStore.open(root, config) as store:
        for _ in range(1 + runs):
            keys = [inputs.keys[rnd.randrange(inputs.count)] for _ in range(queries)]
            latencies, found = [], 0
            for key in keys:
                started = time.perf_counter()
                found += len(store.query_by_key(TOPIC, key))
                latencies.append(time.perf_counter() - started)
            ms = np.array(latencies) * 1000
            passes.append({"found": found, "p50_ms": round(float(np.percentile(ms, 50)), 3),
                           "p99_ms": round(float(np.percentile(ms, 99)), 3),
                           "max_ms": round(float(ms.max()), 3), "load_avg_1m": _load()})
    later = passes[1:]
    return {"queries_per_pass": queries, "first_pass": passes[0], "later_passes": later,
            "p50_ms": statistics.median(p["p50_ms"] for p in later),
            "p99_ms": statistics.median(p["p99_ms"] for p in later),
            "max_ms": max(p["max_ms"] for p in later), "load_avg_1m": _load()}


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tools.bench.engine", description=__doc__.split("\n")[0])
    p.add_argument("--records", type=int, default=200_000, help="records for put/append/dispatch")
    p.add_argument("--body-bytes", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--sync-records", type=int, default=50_000, help="records for put with flush=sync")
    p.add_argument("--verify-gib", type=float, default=1.05, help="commitlog size for verify and query")
    p.add_argument("--big-records", type=int, default=0,
                   help="records of the verify/query store (default: >= --verify-gib and >= 2.5M)")
    p.add_argument("--queries", type=int, default=20_000)
    p.add_argument("--only", default="put,append,dispatch,verify,query")
    p.add_argument("--dir", type=Path, default=None, help="work directory (default: a new one in /tmp)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


def run_measures(args: argparse.Namespace, work: Path, out: dict) -> None:
    only, config = set(args.only.split(",")), StoreConfig()
    inputs = Inputs(args.records, args.body_bytes)
    if "put" in only:
        out["put_async"] = bench_put(work, inputs, args.batch, args.runs, FlushPolicy.ASYNC)
        sync_inputs = Inputs(min(args.sync_records, args.records), args.body_bytes)
        out["put_sync"] = bench_put(work, sync_inputs, args.batch, args.runs, FlushPolicy.SYNC)
    if only & {"append", "dispatch"}:
        out["append"], log_root, end_pos = bench_append(work, inputs, args.batch, args.runs)
        if "dispatch" in only:
            out["dispatch"] = bench_dispatch(work, log_root, end_pos, args.runs, config)
    if only & {"verify", "query"}:
        record_bytes = 91 + args.body_bytes + len(TOPIC) + 80
        count = args.big_records or max(int(args.verify_gib * GiB / record_bytes), 2_500_000)
        big = Inputs(count, args.body_bytes)
        root = work / "big"
        out["big_store"] = build_store(root, big, 4096, config)
        if "verify" in only:
            out["verify"] = bench_verify(root, args.runs)
        if "query" in only:
            out["query"] = bench_query(root, big, config, args.queries, args.runs)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="mqstore-engine-bench-", dir=args.dir))
    out: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                             "load_avg_1m_start": _load()},
                 "args": {k: str(v) for k, v in vars(args).items()}}
    try:
        run_measures(args, work, out)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    out["machine"]["load_avg_1m_end"] = _load()
    print_table(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return out


def print_table(out: dict) -> None:
    rows = []
    for name, label in (("put_async", "put_batch end to end, flush=async"),
                        ("put_sync", "put_batch end to end, flush=sync")):
        if name in out:
            rows.append((label, _rate(out[name]), out[name]["load_avg_1m"]))
    if "append" in out:
        for kind in ("batch", "batch_1024", "scalar"):
            rows.append((f"append path ({kind})", _rate(out["append"][kind]),
                         out["append"][kind]["load_avg_1m"]))
    if "dispatch" in out:
        rows.append(("dispatch (cq + 2 index keys/rec)", _rate(out["dispatch"]),
                     out["dispatch"]["load_avg_1m"]))
        rows.append(("dispatch, scalar reference", f"{out['dispatch']['scalar_per_s']:,} rec/s", ""))
    if "verify" in out:
        v = out["verify"]
        rows.append((f"verify MQSTORE, {v['file_bytes'] / GiB:.2f} GiB",
                     _rate(v["verify"]), v["verify"]["load_avg_1m"]))
        rows.append(("raw os.read 8 MiB, warm cache", f"{v['raw_read_warm_bytes_per_s'] / GiB:.2f} GiB/s = "
                     f"{v['raw_read_warm_records_per_s_equiv']:,} rec/s", ""))
        rows.append(("verify, scalar reference", f"{v['scalar_verify_per_s']:,} rec/s", ""))
    if "query" in out:
        q = out["query"]
        first = q["first_pass"]
        keys = out["big_store"]["index_keys"]
        rows.append((f"query_by_key, {keys:,} keys, first round of queries after open",
                     f"p50 {first['p50_ms']} / p99 {first['p99_ms']} / max {first['max_ms']} ms",
                     first["load_avg_1m"]))
        rows.append(("query_by_key, later passes (median)",
                     f"p50 {q['p50_ms']} / p99 {q['p99_ms']} / max {q['max_ms']} ms", q["load_avg_1m"]))
    width = max(len(r[0]) for r in rows) if rows else 0
    print(f"{'measure':<{width}}  {'median (wall; per CPU second)':<44}  load")
    for label, value, load in rows:
        print(f"{label:<{width}}  {value:<44}  {load}")


def _rate(result: dict) -> str:
    return f"{result['median_per_s']:,} rec/s; {result['median_per_cpu_s']:,}/cpu-s"


if __name__ == "__main__":
    main()
