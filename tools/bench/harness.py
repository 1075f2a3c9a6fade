"""Orchestration of one bench workload: worker processes, interval lines, the run's figures.

    plan = BenchPlan(producers=4, consumers=1, seconds=20, size_bytes=256, batch=64)
    run = run_workload(plan, "mqstore", "/path/to/store", print)

Producers and consumers are separate processes (`python -m tools.bench _worker SPEC`, see
loadgen). The harness waits until each says ready, tells all to go at one CLOCK_MONOTONIC
instant, prints a line per interval once every worker has reported it, and, when the producers
are done, waits until the store has dispatched everything and tells the consumers to drain.
For mqstore it samples `mqstore status` (workers.status_report.collect_status) every interval
and the control block at the start and end of the measurement (flush count and bytes).
Every wait has a deadline; a worker that fails stops the run with its message.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import BadInputError, StoreError
from tools.bench import report
from tools.bench.bench_body import MIN_BODY_BYTES
from tools.bench.store_sampler import StoreSampler
from tools.bench.worker_records import WorkerSpec
from tools.store_process import StoreProcess, StoreProcessError, write_store_config
from workers.child_env import REPO_ROOT, child_env

READY_TIMEOUT_S = 60.0
GO_DELAY_S = 0.5
DRAIN_TIMEOUT_S = 120.0
WORKER_GRACE_S = 60.0
STORE_TIMEOUT_S = 300.0  # start (with recovery) and stop of the bench's own store
SCHEDULE_SPREAD = "spread"  # producer i of P starts its fixed-rate schedule i/P of a batch interval in
SCHEDULE_ALIGNED = "aligned"  # every producer's batch j is due at the same instant (bursts of P batches)
SCHEDULES = (SCHEDULE_ALIGNED, SCHEDULE_SPREAD)


class BenchError(StoreError):
    """The bench could not run or a worker failed."""


@dataclass(frozen=True)
class BenchPlan:
    """The workload, shared by mqstore and the peer."""

    producers: int = 1
    consumers: int = 1
    seconds: float = 20.0
    size_bytes: int = 256
    batch: int = 1
    rate_msgs_per_s: float | None = None  # total over all producers; None = max
    topics: int = 1
    queues: int = 4
    keys: bool = False
    flush: str = "sync"
    warmup_s: float = 2.0
    interval_s: float = 5.0
    inflight: int = 1
    pull_count: int = 1024
    consume_from: str = "end"
    schedule: str = SCHEDULE_ALIGNED  # where each producer's fixed-rate schedule starts

    def __post_init__(self) -> None:
        for name in ("producers", "consumers"):
            if getattr(self, name) < 0:
                raise BadInputError(name, "must be >= 0")
        for name in ("topics", "queues", "batch", "inflight", "pull_count"):
            if getattr(self, name) < 1:
                raise BadInputError(name, "must be >= 1")
        if self.producers + self.consumers == 0:
            raise BadInputError("producers", "need at least one producer or consumer")
        if self.size_bytes < MIN_BODY_BYTES:
            raise BadInputError("size", f"must be >= {MIN_BODY_BYTES} (the timestamp header)")
        if self.seconds <= 0 or self.warmup_s < 0 or self.interval_s <= 0:
            raise BadInputError("seconds", "--seconds and --interval must be > 0, --warmup >= 0")
        if self.rate_msgs_per_s is not None and self.rate_msgs_per_s <= 0:
            raise BadInputError("rate", "must be > 0 or 'max'")
        if self.schedule not in SCHEDULES:
            raise BadInputError("schedule", f"{self.schedule!r} is not one of {', '.join(SCHEDULES)}")
        if self.consumers > self.topics * self.queues:
            raise BadInputError("consumers", f"{self.consumers} consumers but only "
                                f"{self.topics * self.queues} (topic, queue) streams to share")

    @property
    def streams(self) -> list[tuple[str, int]]:
        return [(f"bench-{t}", q) for t in range(self.topics) for q in range(self.queues)]

    def phase_of(self, producer: int) -> float:
        """Where producer `producer`'s schedule starts within one batch interval: spread evenly
        (independent clients do not send in step), or 0 for all (every batch j due at once)."""
        return producer / self.producers if self.schedule == SCHEDULE_SPREAD else 0.0

    def worker_specs(self, backend: str, target: str) -> list[WorkerSpec]:
        common = {"backend": backend, "target": target, "size_bytes": self.size_bytes,
                  "batch": self.batch, "keys": self.keys, "warmup_s": self.warmup_s,
                  "seconds": self.seconds, "interval_s": self.interval_s,
                  "inflight": self.inflight, "pull_count": self.pull_count,
                  "consume_from": self.consume_from, "flush": self.flush}
        rate = self.rate_msgs_per_s / self.producers if self.rate_msgs_per_s and self.producers else None
        streams = self.streams
        specs = [WorkerSpec(role="producer", worker_id=i, streams=tuple(streams),
                            rate_msgs_per_s=rate, phase=self.phase_of(i), **common)
                 for i in range(self.producers)]
        specs += [WorkerSpec(role="consumer", worker_id=j, streams=tuple(streams[j::self.consumers]),
                             **common) for j in range(self.consumers)]
        return specs

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class WorkerProcess:
    """One producer or consumer process; its stdout events go onto a shared queue."""

    def __init__(self, index: int, spec: WorkerSpec, events: queue.Queue):
        self.index, self.spec = index, spec
        self.proc = subprocess.Popen([sys.executable, "-m", "tools.bench", "_worker", spec.to_json()],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=child_env(), cwd=REPO_ROOT)
        self.done: dict | None = None
        self.intervals: dict[int, dict] = {}
        self.backlog_at_start_msgs = 0  # a consumer's, from its ready event
        threading.Thread(target=self._read, args=(events,), daemon=True).start()

    def _read(self, events: queue.Queue) -> None:
        for line in self.proc.stdout:
            try:
                events.put((self.index, json.loads(line)))
            except json.JSONDecodeError:
                events.put((self.index, {"event": "error", "message": line.strip()}))
        events.put((self.index, {"event": "exit", "code": self.proc.wait()}))

    def tell(self, line: str) -> None:
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass

    def finish(self, timeout_s: float) -> None:
        """Close stdin (the worker stops), wait, kill it if it does not."""
        try:
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class _Run:
    """State of one workload while it runs."""

    def __init__(self, plan: BenchPlan, backend: str, out: Callable[[str], None]):
        self.plan, self.backend, self.out = plan, backend, out
        self.events: queue.Queue = queue.Queue()
        self.workers: list[WorkerProcess] = []
        self.intervals: list[dict] = []
        self.hists: list[dict] = []
        self.next_k = 0
        self.start_ns = 0

    @property
    def producers(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.spec.role == "producer"]

    @property
    def consumers(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.spec.role == "consumer"]

    @property
    def backlog_at_start_msgs(self) -> int:
        """Messages the consumers found in their queues at start and read first."""
        return sum(w.backlog_at_start_msgs for w in self.consumers)

    @property
    def caught_up_s(self) -> float | None:
        """Seconds into the measurement when the last consumer first found nothing left of the
        backlog it started with (negative: before the measurement began); None if there was no
        backlog or some consumer never ran out of it."""
        times = [(w.done or {}).get("caught_up_ns") for w in self.consumers]
        if not self.backlog_at_start_msgs or None in times:
            return None
        return round((max(times) - self.start_ns) / 1e9 - self.plan.warmup_s, 3)

    def next_event(self, deadline: float, poll_s: float = 1.0) -> tuple[WorkerProcess, dict]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BenchError("the bench workers did not finish in time")
        try:
            index, event = self.events.get(timeout=max(min(remaining, poll_s), 0.001))
        except queue.Empty:
            return None, {"event": "tick"}
        return self.workers[index], event

    def handle(self, worker: WorkerProcess | None, event: dict, sampler: StoreSampler | None) -> None:
        kind = event["event"]
        if kind == "error" or (kind == "exit" and worker.done is None):
            message = event.get("message") or f"exited with code {event.get('code')}"
            raise BenchError(f"{self.backend} {worker.spec.role} {worker.spec.worker_id} failed: {message}")
        if kind == "interval":
            worker.intervals[event["k"]] = event
        elif kind == "done":
            worker.done = event
        self.maybe_print(sampler)

    def maybe_print(self, sampler: StoreSampler | None) -> None:
        plan = self.plan
        count = self.workers[0].spec.interval_count if self.workers else 0
        while self.next_k < count and all(self.next_k in w.intervals for w in self.workers):
            k = self.next_k
            end_s = min((k + 1) * plan.interval_s, plan.seconds)
            figures, hists = report.interval_figures(
                k, end_s, end_s - k * plan.interval_s,
                [w.intervals[k] for w in self.producers], [w.intervals[k] for w in self.consumers],
                backlog_at_start_msgs=self.backlog_at_start_msgs, load_1m=os.getloadavg()[0],
                store=sampler.latest() if sampler else None)
            self.intervals.append(figures)
            self.hists.append(hists)
            self.out(report.interval_line(self.backend, figures))
            self.next_k += 1


def run_workload(plan: BenchPlan, backend: str, target: str, out: Callable[[str], None], *,
                 store_dir: str | None = None, peer_pid: int | None = None) -> dict:
    """Run the plan against one backend; returns the run's JSON-ready figures."""
    run = _Run(plan, backend, out)
    sampler = StoreSampler(store_dir, plan.interval_s, peer_pid=peer_pid)  # the workers' CPU at least
    load_before = list(os.getloadavg())
    try:
        run.workers = [WorkerProcess(i, spec, run.events)
                       for i, spec in enumerate(plan.worker_specs(backend, target))]
        _wait_ready(run)
        run.start_ns = time.monotonic_ns() + int(GO_DELAY_S * 1e9)
        if sampler:
            sampler.start(run.start_ns, plan.warmup_s, plan.seconds,
                          [w.proc.pid for w in run.workers])
        for worker in run.workers:
            worker.tell(f"go {run.start_ns}")
        offered = (f", {plan.rate_msgs_per_s:g} msg/s offered ({plan.schedule} schedule)"
                   if plan.rate_msgs_per_s and plan.producers else "")
        out(f"{backend}: {plan.producers} producer(s), {plan.consumers} consumer(s){offered}, "
            f"warm-up {plan.warmup_s:g} s, then {plan.seconds:g} s measured")
        _wait_producers(run, sampler)
        _drain_consumers(run, sampler, store_dir)
    finally:
        for worker in run.workers:
            worker.finish(WORKER_GRACE_S if worker.done else 5.0)
        if sampler:
            sampler.stop()
    workers = [{"role": w.spec.role, "id": w.spec.worker_id, "pid": w.proc.pid, **(w.done or {})}
               for w in run.workers]
    summary = report.run_summary(run.intervals, run.hists, workers, plan.seconds,
                                 backlog_at_start_msgs=run.backlog_at_start_msgs, caught_up_s=run.caught_up_s)
    store = sampler.result() if sampler else None
    if store and store.get("cpu"):
        rate = summary["pub_msgs_per_s"] or summary["cons_msgs_per_s"]
        store["cpu"]["us_per_msg"] = {name: round(pct / 100 / rate * 1e6, 2) if rate else None
                                      for name, pct in store["cpu"]["pct_of_one_core"].items()}
    return {"backend": backend, "target": target, "warmup_s": plan.warmup_s,
            "intervals": run.intervals, "summary": summary, "workers": workers,
            "load_before": load_before, "load_after": list(os.getloadavg()), "store": store}


