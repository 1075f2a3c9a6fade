"""Delayed delivery on a running store: a burst due at once, the lag under a steady rate, and
the supervisor's memory while messages wait.

    .venv/bin/python -m tools.bench.probes.delay [--burst 100000] [--rate 5000] [--seconds 10]
                                                 [--waiting 1000000] [--runs 3]

- burst: `--burst` messages (level 1, 2 s) are sent in batches of 256 and the store is stopped;
  once all are due it starts again, and the time from READY to the last copy in its topic is
  the figure (all due at once, as after a restart or a long pause);
- lag: `--rate` delayed messages a second (level 1, 1 s) for `--seconds`, in batches of 50 every
  10 ms; each copy's lag is its store time less its due time (the scheduled record's store time
  + 1 s); p50, p99 and max;
- memory: the supervisor's anonymous resident memory (RssAnon: its heap, not the pages of the
  files it maps) as `--waiting` messages (level 2, 1 h) pile up, at each quarter.

Medians of `--runs` for the burst and the lag; the memory walk runs once. Each run uses a new
store under a temporary directory.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from engine.message import Message
from engine.status import GetStatus
from ipc.consumer import Consumer
from ipc.producer import Producer
from tools.store_process import StoreProcess, wait_until, write_store_config

STORE = {"commitlog_file_size": 128 * 1024 * 1024, "queue_count": 4, "message_delay_level": "1s 1h 2s"}
TOPIC = "Bench"


def _start(root: Path) -> StoreProcess:
    config = write_store_config(root.parent / "store.toml", STORE)
    running = StoreProcess(root, config, root.parent / "store.stderr", timeout_s=120.0)
    running.start()
    running.wait_ready()
    return running


def _send(producer: Producer, count: int, level: int, batch: int) -> list:
    results = []
    for first in range(0, count, batch):
        n = min(batch, count - first)
        results += producer.send_batch([Message(TOPIC, b"x" * 100, queue_id=(first + i) % 4,
                                                delay_level=level) for i in range(n)])
    return results


def _copies(root: Path, offsets: dict[int, int], out: list) -> int:
    """Read the topic's new messages into `out` (offsets per queue advanced); how many in all."""
    with Consumer(root, "bench-delay") as consumer:
        for queue_id in range(4):
            while True:
                result = consumer.pull(TOPIC, queue_id, offsets.get(queue_id, 0), 1000)
                if result.status is not GetStatus.FOUND:
                    break
                out += result.messages
                offsets[queue_id] = result.next_offset
    return len(out)


def burst(count: int) -> float:
    """Seconds from READY to the last of `count` messages all due at the start."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        running = _start(root)
        with Producer(root) as producer:
            sent = _send(producer, count, 3, 256)
        assert all(r.ok for r in sent)
        last_due_s = max(r.store_ts_ms for r in sent) / 1000 + 2.0
        running.stop()
        time.sleep(max(0.0, last_due_s - time.time()))  # every message due before the start
        running = _start(root)
        ready = time.monotonic()
        out: list = []
        offsets: dict[int, int] = {}
        wait_until(lambda: _copies(root, offsets, out) >= count, "every copy", 600.0, 0.05)
        elapsed = time.monotonic() - ready
        running.stop()
    return elapsed


def lag(rate: int, seconds: float) -> tuple[float, float, float]:
    """(p50, p99, max) ms of delivery lag past the due time at `rate` messages/s."""
    batch, period_s = 50, 50 / rate
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        running = _start(root)
        due: dict[int, int] = {}
        with Producer(root) as producer:
            next_at = time.monotonic()
            for _ in range(int(rate * seconds / batch)):
                for r in _send(producer, batch, 1, batch):
                    due[r.commit_pos] = r.store_ts_ms + 1000
                next_at += period_s
                time.sleep(max(0.0, next_at - time.monotonic()))
        out: list = []
        offsets: dict[int, int] = {}
        wait_until(lambda: _copies(root, offsets, out) >= len(due), "every copy", 120.0, 0.05)
        running.stop()
    lags = sorted(m.store_ts_ms - due[int(m.properties["DELIVERED_FROM"])] for m in out)
    return lags[len(lags) // 2], lags[int(len(lags) * 0.99)], lags[-1]


def _anonymous_mib(pid: int) -> float:
    """RssAnon of /proc/<pid>/status in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no RssAnon for pid {pid}")


def memory(waiting: int) -> list[tuple[int, float]]:
    """(messages waiting, supervisor RssAnon MiB) at each quarter of `waiting`."""
    points = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        running = _start(root)
        pid = running.proc.pid
        points.append((0, _anonymous_mib(pid)))
        with Producer(root) as producer:
            for quarter in range(1, 5):
                assert all(r.ok for r in _send(producer, waiting // 4, 2, 256))
                running.wait_caught_up()
                time.sleep(1.0)  # a few delivery turns over the waiting queue
                points.append((quarter * waiting // 4, _anonymous_mib(pid)))
        running.stop()
    return points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst", type=int, default=100_000, help="0: skip the burst")
    parser.add_argument("--rate", type=int, default=5000, help="0: skip the lag")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--waiting", type=int, default=1_000_000, help="0: skip the memory walk")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    if args.burst:
        bursts = [burst(args.burst) for _ in range(args.runs)]
        print(f"burst: {args.burst} due at once delivered in {statistics.median(bursts):.2f} s "
              f"(median of {args.runs}: {', '.join(f'{b:.2f}' for b in bursts)})", flush=True)
    if args.rate:
        lags = [lag(args.rate, args.seconds) for _ in range(args.runs)]
        p50, p99, worst = (statistics.median(x[i] for x in lags) for i in range(3))
        print(f"lag at {args.rate}/s for {args.seconds:g} s: p50 {p50:.0f} ms, p99 {p99:.0f} ms, max "
              f"{worst:.0f} ms (medians of {args.runs}; p99s {', '.join(f'{x[1]:.0f}' for x in lags)})",
              flush=True)
    if args.waiting:
        points = memory(args.waiting)
        print("memory: supervisor RssAnon " + ", ".join(f"{n} waiting {mib:.0f} MiB" for n, mib in points),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
