"""What a subscription costs a consumer (docs/BENCHMARKS.md, subscriptions): consume-queue
entries scanned per second by `Consumer.pull_columns` filtered to one tag in ten, and records
per second a compiled property filter evaluates.

A store is started in a temporary directory (async flush, the default layout) and filled with
--messages messages on one queue, tagged t0..t9 in runs of 100 (one in ten is t0), each with
the properties region and amount. Then, --runs times:
- tag scan: pull_columns(tags="t0", max_count=M) from offset 0 to the end, for each M of
  --max-counts; entries/s = the queue's entries / the sweep's wall time;
- property filter: "region = 'eu' AND amount > 100" over the decoded properties of --records
  records (the predicate alone), and pull_columns(where=...) and pull(where=...) over the
  queue (decoding included; pull also checks every record's CRCs).

    .venv/bin/python -m tools.bench.probes.filters [--messages 400000] [--runs 3]
        [--max-counts 32,4096] [--records 200000] [--json]

Prints the median of the runs for each figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from engine.filters.sql import compile_sql_filter
from engine.message import Message
from engine.status import GetStatus, PutStatus
from ipc.consumer import ColumnsResult, Consumer
from ipc.producer import Producer
from tools.store_process import StoreProcess, write_store_config

TOPIC = "bench-filters"
TAG_RUN = 100
WHERE = "region = 'eu' AND amount > 100"
_MOVING = (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE)


def fill(root: Path, messages: int) -> None:
    """`messages` messages on queue 0, tag t(i // TAG_RUN % 10), region and amount by i."""
    with Producer(root) as producer:
        pending = []
        for start in range(0, messages, TAG_RUN):
            tag = f"t{start // TAG_RUN % 10}"
            batch = [Message(TOPIC, b"x" * 64, tags=tag, queue_id=0,
                             properties={"region": "eu" if i % 2 else "us", "amount": str(i % 300)})
                     for i in range(start, min(start + TAG_RUN, messages))]
            pending.append(producer.send_batch_async(batch))
            if len(pending) >= 16:
                _require_stored(pending.pop(0).result())
        for future in pending:
            _require_stored(future.result())


def _require_stored(results) -> None:
    statuses = {r.status for r in results}
    if statuses != {PutStatus.PUT_OK}:
        raise RuntimeError(f"the fill was not stored: {statuses}")


def sweep(consumer: Consumer, read, **subscription) -> tuple[float, int]:
    """Seconds to read the queue from 0 to its end with `read`, and the messages delivered."""
    offset, delivered = 0, 0
    began = time.perf_counter()
    while True:
        result = read(TOPIC, 0, offset, **subscription)
        if result.status not in _MOVING:
            return time.perf_counter() - began, delivered
        delivered += result.count if isinstance(result, ColumnsResult) else len(result.messages)
        offset = result.next_offset


def predicate_rate(consumer: Consumer, records: int) -> float:
    """Records/s of the compiled filter alone, over decoded properties of the queue's records."""
    props = [r.properties for r in consumer.pull(TOPIC, 0, 0, 4096).messages]
    props = (props * (records // len(props) + 1))[:records]
    matches = compile_sql_filter(WHERE).matches
    began = time.perf_counter()
    hits = sum(map(matches, props))
    seconds = time.perf_counter() - began
    if not 0 < hits < records:
        raise RuntimeError(f"the filter matched {hits} of {records} records: not a filter's work")
    return records / seconds


def measure(root: Path, messages: int, max_counts: list[int], records: int) -> dict:
    out: dict[str, float] = {}
    with Consumer(root, "bench-filters") as consumer:
        for max_count in max_counts:
            seconds, got = sweep(consumer, consumer.pull_columns, tags="t0", max_count=max_count)
            if got != messages // 10:
                raise RuntimeError(f"tags=t0 delivered {got} of the {messages // 10} messages tagged t0")
            out[f"pull_columns tags=t0 max_count={max_count}: entries/s"] = messages / seconds
        out["property filter alone: records/s"] = predicate_rate(consumer, records)
        seconds, _ = sweep(consumer, consumer.pull_columns, where=WHERE, max_count=4096)
        out["pull_columns where max_count=4096 (decoding included): records/s"] = messages / seconds
        seconds, _ = sweep(consumer, consumer.pull, where=WHERE, max_count=32)
        out["pull where max_count=32 (decoding, CRCs included): records/s"] = messages / seconds
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.probes.filters", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=400_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-counts", default="32,4096")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    max_counts = [int(v) for v in args.max_counts.split(",")]
    with tempfile.TemporaryDirectory(prefix="mqstore-bench-filters-") as tmp:
        work = Path(tmp)
        config = write_store_config(work / "store.toml", {"flush": "async"})
        store = StoreProcess(work / "store", config, work / "supervisor.log")
        store.start()
        try:
            store.wait_ready()
            fill(store.root, args.messages)
            store.wait_caught_up()
            runs = [measure(store.root, args.messages, max_counts, args.records) for _ in range(args.runs)]
        finally:
            store.stop()
    medians = {name: statistics.median(run[name] for run in runs) for name in runs[0]}
    if args.json:
        print(json.dumps({"messages": args.messages, "runs": args.runs, "medians": medians}))
    else:
        for name, value in medians.items():
            print(f"{name:66s} {value:12,.0f}  (median of {args.runs})")
    return medians


if __name__ == "__main__":
    main()