def _wait_ready(run: _Run) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    ready: set[int] = set()
    while len(ready) < len(run.workers):
        worker, event = run.next_event(deadline)
        if event["event"] == "ready":
            ready.add(worker.index)
            worker.backlog_at_start_msgs = int(event.get("backlog_msgs", 0))
        elif event["event"] != "tick":
            run.handle(worker, event, None)


def _wait_producers(run: _Run, sampler: StoreSampler | None) -> None:
    plan = run.plan
    deadline = time.monotonic() + GO_DELAY_S + plan.warmup_s + plan.seconds + WORKER_GRACE_S
    while not all(w.done for w in run.producers):
        worker, event = run.next_event(deadline)
        if event["event"] != "tick":
            run.handle(worker, event, sampler)


def _drain_consumers(run: _Run, sampler: StoreSampler | None, store_dir: str | None) -> None:
    """With producers: once all they stored is visible, consumers drain it. Without (reading a
    backlog): consumers stop when the measured time is over."""
    plan = run.plan
    if not run.producers:
        end_ns = run.start_ns + int((plan.warmup_s + plan.seconds) * 1e9)
        deadline = time.monotonic() + plan.warmup_s + plan.seconds + WORKER_GRACE_S
        while (left_ns := end_ns - time.monotonic_ns()) > 0:
            worker, event = run.next_event(deadline, poll_s=left_ns / 1e9)
            if event["event"] != "tick":
                run.handle(worker, event, sampler)
    elif store_dir and run.consumers:
        _wait_dispatched(store_dir, time.monotonic() + DRAIN_TIMEOUT_S)
    for worker in run.consumers:
        worker.tell("drain" if run.producers else "stop")
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while not all(w.done for w in run.consumers):
        worker, event = run.next_event(deadline)
        if event["event"] != "tick":
            run.handle(worker, event, sampler)
    run.maybe_print(sampler)


