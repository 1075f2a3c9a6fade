"""Consumer groups (issue 35): how fast the members of one group drain a backlog together,
each queue read once, and how soon a killed member's queues are read again by the survivor.

    .venv/bin/python -m tools.bench.probes.group_consume [--messages 2000000] [--members 4]
        [--kills 20] [--runs 3]

A fresh store (8 queues, flush sync) gets `--messages` 64-byte messages; then per run a new
group of `--members` forked member processes, settled on their queues, drains the backlog
with `assignment` + `pull_columns` (4096 a pull; offsets committed at the end): the rate is
the backlog over the time from "go" to the last member done. Then per run `--kills` rounds:
a second member joins beside a long-lived one, is SIGKILLed once the queues are split, and
the time to the survivor's first pull of each queue it gains is taken. Prints medians of the
runs (rate) and the median, p99 and max of every hand-over.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from ipc.consumer import MAX_PULL_COUNT, Consumer
from ipc.group_roster import live_members
from ipc.producer import Producer
from tools.store_process import StoreProcess, wait_until, write_store_config

TOPIC = "GroupBench"
QUEUES = 8
SEND_CHUNK = 8192
BODY = b"x" * 64


def fill(root: Path, messages: int) -> None:
    """`messages` bodies round robin over the queues, then wait until all are dispatched."""
    with Producer(root) as producer:
        for start in range(0, messages, SEND_CHUNK):
            result = producer.send_columns(TOPIC, [BODY] * min(SEND_CHUNK, messages - start))
            if not result.ok:
                raise RuntimeError("a send of the backlog failed")
    with Consumer(root, "bench-probe") as probe:
        wait_until(lambda: sum(probe.pull_columns(TOPIC, q, 1 << 62, max_count=1).max_offset
                               for q in range(QUEUES)) == messages, "the backlog dispatched", 300)


def _drain_member(root: Path, group: str, go_r: int, done_w: int) -> None:
    """A member process: rebalance until go (the parent saw the group settled), drain its
    queues, report."""
    with Consumer(root, group) as consumer:
        while not select.select([go_r], [], [], 0.01)[0]:
            consumer.assignment(TOPIC)
        os.read(go_r, 1)
        cpu_s = time.process_time()
        count = 0
        offsets = dict.fromkeys(consumer.assignment(TOPIC), 0)
        while offsets:
            for queue_id in list(offsets):
                got = consumer.pull_columns(TOPIC, queue_id, offsets[queue_id], max_count=MAX_PULL_COUNT)
                count += got.count
                if got.next_offset == offsets[queue_id]:
                    consumer.commit(TOPIC, queue_id, got.next_offset)
                    del offsets[queue_id]
                else:
                    offsets[queue_id] = got.next_offset
        cpu_ns = int((time.process_time() - cpu_s) * 1e9)
        os.write(done_w, f"{count} {time.monotonic_ns()} {cpu_ns}\n".encode())


def drain_rate(root: Path, group: str, members: int, messages: int) -> tuple[float, float]:
    """Messages a second of `members` forked members of `group` draining the backlog, and
    their CPU time per message (us), which the machine's other load does not change."""
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    pids = []
    for _ in range(members):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _drain_member(root, group, go_r, done_w)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    share = [QUEUES // members + (i < QUEUES % members) for i in range(members)]
    _wait_settled(root, group, sorted(share))
    go_ns = time.monotonic_ns()
    os.write(go_w, b"g" * members)
    reports = []
    with os.fdopen(done_r) as done:
        for _ in range(members):
            reports.append(tuple(map(int, done.readline().split())))
    for pid in pids:
        os.waitpid(pid, 0)
    for fd in (go_r, go_w, done_w):
        os.close(fd)
    if sum(count for count, _, _ in reports) != messages:
        raise RuntimeError(f"the members read {sum(r[0] for r in reports)} of {messages}: a queue twice?")
    cpu_us = sum(cpu_ns for _, _, cpu_ns in reports) / messages / 1000
    return messages / ((max(end for _, end, _ in reports) - go_ns) / 1e9), cpu_us


def _survivor(root: Path, group: str, report_w: int) -> None:
    """The long-lived member: sweeps its share and reports when it first pulls a queue it gained."""
    with Consumer(root, group) as consumer:
        owned: set[int] = set()
        while True:
            now_owned = set(consumer.assignment(TOPIC))
            for queue_id in sorted(now_owned - owned):
                consumer.pull_columns(TOPIC, queue_id, 1 << 62, max_count=1)  # served: a read of it
            if now_owned - owned:
                os.write(report_w, f"{len(now_owned)} {time.monotonic_ns()}\n".encode())
            owned = now_owned
            consumer.wait_for_more(consumer.dispatched_pos, 20)


def _joiner(root: Path, group: str) -> None:
    with Consumer(root, group) as consumer:
        while True:
            consumer.assignment(TOPIC)
            consumer.wait_for_more(consumer.dispatched_pos, 20)


def hand_over_times_ms(root: Path, group: str, kills: int) -> list[float]:
    """Per kill: ms from SIGKILL of the second member to the survivor's pull of all queues."""
    report_r, report_w = os.pipe()
    survivor = os.fork()
    if survivor == 0:
        _survivor(root, group, report_w)
        os._exit(0)
    reports = os.fdopen(report_r)
    times = []
    try:
        _wait_report(reports, QUEUES)
        for _ in range(kills):
            joiner = os.fork()
            if joiner == 0:
                try:
                    _joiner(root, group)
                finally:
                    os._exit(0)
            _wait_settled(root, group, [QUEUES // 2, QUEUES // 2])
            killed_ns = time.monotonic_ns()
            os.kill(joiner, signal.SIGKILL)
            served_ns = _wait_report(reports, QUEUES)
            os.waitpid(joiner, 0)
            times.append((served_ns - killed_ns) / 1e6)
    finally:
        os.kill(survivor, signal.SIGKILL)
        os.waitpid(survivor, 0)
        reports.close()
        os.close(report_w)
    return times


def _wait_report(reports, owned_count: int) -> int:
    """The time of the survivor's next report that it owns `owned_count` queues."""
    while True:
        count, at_ns = map(int, reports.readline().split())
        if count == owned_count:
            return at_ns


def _wait_settled(root: Path, group: str, shares: list[int]) -> None:
    """Until the group's live members own `shares` queues (sorted counts)."""
    wait_until(lambda: sorted(len(m.queue_ids) for m in live_members(root, group, TOPIC)) == shares,
               f"the members own {shares} queues", 60, 0.005)


def main(argv: list[str] | None = None) -> dict:
    """Run the probe, print its two lines, return the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", help="where the probe's temporary store goes (default: the system's)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mqstore-group-probe-", dir=args.dir) as directory:
        root = Path(directory) / "store"
        config = write_store_config(Path(directory) / "probe.toml", {"queue_count": QUEUES})
        store = StoreProcess(root, config, Path(directory) / "supervisor.log", timeout_s=120)
        store.start()
        try:
            store.wait_ready()
            fill(root, args.messages)
            drains = [drain_rate(root, f"drain{run}", args.members, args.messages)
                      for run in range(args.runs)]
            rates = [rate for rate, _ in drains]
            print(f"{args.members} members drain {args.messages} messages: "
                  f"{statistics.median(rates):,.0f} msg/s (median of {args.runs}: "
                  f"{', '.join(f'{r:,.0f}' for r in rates)}); consumer CPU "
                  f"{statistics.median(cpu for _, cpu in drains):.2f} us/msg; load average "
                  f"{os.getloadavg()[0]:.1f}")
            times = [t for run in range(args.runs)
                     for t in hand_over_times_ms(root, f"kill{run}", args.kills)]
            print(f"hand-over after SIGKILL over {len(times)} kills: median "
                  f"{statistics.median(times):.0f} ms, p99 {np.percentile(times, 99):.0f} ms, "
                  f"max {max(times):.0f} ms")
        finally:
            store.stop()
    return {"drain_msgs_per_s": statistics.median(rates),
            "cpu_us_per_msg": statistics.median(cpu for _, cpu in drains),
            "hand_over_ms": times, "hand_over_p99_ms": float(np.percentile(times, 99))}


if __name__ == "__main__":
    main()
