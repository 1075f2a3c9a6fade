"""Figures of a bench run: one line per interval, the summary, the side-by-side, the JSON.

Interval line (one per --interval, 5 s by default; rates over the interval, latencies in ms):

    mqstore [   5.0s] pub 14658 msg/s 3.58 MiB/s | pub ms avg 16.6 p50 16.6 p99 43.0 p99.9 50.0
    max 61.0 | cons 14600 msg/s | backlog 58 | e2e ms avg ... max ... | err 0 | lag ms disp 3 idx 5
    | load 6.48                                                      (printed on one line)

`pub` latency runs from each batch's intended send time to its acknowledgement, `e2e` from the
same intended time to the moment a consumer received the message; `backlog` is what the
consumers have yet to read: what their queues held at start (--consume-from start) plus
acknowledged minus consumed messages (warm-up included); `err` counts answers by status name (NOT_SENT:
scheduled at a fixed --rate but never sent before the end, because the producer fell behind).
"""

from __future__ import annotations

import os
import platform
import sys

import numpy as np

from tools.bench.histogram import LatencyHistogram, merged

SCHEMA = "mqstore-bench/1"
MiB = 1024 * 1024
LINE_PERCENTS = (50.0, 99.0, 99.9)
SUMMARY_PERCENTS = (50.0, 90.0, 99.0, 99.9, 99.99)


def _ms(value: float) -> str:
    if value < 1:
        return f"{value:.3f}"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def latency_text(summary: dict, percents=LINE_PERCENTS) -> str:
    if not summary or not summary.get("count"):
        return "-"
    parts = [f"avg {_ms(summary['avg_ms'])}"]
    for percent in percents:
        key = f"p{percent:g}".replace(".", "_") + "_ms"
        parts.append(f"p{percent:g} {_ms(summary[key])}")
    parts.append(f"max {_ms(summary['max_ms'])}")
    return " ".join(parts)


def errors_text(errors: dict[str, int]) -> str:
    if not errors:
        return "0"
    return " ".join(f"{name}={count}" for name, count in sorted(errors.items()))


# ---------------------------------------------------------------------------------- intervals
def interval_figures(k: int, end_s: float, length_s: float, producer_events: list[dict],
                     consumer_events: list[dict], *, backlog_at_start_msgs: int = 0,
                     load_1m: float | None = None, store: dict | None = None
                     ) -> tuple[dict, dict[str, LatencyHistogram]]:
    """One interval's figures from every worker's report of it, plus its merged histograms."""
    hists = {"pub": merged(LatencyHistogram.from_sparse(e["lat"]) for e in producer_events),
             "delay": merged(LatencyHistogram.from_sparse(e["delay"]) for e in producer_events),
             "e2e": merged(LatencyHistogram.from_sparse(e["lat"]) for e in consumer_events)}
    length_s = max(length_s, 1e-9)
    pub_msgs = sum(e["msgs"] for e in producer_events)
    cons_msgs = sum(e["msgs"] for e in consumer_events)
    errors: dict[str, int] = {}
    for event in producer_events + consumer_events:
        for name, count in event["errors"].items():
            errors[name] = errors.get(name, 0) + count
    figures = {
        "k": k, "t_s": round(end_s, 3), "seconds": round(length_s, 3),
        "pub_msgs": pub_msgs, "pub_msgs_per_s": round(pub_msgs / length_s, 1),
        "pub_mib_per_s": round(sum(e["bytes"] for e in producer_events) / length_s / MiB, 3),
        "pub_latency": hists["pub"].summary_ms(), "send_delay": hists["delay"].summary_ms(),
        "cons_msgs": cons_msgs, "cons_msgs_per_s": round(cons_msgs / length_s, 1),
        "cons_mib_per_s": round(sum(e["bytes"] for e in consumer_events) / length_s / MiB, 3),
        "backlog_msgs": (backlog_at_start_msgs + sum(e["cum_msgs"] for e in producer_events)
                         - sum(e["cum_msgs"] for e in consumer_events)),
        "e2e_latency": hists["e2e"].summary_ms(), "errors": errors, "load_1m": load_1m,
        "store": store,
    }
    return figures, hists