def _wait_dispatched(store_dir: str, deadline: float) -> None:
    """Until the dispatcher has passed every acknowledged message (what consumers may read)."""
    from ipc.control_block import ControlBlock

    with ControlBlock.attach(store_dir) as ctl:
        target = ctl.readable_pos
        while ctl.dispatched_pos < target:
            if time.monotonic() > deadline:
                raise BenchError(f"the dispatcher did not reach {target} (at {ctl.dispatched_pos})")
            time.sleep(0.01)


# ---------------------------------------------------------------------------------- the store
class StartedStore:
    """A supervisor on a fresh directory, as the bench's child (tools.store_process); stopped
    (SIGTERM) and the directory removed at the end."""

    def __init__(self, plan: BenchPlan, *, index_shards: int, workdir: str | None, keep: bool,
                 out: Callable[[str], None]):
        import tempfile

        self.plan, self.index_shards, self.keep, self.out = plan, index_shards, keep, out
        self.directory = Path(tempfile.mkdtemp(prefix="mqstore-bench-", dir=workdir))
        self.store_dir = self.directory / "store"
        self.pid: int | None = None
        self.process: StoreProcess | None = None

    def __enter__(self) -> StartedStore:
        config = write_store_config(self.directory / "bench.toml", {
            "queue_count": self.plan.queues, "index_shards": self.index_shards, "flush": self.plan.flush})
        self.process = StoreProcess(self.store_dir, config, self.directory / "supervisor.log",
                                    timeout_s=STORE_TIMEOUT_S)
        self.process.start()
        try:
            self.process.wait_ready()
        except StoreProcessError as exc:  # the directory stays, with the supervisor's log
            self.process.stop()
            raise BenchError(f"mqstore start failed: {exc}",
                             hint=f"the store directory {self.store_dir} was kept for its log") from None
        self.pid = self.process.pid
        self.out(f"started store {self.store_dir} (supervisor pid {self.pid}, flush {self.plan.flush}, "
                 f"{self.index_shards} index shard(s), {self.plan.queues} queue(s))")
        return self

    def __exit__(self, *exc_info) -> None:
        code = self.process.stop()
        if code != 0:
            self.out(f"mqstore stop: the supervisor exited with {code}")
        self._cleanup()

    def _cleanup(self) -> None:
        import shutil

        if self.keep:
            self.out(f"kept the store in {self.store_dir}")
        else:
            shutil.rmtree(self.directory, ignore_errors=True)


def check_running_store(plan: BenchPlan, store_dir: str, flush_given: bool) -> dict:
    """The run info of the store's supervisor, after checking it fits the plan."""
    from ipc.producer import attach_running_store

    ctl, info = attach_running_store(store_dir)  # ServiceNotAvailableError when none runs
    ctl.close()
    if flush_given and info.flush != plan.flush:
        raise BadInputError("flush", f"the store runs with flush {info.flush}; restart it with "
                            f"--flush {plan.flush} or leave --flush out")
    if plan.queues > info.queue_count:
        raise BadInputError("queues", f"the store has {info.queue_count} queues per topic")
    return dataclasses.asdict(info)
