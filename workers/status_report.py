"""`mqstore status`: what a running store is doing, from its control block and psutil.

Two snapshots of the control block `sample_s` apart give rates (messages appended and
dispatched per second, flushes per second) and each process's CPU use; lags are reported in
bytes (position differences) and in milliseconds (the age of the oldest record the structure
has not processed yet, read from its STORETIMESTAMP). Restart history comes from
run/supervisor.json.

A store with no running supervisor is STOPPED (no shared memory: cleanly stopped, recovered, or
never started) or STALE (a dead supervisor's shared memory is still there; the next `start` or
`recover` removes it). The supervisor counts as gone when the store lock is not held by the pid
its control block names: the lock dies with the process, and a reused pid cannot hold it.
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from engine.errors import ServiceNotAvailableError, StoreError
from engine.files.mapped_file import Access
from engine.files.naming import ABORT_FILE
from engine.files.store_dir import StoreKind, holder_pid, inspect_store_dir, read_meta
from engine.formats.record import V4_HEADER_SIZE, store_ts_at
from engine.log.commitlog import CommitLog
from engine.log.walker import is_filler_head
from ipc.control_block import ControlBlock, Positions, ProcessSlot
from ipc.offsets_fallbacks import read_fallbacks
from ipc.put_latency import LatencyHistogram
from ipc.refused_offsets import read_refused
from ipc.run_info import read_run_info
from workers.retention_status import describe_retention, render_retention

DEFAULT_SAMPLE_S = 0.5
STOPPED = "STOPPED"
STALE = "STALE"
NOT_RUNNING_STATES = (STOPPED, STALE)


def collect_status(store_dir: str | Path, *, sample_s: float = DEFAULT_SAMPLE_S) -> dict:
    """A JSON-ready description of the store: a running one's processes and positions, or a
    STOPPED / STALE one's state and why it is not running."""
    root = Path(store_dir)
    kind = inspect_store_dir(root)  # a file or a foreign directory is refused, not "stopped"
    if kind is StoreKind.NEW:
        return not_running_status(root, STOPPED, "not running: there is no store here yet")
    if kind is StoreKind.ROCKETMQ:
        return not_running_status(root, STOPPED, "not running: a RocketMQ-written store, "
                                                 "which mqstore only reads")
    try:
        ctl = ControlBlock.attach(root)
    except ServiceNotAvailableError:
        return _stopped(root)
    if holder_pid(root) != ctl.supervisor_pid:
        pid, generation = ctl.supervisor_pid, ctl.generation
        ctl.close()
        return not_running_status(
            root, STALE, f"not running: supervisor pid {pid} (generation {generation}) is gone "
            "and left its shared memory; `mqstore start` or `mqstore recover` removes it",
            supervisor_pid=pid, generation=generation)
    try:
        info = read_run_info(root, ctl.supervisor_pid)
        slots = ctl.process_slots()
        procs = {slot.pid: _process(slot.pid) for slot in slots}
        for proc in procs.values():
            if proc is not None:
                _cpu(proc)
        first, t0 = ctl.snapshot(), time.monotonic()
        time.sleep(sample_s)
        second, t1 = ctl.snapshot(), time.monotonic()
        elapsed = max(t1 - t0, 1e-6)
        processes = [_describe_slot(slot, procs.get(slot.pid)) for slot in ctl.process_slots()]
        state = ctl.store_state.name
        sync = ctl.flush_policy.value == "sync"
        retention = describe_retention(root, ctl)
        put_statuses = {status.name: count for status, count in ctl.put_status_counts().items()}
        put_latency = describe_put_latency(ctl.put_latency())
    finally:
        ctl.close()
    p = second
    limit = p.flushed_pos if sync else p.written_pos
    lag_ms = _lag_ms(root, p, limit)
    return {
        "store": str(root.resolve()),
        "state": state,
        "running": True,
        "supervisor_pid": info.supervisor_pid,
        "generation": info.generation,
        "flush": info.flush,
        "index_shards": info.index_shards,
        "processes": processes,
        "positions": {
            "written": p.written_pos, "flushed": p.flushed_pos, "dispatched": p.dispatched_pos,
            "cq_durable": p.cq_durable_pos, "indexed": list(p.shard_processed_pos),
            "index_durable": list(p.shard_durable_pos),
        },
        "lag_bytes": {
            "flush": p.written_pos - p.flushed_pos,
            "dispatch": max(limit - p.dispatched_pos, 0),
            "index": [max(limit - pos, 0) for pos in p.shard_processed_pos],
        },
        "lag_ms": lag_ms,
        "flush_stats": {
            "count": p.flush_count, "last_latency_ms": p.last_flush_latency_ns / 1e6,
            "last_bytes": p.last_flush_bytes, **_flush_window(first, second),
        },
        "rates": {
            "append_msgs_per_s": (second.appended_msgs - first.appended_msgs) / elapsed,
            "dispatch_msgs_per_s": (second.dispatched_msgs - first.dispatched_msgs) / elapsed,
            "flushes_per_s": (second.flush_count - first.flush_count) / elapsed,
            "append_bytes_per_s": (second.written_pos - first.written_pos) / elapsed,
        },
        "totals": {"appended_msgs": p.appended_msgs, "dispatched_msgs": p.dispatched_msgs},
        "put_statuses": put_statuses,
        "put_latency": put_latency,
        "restart_history": info.restart_history,
        "retention": retention,
        "offset_fallbacks": describe_offset_fallbacks(root),
        "refused_offsets": count_refused_offsets(root),
    }