def interval_line(label: str, f: dict) -> str:
    """The one-line report of an interval (see the module docstring)."""
    line = (f"{label:<7} [{f['t_s']:>7.1f}s] pub {f['pub_msgs_per_s']:>8.0f} msg/s "
            f"{f['pub_mib_per_s']:>6.2f} MiB/s | pub ms {latency_text(f['pub_latency'])} | "
            f"cons {f['cons_msgs_per_s']:>8.0f} msg/s | backlog {f['backlog_msgs']} | "
            f"e2e ms {latency_text(f['e2e_latency'])} | err {errors_text(f['errors'])}")
    store = f.get("store") or {}
    if store.get("dispatch_lag_ms") is not None:
        line += (f" | lag ms disp {store['dispatch_lag_ms']:.0f} "
                 f"idx {store.get('index_lag_ms') or 0:.0f}")
    if f.get("load_1m") is not None:
        line += f" | load {f['load_1m']:.2f}"
    return line


# ---------------------------------------------------------------------------------- summary
def run_summary(intervals: list[dict], hists: list[dict[str, LatencyHistogram]], workers: list[dict],
                measured_s: float, *, backlog_at_start_msgs: int = 0,
                caught_up_s: float | None = None) -> dict:
    """Whole-run figures: rates over the measured seconds, latencies from merged histograms.
    Consumers that read a backlog and ran out of it before the end (`caught_up_s`, no producers)
    read it at cons_msgs_per_s_until_caught_up: the rate over the whole run is a lower bound.
    (On a store that other programs write to, what they add counts as read backlog too.)"""
    pub, delay, e2e = (merged(h[name] for h in hists) for name in ("pub", "delay", "e2e"))
    errors: dict[str, int] = {}
    for worker in workers:
        for name, count in worker.get("errors_total", {}).items():
            errors[name] = errors.get(name, 0) + count
    measured_s = max(measured_s, 1e-9)
    pub_msgs = sum(i["pub_msgs"] for i in intervals)
    cons_msgs = sum(i["cons_msgs"] for i in intervals)
    sent = sum(w.get("msgs_total", 0) for w in workers if w["role"] == "producer")
    received = sum(w.get("msgs_total", 0) for w in workers if w["role"] == "consumer")
    return {
        "measured_s": round(measured_s, 3),
        "pub_msgs": pub_msgs, "pub_msgs_per_s": round(pub_msgs / measured_s, 1),
        "pub_mib_per_s": round(sum(i["pub_mib_per_s"] * i["seconds"] for i in intervals) / measured_s, 3),
        "pub_latency": pub.summary_ms(SUMMARY_PERCENTS), "send_delay": delay.summary_ms(SUMMARY_PERCENTS),
        "cons_msgs": cons_msgs, "cons_msgs_per_s": round(cons_msgs / measured_s, 1),
        "e2e_latency": e2e.summary_ms(SUMMARY_PERCENTS),
        "sent_total": sent, "received_total": received, "errors": errors,
        "backlog_at_start_msgs": backlog_at_start_msgs, "caught_up_s": caught_up_s,
        "cons_msgs_per_s_until_caught_up": (round(cons_msgs / caught_up_s, 1) if not sent and caught_up_s
                                            and 0 < caught_up_s < measured_s else None),
        "histograms": {"pub": pub.to_sparse(), "e2e": e2e.to_sparse()},
    }


def summarize_samples(samples: list[dict]) -> dict:
    """Lag percentiles, lag growth and per-process RSS first/last/max from status samples."""
    good = [s for s in samples if "error" not in s]
    if not good:
        return {"samples": len(samples)}
    times = np.asarray([s["t_s"] for s in good], dtype=np.float64)
    out: dict = {"samples": len(samples)}
    for name in ("dispatch_lag_ms", "index_lag_ms"):
        if not any(name in s for s in good):
            continue
        values = np.asarray([s.get(name) or 0.0 for s in good], dtype=np.float64)
        slope = float(np.polyfit(times, values, 1)[0]) * 60 if len(good) >= 3 else None
        out[name] = {"p50": round(float(np.percentile(values, 50)), 1),
                     "p99": round(float(np.percentile(values, 99)), 1),
                     "max": round(float(values.max()), 1),
                     "growth_ms_per_min": None if slope is None else round(slope, 2)}
    for key, field in (("rss_bytes", "rss_mib"), ("anon_rss_bytes", "anon_rss_mib")):
        series: dict[str, list[int]] = {}
        for sample in good:
            for name, value in (sample.get(key) or {}).items():
                if value is not None:
                    series.setdefault(name, []).append(value)
        out[field] = {name: {"first": round(v[0] / MiB, 1), "last": round(v[-1] / MiB, 1),
                             "max": round(max(v) / MiB, 1)} for name, v in series.items()}
    first, last = good[0].get("restarts") or {}, good[-1].get("restarts") or {}
    out["restarts"] = {name: last[name] - first.get(name, 0) for name in last
                       if last[name] != first.get(name, 0)}
    return out


