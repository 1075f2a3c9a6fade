"""`mqstore quick-bench`: a quick throughput probe against a running store.

    mqstore start --detach --store /tmp/bench
    mqstore quick-bench --store /tmp/bench --producers 4 --batch 64 --body-bytes 256 --seconds 5

N producer processes (started as `python -m tools.cli _bench-worker ...`, so nothing is
pickled) each send batches of `--batch` messages of `--body-bytes` bytes for `--seconds`
with send_batch_async, keeping `--inflight` batches in flight (1: wait for each batch's
answer before sending the next), counting acknowledged (PUT_OK) messages and timing each batch. The report
gives messages/s over the slowest producer's wall time and batch latency percentiles. It is
a probe, not the load-test harness (`mqstore bench`, tools/bench): no warm-up control, no
open-loop arrival schedule, no consumers. `mqstore bench` falls back to it when tools.bench
cannot be imported.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from workers.exit_codes import CliExit

REPO_ROOT = Path(__file__).resolve().parent.parent


def add_parser(command, name: str = "quick-bench") -> None:
    p = command(name, "quick throughput probe: N producer processes against a running store",
                cmd_bench)
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--batch", type=int, default=64, help="messages per send_batch")
    p.add_argument("--body-bytes", type=int, default=256)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--topic", default="bench")
    p.add_argument("--inflight", type=int, default=1,
                   help="batches each producer keeps in flight (send_batch_async)")
    p.add_argument("--json", action="store_true")


def cmd_bench(args: argparse.Namespace) -> int:
    from engine.errors import BadInputError
    from ipc.producer import attach_running_store

    for name in ("producers", "batch", "body_bytes", "inflight"):
        if getattr(args, name) < 1:
            raise BadInputError(name.replace("_", "-"), "must be >= 1")
    ctl, _ = attach_running_store(args.store)  # fail fast when nothing runs
    ctl.close()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    start_at = time.time() + 1.0
    argv = [sys.executable, "-m", "tools.cli", "_bench-worker", "--store", str(args.store),
            "--batch", str(args.batch), "--body-bytes", str(args.body_bytes),
            "--seconds", str(args.seconds), "--topic", args.topic, "--start-at", str(start_at),
            "--inflight", str(args.inflight)]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, env=env) for _ in range(args.producers)]
    reports = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"mqstore: error: a bench producer exited with {proc.returncode}")
        reports.append(json.loads(out))
    total = sum(r["acked"] for r in reports)
    failed = sum(r["failed"] for r in reports)
    wall = max(r["wall_s"] for r in reports)
    lat = np.array([x for r in reports for x in r["batch_ms"]] or [0.0])
    result = {"producers": args.producers, "batch": args.batch, "body_bytes": args.body_bytes,
              "inflight": args.inflight,
              "acked_msgs": total, "failed_msgs": failed, "wall_s": round(wall, 3),
              "msgs_per_s": round(total / wall if wall else 0.0, 1),
              "mib_per_s": round(total * args.body_bytes / wall / 2**20 if wall else 0.0, 2),
              "producer_cpu_us_per_msg": round(sum(r["cpu_s"] for r in reports) / max(total, 1) * 1e6, 2),
              "batch_ms_p50": round(float(np.percentile(lat, 50)), 3),
              "batch_ms_p99": round(float(np.percentile(lat, 99)), 3)}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{total} messages acknowledged by {args.producers} producers in {wall:.2f} s: "
              f"{result['msgs_per_s']:.0f} msg/s ({result['mib_per_s']} MiB/s of bodies); "
              f"batch latency p50 {result['batch_ms_p50']} ms, p99 {result['batch_ms_p99']} ms; "
              f"producer CPU {result['producer_cpu_us_per_msg']} us/msg"
              + (f"; {failed} not acknowledged" if failed else ""))
    return CliExit.OK if not failed else CliExit.FAILED


def bench_worker_main(argv: list[str]) -> int:
    from engine.message import Message
    from engine.status import PutStatus
    from ipc.producer import Producer

    parser = argparse.ArgumentParser(prog="mqstore _bench-worker")
    for name, kind in (("--store", str), ("--batch", int), ("--body-bytes", int),
                       ("--seconds", float), ("--topic", str), ("--start-at", float),
                       ("--inflight", int)):
        parser.add_argument(name, type=kind, required=True)
    args = parser.parse_args(argv)
    body = os.urandom(args.body_bytes)
    batch = [Message(args.topic, body) for _ in range(args.batch)]
    acked = failed = 0
    latencies = []
    with Producer(args.store) as producer:
        time.sleep(max(0.0, args.start_at - time.time()))
        cpu_started = time.process_time()
        started = time.monotonic()
        end = started + args.seconds
        in_flight: collections.deque = collections.deque()
        while time.monotonic() < end or in_flight:
            if time.monotonic() < end and len(in_flight) < args.inflight:
                in_flight.append((time.monotonic(), producer.send_batch_async(batch)))
                continue
            t0, future = in_flight.popleft()
            results = future.result()
            latencies.append((time.monotonic() - t0) * 1000)
            ok = sum(1 for r in results if r.status is PutStatus.PUT_OK)
            acked += ok
            failed += len(results) - ok
        wall = time.monotonic() - started
        cpu = time.process_time() - cpu_started
    print(json.dumps({"acked": acked, "failed": failed, "wall_s": wall, "cpu_s": cpu,
                      "batch_ms": [round(x, 3) for x in latencies]}))
    return 0