def describe_offset_fallbacks(root: Path) -> dict:
    """How often a torn consumerOffset.json was replaced by its backup (ipc.offsets_fallbacks);
    a garbled record is reported as such rather than fail the whole status."""
    try:
        return read_fallbacks(root).as_dict()
    except StoreError as exc:
        return {"count": None, "unreadable": str(exc)}


def count_refused_offsets(root: Path) -> int | None:
    """How many committed offsets are refused until reset (ipc.refused_offsets); None when
    the record is garbled (a consumer reading it says why)."""
    try:
        return len(read_refused(root))
    except StoreError:
        return None


def render_refused_offsets(count: int | None) -> str | None:
    """The status line of the refused offsets, None when there are none."""
    if count == 0:
        return None
    if count is None:
        return "consumer offsets: the refused-offsets record is unreadable"
    return f"consumer offsets: {count} refused until reset (`mqstore lag` marks them)"


def render_offset_fallbacks(fallbacks: dict) -> str:
    """The status line of the offset fallbacks."""
    if fallbacks["count"] is None:
        return f"consumer offsets: fallback record unreadable: {fallbacks['unreadable']}"
    if not fallbacks["count"]:
        return "consumer offsets: never replaced by their backup"
    return (f"consumer offsets: replaced by their backup {fallbacks['count']} time(s), last at "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(fallbacks['last_at_ms'] / 1000))}: "
            f"{fallbacks['last_reason']} (bad file kept as {fallbacks['last_kept_as'] or '-'})")


def describe_put_latency(histogram: LatencyHistogram) -> dict:
    """The put latency counters as JSON: requests answered, their total time, p50/p99 (None
    before the first answer) and the cumulative buckets the exporter serves."""
    def ms(q: float) -> float | None:
        value_s = histogram.quantile_s(q)
        return None if value_s is None else round(value_s * 1000, 3)
    return {"count": histogram.count, "sum_s": histogram.sum_ns / 1e9,
            "p50_ms": ms(0.5), "p99_ms": ms(0.99),
            "buckets": [{"le_s": le_s, "count": count} for le_s, count in histogram.cumulative()]}


def not_running_status(root: Path, state: str, detail: str, **extra) -> dict:
    """The status of a store no supervisor runs (state STOPPED or STALE)."""
    return {"store": str(root.resolve()), "state": state, "running": False, "detail": detail,
            "clean_stop": not (root / ABORT_FILE).exists(),
            "offset_fallbacks": describe_offset_fallbacks(root),
            "refused_offsets": count_refused_offsets(root), **extra}