def summary_lines(label: str, run: dict) -> list[str]:
    s = run["summary"]
    roles = {w["role"] for w in run["workers"]}
    match = ("no consumers" if "consumer" not in roles else "no producers" if "producer" not in roles else
             "equal: yes" if s["sent_total"] == s["received_total"] else "equal: NO")
    lines = [f"{label} summary: {s['measured_s']:g} s measured after {run['warmup_s']:g} s warm-up, "
             f"load 1m {run['load_before'][0]:.2f} -> {run['load_after'][0]:.2f}",
             f"  publish   {s['pub_msgs_per_s']:>10.0f} msg/s {s['pub_mib_per_s']:>7.2f} MiB/s  "
             f"latency ms {latency_text(s['pub_latency'], SUMMARY_PERCENTS)}",
             "  send delay ms (intended time -> send call) "
             f"{latency_text(s['send_delay'], SUMMARY_PERCENTS)}",
             f"  consume   {s['cons_msgs_per_s']:>10.0f} msg/s  end-to-end ms "
             f"{latency_text(s['e2e_latency'], SUMMARY_PERCENTS)}",
             f"  messages  sent (stored) {s['sent_total']}, received {s['received_total']} "
             f"({match}); errors {errors_text(s['errors'])}"]
    if s.get("backlog_at_start_msgs"):
        lines.append(f"  backlog   {s['backlog_at_start_msgs']} at start; {_caught_up_text(s)}")
    if run.get("peer_counters"):
        counters = sorted(run["peer_counters"].items())
        lines.append("  counters  " + ", ".join(f"{name} {count}" for name, count in counters))
    return lines + store_lines(run.get("store") or {})


def worker_counters(workers: list[dict]) -> dict[str, int]:
    """The endpoints' own counters (e.g. SQLite's busy retries), summed over the workers."""
    total: dict[str, int] = {}
    for worker in workers:
        for name, count in (worker.get("counters") or {}).items():
            total[name] = total.get(name, 0) + count
    return total


def _caught_up_text(s: dict) -> str:
    caught_up_s = s.get("caught_up_s")
    if caught_up_s is None or caught_up_s >= s["measured_s"]:
        return f"not read to its end in the {s['measured_s']:g} s measured"
    if caught_up_s <= 0:
        return "read to its end before the measurement began (nothing of it was measured)"
    text = f"read to its end {caught_up_s:g} s into the measurement"
    if s.get("cons_msgs_per_s_until_caught_up"):
        text += (f", at {s['cons_msgs_per_s_until_caught_up']:.0f} msg/s until then"
                 " (the consume rate over the whole run is a lower bound)")
    return text


def store_lines(store: dict) -> list[str]:
    """Flushes, CPU, lag, restarts and memory of a run (what the sampler saw)."""
    lines = []
    flush = store.get("flush") or {}
    if flush.get("flush_count"):
        lines.append(f"  store     {flush['flush_count']} flushes ({flush['flushes_per_s']:.0f}/s), "
                     f"avg {flush['avg_flush_bytes']:.0f} B = {flush['avg_msgs_per_flush']:.1f} msgs "
                     f"per flush, {flush['avg_record_bytes']:.0f} B per record")
    cpu = store.get("cpu") or {}
    if cpu:
        per_msg = cpu.get("us_per_msg") or {}
        busy = ", ".join(f"{name} {pct:.0f}" + (f" ({per_msg[name]} us/msg)" if per_msg.get(name) else "")
                         for name, pct in cpu["pct_of_one_core"].items())
        lines.append(f"  cpu %     (of one core; {cpu['cores']} cores) machine "
                     f"{cpu['machine_busy_pct']:.0f}, this run {cpu['ours_pct']:.0f}, "
                     f"others {cpu['others_pct']:.0f}: {busy}")
    samples = store.get("samples_summary") or {}
    if samples.get("dispatch_lag_ms"):
        d, i = samples["dispatch_lag_ms"], samples["index_lag_ms"]
        lines.append(f"  lag ms    dispatch p99 {d['p99']} max {d['max']} (growth {d['growth_ms_per_min']}"
                     f"/min); index p99 {i['p99']} max {i['max']} (growth {i['growth_ms_per_min']}/min)")
    restarted = sorted(set(cpu.get("restarted") or ()) | set(samples.get("restarts") or ()))
    if restarted:
        lines.append(f"  RESTARTED during the run (see the store's mqstore.log): {', '.join(restarted)}")
    anon = samples.get("anon_rss_mib") or {}
    for name, rss in (samples.get("rss_mib") or {}).items():
        private = anon.get(name)
        lines.append(f"  rss MiB   {name}: {rss['first']} -> {rss['last']} (max {rss['max']})" + (
            f"; anon {private['first']} -> {private['last']} (max {private['max']})" if private else ""))
    return lines


