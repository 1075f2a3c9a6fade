"""Samples a running store (or the peer's server) while a bench workload runs.

Every interval: `mqstore status` figures (workers.status_report.collect_status: lag in ms,
RSS and CPU of every store process) plus the RSS of the bench's own workers (psutil), and the
anonymous RSS of all of them (RSS also counts the mapped store files' pages, which grow with
the data touched; RssAnon is the process's own memory). At the
start and the end of the measured window: a control-block snapshot, whose difference gives the
group commit's work -- flushes, flushed bytes, and so average bytes and messages per flush.
"""

from __future__ import annotations

import os
import threading
import time

import psutil

from tools.bench import report
from workers.status_report import anon_rss_bytes

STATUS_SAMPLE_S = 0.2
SAMPLE_LEAD_S = 0.5


class StoreSampler:
    """A background thread; `latest()` feeds interval lines, `result()` the JSON."""

    def __init__(self, store_dir: str | None, interval_s: float, *, peer_pid: int | None = None):
        self.store_dir, self.interval_s, self.peer_pid = store_dir, interval_s, peer_pid
        self.samples: list[dict] = []
        self.flush: dict | None = None
        self._snapshots: list[tuple[int, object]] = []
        self._cpu: list[tuple[int, dict[str, tuple[int, float]], float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._worker_pids: list[int] = []
        self._measure_start_ns = 0

    def start(self, start_ns: int, warmup_s: float, seconds: float, worker_pids: list[int]) -> None:
        self._worker_pids = worker_pids
        self._measure_start_ns = start_ns + int(warmup_s * 1e9)
        measure_end_ns = self._measure_start_ns + int(seconds * 1e9)
        self._thread = threading.Thread(target=self._run, args=(measure_end_ns,), daemon=True)
        self._thread.start()

    def _run(self, measure_end_ns: int) -> None:
        """Snapshot at the measurement's start and end; sample just before each interval ends
        (so the interval's line can show it)."""
        interval_ns = int(self.interval_s * 1e9)
        lead_ns = min(int(SAMPLE_LEAD_S * 1e9), interval_ns // 4)
        if self._sleep_until(self._measure_start_ns):
            return
        self._snapshot()
        end_taken = False
        next_ns = self._measure_start_ns + interval_ns - lead_ns
        while True:
            if not end_taken and next_ns >= measure_end_ns:
                if self._sleep_until(measure_end_ns):
                    return
                self._snapshot()
                end_taken = True
            if self._sleep_until(next_ns):
                return
            self.samples.append(self.sample())
            next_ns += interval_ns

    def _sleep_until(self, when_ns: int) -> bool:
        return self._stop.wait(max(when_ns - time.monotonic_ns(), 0) / 1e9)

    def _snapshot(self) -> None:
        if self._stop.is_set():
            return
        self._cpu.append((time.monotonic_ns(), self._cpu_seconds(), _machine_busy_s()))
        if not self.store_dir:
            return
        from ipc.control_block import ControlBlock

        try:
            with ControlBlock.attach(self.store_dir) as ctl:
                self._snapshots.append((time.monotonic_ns(), ctl.snapshot()))
        except Exception as exc:  # the store went away: say so in the result
            self.flush = {"error": f"{type(exc).__name__}: {exc}"}

    def _processes(self) -> dict[str, int]:
        """name -> pid of the store's processes (or the peer) and the bench workers."""
        pids: dict[str, int] = {}
        if self.store_dir:
            from ipc.control_block import ControlBlock

            try:
                with ControlBlock.attach(self.store_dir) as ctl:
                    for slot in ctl.process_slots():
                        shard = f"[{slot.shard}]" if slot.role.name == "INDEX_BUILDER" else ""
                        pids[slot.role.name.lower() + shard] = slot.pid
            except Exception:
                pass
        if self.peer_pid:
            pids["redis-server"] = self.peer_pid
        pids.update({f"bench-worker-{i}": pid for i, pid in enumerate(self._worker_pids)})
        return pids

    def _cpu_seconds(self) -> dict[str, tuple[int, float]]:
        out = {}
        for name, pid in self._processes().items():
            try:
                times = psutil.Process(pid).cpu_times()
                out[name] = (pid, times.user + times.system)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return out

    def sample(self) -> dict:
        """One status sample (times in s since the measurement started)."""
        t_s = round((time.monotonic_ns() - self._measure_start_ns) / 1e9, 3)
        out: dict = {"t_s": t_s, "load_1m": round(os.getloadavg()[0], 2), "rss_bytes": {}}
        if self.store_dir:
            try:
                out.update(_store_figures(self.store_dir))
            except Exception as exc:
                return {"t_s": t_s, "error": f"{type(exc).__name__}: {exc}"}
        if self.peer_pid:
            out["rss_bytes"]["redis-server"] = _rss(self.peer_pid)
        for i, pid in enumerate(self._worker_pids):
            out["rss_bytes"][f"bench-worker-{i}"] = _rss(pid)
        out["anon_rss_bytes"] = {name: anon_rss_bytes(pid) for name, pid in self._processes().items()}
        return out

    def latest(self) -> dict | None:
        return self.samples[-1] if self.samples else None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def result(self) -> dict:
        if self.flush is None and len(self._snapshots) >= 2:
            self.flush = flush_figures(self._snapshots[0], self._snapshots[-1])
        return {"flush": self.flush, "cpu": cpu_figures(self._cpu), "samples": self.samples,
                "samples_summary": report.summarize_samples(self.samples)}


def cpu_figures(snapshots: list[tuple[int, dict[str, tuple[int, float]], float]]) -> dict | None:
    """CPU use over the measured window, in % of one core: per process, ours in total, and
    the whole machine's (the rest is other people's work on a shared host). A process whose pid
    changed (restarted) is listed under "restarted" instead."""
    if len(snapshots) < 2:
        return None
    (t0, first, busy0), (t1, last, busy1) = snapshots[0], snapshots[-1]
    seconds = max((t1 - t0) / 1e9, 1e-9)
    by_process = {name: round((last[name][1] - first[name][1]) / seconds * 100, 1)
                  for name in last if name in first and last[name][0] == first[name][0]}
    restarted = sorted(name for name in last if name in first and last[name][0] != first[name][0])
    ours = round(sum(by_process.values()), 1)
    machine = round((busy1 - busy0) / seconds * 100, 1)
    return {"seconds": round(seconds, 3), "cores": psutil.cpu_count(), "pct_of_one_core": by_process,
            "ours_pct": ours, "machine_busy_pct": machine, "others_pct": round(max(machine - ours, 0), 1),
            "restarted": restarted}


def _machine_busy_s() -> float:
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def flush_figures(first: tuple[int, object], last: tuple[int, object]) -> dict:
    """Group-commit work between two control-block snapshots."""
    (t0, a), (t1, b) = first, last
    flushes = b.flush_count - a.flush_count
    flushed = b.flushed_pos - a.flushed_pos
    msgs = b.appended_msgs - a.appended_msgs
    written = b.written_pos - a.written_pos
    seconds = max((t1 - t0) / 1e9, 1e-9)
    return {"seconds": round(seconds, 3), "flush_count": flushes, "flushed_bytes": flushed,
            "appended_msgs": msgs, "written_bytes": written,
            "flushes_per_s": round(flushes / seconds, 1),
            "avg_flush_bytes": round(flushed / flushes, 1) if flushes else 0.0,
            "avg_msgs_per_flush": round(msgs / flushes, 2) if flushes else 0.0,
            "avg_record_bytes": round(written / msgs, 1) if msgs else 0.0}


def _store_figures(store_dir: str) -> dict:
    from engine.errors import ServiceNotAvailableError
    from workers.status_report import collect_status

    status = collect_status(store_dir, sample_s=STATUS_SAMPLE_S)
    if not status["running"]:
        raise ServiceNotAvailableError(status["detail"], path=store_dir)
    lag = status["lag_ms"]
    index_lags = [v for v in lag["index"] if v is not None]
    rss, cpu, restarts = {}, {}, {}
    for proc in status["processes"]:
        name = proc["role"] + (f"[{proc['shard']}]" if proc["role"] == "index_builder" else "")
        rss[name], cpu[name], restarts[name] = proc["rss_bytes"], proc["cpu_percent"], proc["restarts"]
    return {"dispatch_lag_ms": lag["dispatch"], "index_lag_ms": max(index_lags, default=None),
            "flush_lag_ms": lag["flush"], "rss_bytes": rss, "cpu_percent": cpu, "restarts": restarts,
            "rates": status["rates"], "flush_stats": status["flush_stats"]}


def _rss(pid: int) -> int | None:
    try:
        return psutil.Process(pid).memory_info().rss
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