def _stopped(root: Path) -> dict:
    if (root / ABORT_FILE).exists():
        return not_running_status(root, STOPPED, "not running: the last run did not stop "
                                                 "cleanly, so the next start runs recovery")
    return not_running_status(root, STOPPED, "not running: the store was stopped cleanly")


def render_not_running(status: dict) -> str:
    """The human-readable form of a STOPPED or STALE status."""
    line = f"store {status['store']}: {status['state']}, {status['detail']}"
    fallbacks = status.get("offset_fallbacks")
    if fallbacks and fallbacks["count"] != 0:
        line += "\n" + render_offset_fallbacks(fallbacks)
    refused = render_refused_offsets(status.get("refused_offsets", 0))
    if refused:
        line += "\n" + refused
    return line


def _flush_window(first: Positions, second: Positions) -> dict:
    """Average group-commit batch over the sample window (0 when no flush happened in it)."""
    flushes = second.flush_count - first.flush_count
    if flushes <= 0:
        return {"window_bytes_per_flush": 0.0, "window_msgs_per_flush": 0.0}
    return {"window_bytes_per_flush": round((second.flushed_pos - first.flushed_pos) / flushes, 1),
            "window_msgs_per_flush": round((second.appended_msgs - first.appended_msgs) / flushes, 2)}


