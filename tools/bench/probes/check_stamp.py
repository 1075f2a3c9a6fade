"""The supervisor's per-request CPU, isolated: check + offsets + stamp + append of producer records.

    .venv/bin/python -m tools.bench.probes.check_stamp [--records 100000] [--batches 1,8,64]
        [--body-bytes 256] [--runs 3] [--json FILE] [--dir DIR]

Requests are built as a producer builds them (encode_many.encode_records: one topic, a KEYS key
and a UNIQ_KEY per message, queue ids round robin) and served as workers.appender serves a
mailbox request: a private copy of the request bytes, RecordChecker.check_request, queue offsets
per (topic, queue id), then the append into a fresh commitlog in a temp directory (no flush):
"append_encoded" as the appender does it (CommitLog.append_encoded checks every record again
with stamp_many.check_stampable), "fused" without that second check
(request_check.merge_checked + CommitLog.append_stampable). Each figure is records per
CPU-second of this process (`time.process_time`, steadier than wall time on a shared machine;
page faults of the fresh segment included), median of `--runs`; "check" times check_request
alone on the same requests.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from engine.config import GiB
from engine.files.mapped_file import Access
from engine.formats.record.encode_many import encode_records
from engine.formats.uniq_key import new_uniq_keys
from engine.log.commitlog import CommitLog
from engine.topics.table import TopicDefaults, TopicTable
from workers.request_check import CheckedRequest, RecordChecker, merge_checked

TOPIC = b"bench-0"
QUEUES = 4
# the topic configured, as the supervisor finds a topic after its first message
BENCH_TOPICS = TopicTable().with_topic(TopicDefaults(QUEUES).config_for(TOPIC.decode()))
BORN, STORE = ("127.0.0.1", 40000), ("127.0.0.1", 10911)


def make_requests(count: int, batch: int, body_bytes: int) -> list[tuple[bytes, int]]:
    """(request bytes, record count) of `count` records in requests of `batch`."""
    requests = []
    for lo in range(0, count, batch):
        n = min(batch, count - lo)
        props = [f"KEYS\x01key-{lo + i:012d}\x02UNIQ_KEY\x01{u}\x02".encode()
                 for i, u in enumerate(new_uniq_keys(n))]
        bodies = [os.urandom(body_bytes) for _ in range(n)]
        queue_ids = [(lo + i) % QUEUES for i in range(n)]
        enc = encode_records([TOPIC] * n, bodies, props, queue_ids, born_ts_ms=time.time_ns() // 10**6,
                             born_host=BORN, store_host=STORE)
        requests.append((bytes(enc.buf), n))
    return requests


def queue_offsets(checked: CheckedRequest, next_offsets: dict) -> list[int]:
    """The appender's offset assignment: the next offset of each record's (topic, queue id)."""
    offsets = []
    good = [i for i, ok in enumerate(checked.ok.tolist()) if ok]
    for topic, queue_id in zip((checked.topics[i] for i in good), checked.queue_ids[good].tolist(),
                               strict=True):
        key = (topic, queue_id)
        offset = next_offsets.get(key, 0)
        next_offsets[key] = offset + 1
        offsets.append(offset)
    return offsets


def run_check(checker: RecordChecker, requests: list[tuple[bytes, int]]) -> float:
    """CPU seconds of check_request over every request."""
    start = time.process_time()
    for raw, n in requests:
        checker.check_request(bytearray(raw), n)
    return time.process_time() - start


def append_as_appender(log: CommitLog, data: bytearray, checked: CheckedRequest, offsets: list[int]) -> None:
    """The appender's append (all records passed here): append_encoded checks them again."""
    log.append_encoded(data, checked.starts, checked.sizes, offsets, time.time_ns() // 10**6)


def append_fused(log: CommitLog, data: bytearray, checked: CheckedRequest, offsets: list[int]) -> None:
    """The records check_request accepted go straight to append_stampable."""
    log.append_stampable(merge_checked(data, [(0, checked)]).records, offsets, time.time_ns() // 10**6)


def append_requests(log: CommitLog, checker: RecordChecker, requests: list[tuple[bytes, int]]) -> list[int]:
    """Check and append each request as the appender does (fused, untimed): a log to read back;
    the written position after each request."""
    next_offsets: dict = {}
    ends = []
    for raw, n in requests:
        data = bytearray(raw)
        checked = checker.check_request(data, n)
        append_fused(log, data, checked, queue_offsets(checked, next_offsets))
        ends.append(log.written_pos)
    return ends


Append = Callable[[CommitLog, bytearray, CheckedRequest, list[int]], None]


def run_append(checker: RecordChecker, requests: list[tuple[bytes, int]], directory: Path,
               append: Append) -> float:
    """CPU seconds of check, offsets, stamp and append of every request into a fresh commitlog."""
    log = CommitLog.open(directory, 1 * GiB, Access.READ_WRITE)
    next_offsets: dict = {}
    try:
        start = time.process_time()
        for raw, n in requests:
            data = bytearray(raw)
            checked = checker.check_request(data, n)
            append(log, data, checked, queue_offsets(checked, next_offsets))
        seconds = time.process_time() - start
        if log.written_pos < sum(len(raw) for raw, _ in requests):  # a record was refused
            raise RuntimeError(f"only {log.written_pos} bytes appended")
        return seconds
    finally:
        log.close()


def bench(records: int, batches: list[int], body_bytes: int, runs: int, work_dir: Path | None) -> dict:
    checker = RecordChecker(max_body_bytes=4 << 20, segment_bytes=1 * GiB,
                            route=partial(BENCH_TOPICS.put_route, defaults=TopicDefaults(QUEUES)))
    out = {"load_before": os.getloadavg()[0], "records": records, "body_bytes": body_bytes}
    for batch in batches:
        count = records if batch > 1 else records // 4
        requests = make_requests(count, batch, body_bytes)
        check_s, append_s, fused_s = [], [], []
        for _ in range(runs):
            check_s.append(run_check(checker, requests))
            for append, seconds in ((append_as_appender, append_s), (append_fused, fused_s)):
                with tempfile.TemporaryDirectory(prefix="mqstore-check-stamp-", dir=work_dir) as tmp:
                    seconds.append(run_append(checker, requests, Path(tmp), append))
        out[f"batch_{batch}"] = {
            "check_per_cpu_s": round(count / statistics.median(check_s)),
            "append_encoded_per_cpu_s": round(count / statistics.median(append_s)),
            "fused_per_cpu_s": round(count / statistics.median(fused_s)),
            "us_per_record": {"check": round(statistics.median(check_s) / count * 1e6, 2),
                              "append_encoded": round(statistics.median(append_s) / count * 1e6, 2),
                              "fused": round(statistics.median(fused_s) / count * 1e6, 2)},
        }
    out["load_after"] = os.getloadavg()[0]
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--body-bytes", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--dir", type=Path, help="where the temporary commitlogs go (default: the "
                        "system's temp directory); each is deleted after its run")
    args = parser.parse_args(argv)
    result = bench(args.records, [int(b) for b in args.batches.split(",")], args.body_bytes, args.runs,
                   args.dir)
    print(f"load {result['load_before']:.2f} -> {result['load_after']:.2f}; records per CPU-second "
          "(us per record):")
    for key, row in result.items():
        if key.startswith("batch_"):
            us = row["us_per_record"]
            print(f"  {key:10} check {row['check_per_cpu_s']:>9,} ({us['check']:6.2f})   check+offsets+"
                  f"append_encoded {row['append_encoded_per_cpu_s']:>9,} ({us['append_encoded']:6.2f})   "
                  f"fused {row['fused_per_cpu_s']:>9,} ({us['fused']:6.2f})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
