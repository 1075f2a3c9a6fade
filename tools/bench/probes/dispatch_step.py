"""The dispatcher's CPU per step, isolated: decoding a run of records into dispatch columns and
each shard's keys, with the batch codec (CommitLog.scan_batches + ScannedRun.columns), record
by record with the reference decoder (CommitLog.scan_headers + columns_from_headers) or in plain
Python (engine.dispatch.few: decode_few + few_key_columns, the dispatcher's small steps), at a
given number of records a step.

    .venv/bin/python -m tools.bench.probes.dispatch_step [--records 1,2,4,8,16,32,64] [--body-bytes 256]
        [--steps 300] [--runs 3]

Records are built as a producer builds them (tools.bench.probes.check_stamp: a key and a UNIQ_KEY per
message, queue ids round robin) and appended to a commitlog in a temp directory. Each figure is
CPU microseconds per step (`time.process_time`), median of `--runs`. The batch codec and the
plain path cross at a number of records; engine.tuning.FEW_RECORDS_BYTES keeps a backlog of
the smallest records below it.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

from engine.config import GiB
from engine.dispatch.few import decode_few, few_key_columns
from engine.dispatch.record import shard_key_columns
from engine.files.mapped_file import Access
from engine.formats.record import Verify
from engine.formats.record.dispatch_columns import columns_from_headers
from engine.log.commitlog import CommitLog
from engine.topics.table import TopicDefaults
from tools.bench.probes.check_stamp import BENCH_TOPICS, QUEUES, append_requests, make_requests
from workers.request_check import RecordChecker

SHARDS = 2


def build_log(root: Path, records: int, body_bytes: int) -> tuple[CommitLog, list[int]]:
    """A commitlog of `records` one-record requests; the position after each record."""
    log = CommitLog.open(root, 1 * GiB, Access.READ_WRITE)
    checker = RecordChecker(max_body_bytes=body_bytes, segment_bytes=1 * GiB,
                            route=partial(BENCH_TOPICS.put_route, defaults=TopicDefaults(QUEUES)))
    return log, append_requests(log, checker, make_requests(records, 1, body_bytes))


def step_batch(log: CommitLog, start_pos: int, end_pos: int) -> None:
    for run in log.scan_batches(start_pos, end_pos, Verify.STRUCTURE):
        shard_key_columns(run.columns(), SHARDS)


def step_each(log: CommitLog, start_pos: int, end_pos: int) -> None:
    shard_key_columns(columns_from_headers(list(log.scan_headers(start_pos, end_pos))), SHARDS)


def step_plain(log: CommitLog, start_pos: int, end_pos: int) -> None:
    window = log.window_at(start_pos)
    few = decode_few(window.buf, start_pos - window.base_pos, end_pos - window.base_pos, window.base_pos)
    few_key_columns(few, SHARDS)


def time_steps(step, log: CommitLog, ends: list[int], per_step: int, steps: int) -> float:
    """CPU microseconds per step of `per_step` records."""
    bounds = [0, *ends][::per_step][:steps + 1]
    start = time.process_time()
    for lo, hi in itertools.pairwise(bounds):
        step(log, lo, hi)
    return (time.process_time() - start) / (len(bounds) - 1) * 1e6


def main(argv: list[str] | None = None) -> dict[int, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", default="1,2,4,8,16,32,64", help="records per step, comma-separated")
    parser.add_argument("--body-bytes", type=int, default=256)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.records.split(",")]
    with tempfile.TemporaryDirectory() as work:
        log, ends = build_log(Path(work), max(sizes) * args.steps, args.body_bytes)
        try:
            return measure(log, ends, sizes, args.steps, args.runs)
        finally:
            log.close()


def measure(log: CommitLog, ends: list[int], sizes: list[int], steps: int, runs: int
            ) -> dict[int, dict[str, float]]:
    """The three paths at each number of records a step, printed and returned (CPU us per step)."""
    print(f"{ends[0]} bytes a record; CPU us per step, median of {runs}:")
    out: dict[int, dict[str, float]] = {}
    for n in sizes:
        batch, each, plain = (statistics.median(time_steps(step, log, ends, n, steps) for _ in range(runs))
                              for step in (step_batch, step_each, step_plain))
        print(f"  {n:4d} records ({n * ends[0]:7d} B)   batch codec {batch:7.1f}   "
              f"record by record {each:7.1f}   plain {plain:7.1f}")
        out[n] = {"batch_us": batch, "each_us": each, "plain_us": plain}
    return out


if __name__ == "__main__":
    main()