def anon_rss_bytes(pid: int) -> int | None:
    """RssAnon of /proc/<pid>/status: private memory, without the mapped store files (whose
    pages count in RSS as soon as a process touches them)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cpu_seconds(proc: psutil.Process) -> float | None:
    try:
        times = proc.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return round(times.user + times.system, 3)


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _cpu(proc: psutil.Process) -> float | None:
    try:
        return proc.cpu_percent(None)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _describe_slot(slot: ProcessSlot, proc: psutil.Process | None) -> dict:
    alive = proc is not None and proc.is_running()
    rss = None
    if alive:
        try:
            rss = proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            alive = False
    return {
        "role": slot.role.name.lower(),
        "shard": slot.shard,
        "pid": slot.pid,
        "state": slot.state.name.lower() if alive else "gone",
        "uptime_s": round(max(time.time_ns() - slot.started_ns, 0) / 1e9, 3),
        "restarts": slot.restarts,
        "rss_bytes": rss,
        "rss_anon_bytes": anon_rss_bytes(slot.pid) if alive else None,
        "cpu_percent": _cpu(proc) if alive else None,
        "cpu_seconds": _cpu_seconds(proc) if alive else None,
        "heartbeat_age_ms": round(max(time.monotonic_ns() - slot.heartbeat_ns, 0) / 1e6, 1),
    }


def _lag_ms(root: Path, p: Positions, limit: int) -> dict:
    """Age of the oldest record not yet flushed / dispatched / indexed (0 when caught up)."""
    now_ms = time.time_ns() // 1_000_000
    try:
        commitlog = CommitLog.open(root, read_meta(root).commitlog_file_size, Access.READ_ONLY)
    except (StoreError, OSError):
        return {"flush": None, "dispatch": None, "index": [None] * len(p.shard_processed_pos)}
    try:
        def age(pos: int, end: int) -> float | None:
            if pos >= end:
                return 0.0
            ts = _store_ts(commitlog, pos)
            return None if ts is None else float(max(now_ms - ts, 0))

        return {"flush": age(p.flushed_pos, p.written_pos),
                "dispatch": age(p.dispatched_pos, limit),
                "index": [age(pos, limit) for pos in p.shard_processed_pos]}
    finally:
        commitlog.close()


def _store_ts(commitlog: CommitLog, pos: int) -> int | None:
    try:
        window = commitlog.window_at(pos)
        if window is not None and is_filler_head(window, pos):
            pos = window.segment_end_pos
        return store_ts_at(commitlog.read_bytes(pos, V4_HEADER_SIZE), 0)
    except (StoreError, ValueError):
        return None


def render_status(status: dict) -> str:
    """The human-readable form of collect_status()."""
    if status["state"] in NOT_RUNNING_STATES:
        return render_not_running(status)
    pos, lag_b, lag_ms = status["positions"], status["lag_bytes"], status["lag_ms"]
    rates, flush = status["rates"], status["flush_stats"]
    lines = [f"store {status['store']}: {status['state']} (supervisor pid {status['supervisor_pid']}, "
             f"generation {status['generation']}, flush {status['flush']})", "",
             f"{'role':<16}{'pid':>8}{'state':>10}{'uptime':>10}{'restarts':>10}{'rss MiB':>10}"
             f"{'anon MiB':>10}{'cpu %':>8}{'cpu s':>9}{'beat ms':>9}"]
    for proc in status["processes"]:
        role = proc["role"] + (f"[{proc['shard']}]" if proc["role"] == "index_builder" else "")
        rss = "-" if proc["rss_bytes"] is None else f"{proc['rss_bytes'] / 2**20:.1f}"
        anon = "-" if proc["rss_anon_bytes"] is None else f"{proc['rss_anon_bytes'] / 2**20:.1f}"
        cpu = "-" if proc["cpu_percent"] is None else f"{proc['cpu_percent']:.0f}"
        cpu_s = "-" if proc["cpu_seconds"] is None else f"{proc['cpu_seconds']:.1f}"
        lines.append(f"{role:<16}{proc['pid']:>8}{proc['state']:>10}{proc['uptime_s']:>9.0f}s"
                     f"{proc['restarts']:>10}{rss:>10}{anon:>10}{cpu:>8}{cpu_s:>9}"
                     f"{proc['heartbeat_age_ms']:>9.0f}")
    fmt_ms = lambda v: "?" if v is None else f"{v:.0f} ms"  # noqa: E731
    lines += ["", f"written    {pos['written']:>16}",
              f"flushed    {pos['flushed']:>16}   lag {lag_b['flush']} B, {fmt_ms(lag_ms['flush'])}",
              f"dispatched {pos['dispatched']:>16}   lag {lag_b['dispatch']} B, "
              f"{fmt_ms(lag_ms['dispatch'])}   (durable {pos['cq_durable']})"]
    for shard, indexed in enumerate(pos["indexed"]):
        label = f"indexed[{shard}]"
        lines.append(f"{label:<11}{indexed:>16}   lag {lag_b['index'][shard]} B, "
                     f"{fmt_ms(lag_ms['index'][shard])}   (durable {pos['index_durable'][shard]})")
    lines += ["", f"append {rates['append_msgs_per_s']:.0f} msg/s "
                  f"({rates['append_bytes_per_s'] / 2**20:.1f} MiB/s), dispatch "
                  f"{rates['dispatch_msgs_per_s']:.0f} msg/s, {rates['flushes_per_s']:.0f} flushes/s, "
                  f"last flush {flush['last_latency_ms']:.2f} ms ({flush['last_bytes']} B), "
                  f"{flush['window_msgs_per_flush']:.1f} msgs = {flush['window_bytes_per_flush']:.0f} B "
                  f"per flush"]
    failed = {name: n for name, n in status["put_statuses"].items() if n and name != "PUT_OK"}
    lines.append(f"answers since start: {status['put_statuses']['PUT_OK']} PUT_OK" + "".join(
        f", {n} {name}" for name, n in failed.items()))
    latency = status["put_latency"]
    if latency["count"]:
        lines.append(f"put latency over {latency['count']} requests: p50 {latency['p50_ms']:.2f} ms, "
                     f"p99 {latency['p99_ms']:.2f} ms")
    lines += render_retention(status["retention"])
    lines.append(render_offset_fallbacks(status["offset_fallbacks"]))
    refused = render_refused_offsets(status["refused_offsets"])
    if refused:
        lines.append(refused)
    history = status["restart_history"]
    lines.append("")
    lines.append(f"restart history: {len(history)} event(s)" if history else "restart history: none")
    for event in history[-10:]:
        when = time.strftime("%H:%M:%S", time.localtime(event["at"]))
        lines.append(f"  {when} {event['role']}[{event['shard']}] pid {event['pid']}: {event['what']}")
    return "\n".join(lines)