def comparison(ours: dict, peer: dict) -> dict:
    """mqstore / peer ratios of the headline figures (> 1 means mqstore is higher)."""
    a, b = ours["summary"], peer["summary"]

    def ratio(x: float, y: float) -> float | None:
        return round(x / y, 3) if y else None

    return {"pub_msgs_per_s": ratio(a["pub_msgs_per_s"], b["pub_msgs_per_s"]),
            "cons_msgs_per_s": ratio(a["cons_msgs_per_s"], b["cons_msgs_per_s"]),
            "pub_p50_ms": ratio(a["pub_latency"]["p50_ms"], b["pub_latency"]["p50_ms"]),
            "pub_p99_ms": ratio(a["pub_latency"]["p99_ms"], b["pub_latency"]["p99_ms"]),
            "e2e_p99_ms": ratio(a["e2e_latency"]["p99_ms"], b["e2e_latency"]["p99_ms"])}


def comparison_lines(ours: dict, peer: dict, ratios: dict) -> list[str]:
    a, b = ours["summary"], peer["summary"]
    rows = [("publish msg/s", f"{a['pub_msgs_per_s']:.0f}", f"{b['pub_msgs_per_s']:.0f}", "pub_msgs_per_s"),
            ("pub p99 ms", _ms(a["pub_latency"]["p99_ms"]), _ms(b["pub_latency"]["p99_ms"]), "pub_p99_ms"),
            ("e2e p99 ms", _ms(a["e2e_latency"]["p99_ms"]), _ms(b["e2e_latency"]["p99_ms"]), "e2e_p99_ms"),
            ("consume msg/s", f"{a['cons_msgs_per_s']:.0f}", f"{b['cons_msgs_per_s']:.0f}",
             "cons_msgs_per_s")]
    return [f"mqstore vs {peer['backend']} ({peer.get('peer_setting', '')}), same run:"] + [
        f"  {label:<14} {x:>10} vs {y:>10}  ratio "
        + ("-" if ratios[key] is None else f"{ratios[key]}x") for label, x, y, key in rows]


# ---------------------------------------------------------------------------------- document
def machine_info() -> dict:
    model = ""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next((line.split(":", 1)[1].strip() for line in cpuinfo
                          if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "python": sys.version.split()[0], "load_avg": list(os.getloadavg())}


REQUIRED = {
    "": {"schema": str, "command": str, "machine": dict, "config": dict, "runs": dict},
    "run": {"backend": str, "intervals": list, "summary": dict, "workers": list,
            "load_before": list, "load_after": list},
    "summary": {"pub_msgs_per_s": float, "pub_latency": dict, "cons_msgs_per_s": float,
                "e2e_latency": dict, "sent_total": int, "received_total": int, "errors": dict},
    "interval": {"t_s": float, "pub_msgs_per_s": float, "pub_mib_per_s": float,
                 "pub_latency": dict, "cons_msgs_per_s": float, "backlog_msgs": int,
                 "e2e_latency": dict, "errors": dict},
    "latency": {"count": int, "avg_ms": float, "p50_ms": float, "p99_ms": float,
                "p99_9_ms": float, "max_ms": float},
}


def check_document(doc: dict) -> list[str]:
    """Problems with a bench JSON document (empty when it follows the schema)."""
    problems: list[str] = []

    def need(obj: dict, kind: str, where: str) -> None:
        for key, kind_type in REQUIRED[kind].items():
            value = obj.get(key) if isinstance(obj, dict) else None
            ok = isinstance(value, int | float) and not isinstance(value, bool) \
                if kind_type is float else isinstance(value, kind_type)
            if not ok:
                problems.append(f"{where}.{key}: expected {kind_type.__name__}, got {value!r:.60}")

    need(doc, "", "$")
    if doc.get("schema") != SCHEMA:
        problems.append(f"$.schema: expected {SCHEMA!r}")
    for name, run in (doc.get("runs") or {}).items():
        need(run, "run", f"$.runs.{name}")
        need(run.get("summary", {}), "summary", f"$.runs.{name}.summary")
        for field in ("pub_latency", "e2e_latency"):
            need(run.get("summary", {}).get(field, {}), "latency", f"$.runs.{name}.summary.{field}")
        for i, interval in enumerate(run.get("intervals") or []):
            need(interval, "interval", f"$.runs.{name}.intervals[{i}]")
    return problems
