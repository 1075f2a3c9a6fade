"""PNG plots of a bench document (matplotlib, Agg): throughput and latency over time, histogram.

    python -c "import json; from tools.bench import plot; plot.render(json.load(open('r.json')), 'r.png')"
"""

from __future__ import annotations

import numpy as np

from tools.bench.histogram import LatencyHistogram

STYLES = {"mqstore": "-", "redis": "--"}
DPI = 80


def render(doc: dict, path: str) -> None:
    """Three panels: msg/s over time, latency percentiles over time, latency distribution."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (rate_ax, lat_ax, hist_ax) = plt.subplots(3, 1, figsize=(9, 10))
    for name, run in doc["runs"].items():
        _plot_rates(rate_ax, name, run)
        _plot_latency(lat_ax, name, run)
        _plot_histogram(hist_ax, name, run)
    config = doc.get("config", {})
    fig.suptitle(f"{config.get('producers')} producers, {config.get('size_bytes')} B, batch "
                 f"{config.get('batch')}, rate {config.get('rate_msgs_per_s') or 'max'}, flush "
                 f"{config.get('flush')}; load {doc['machine']['load_avg'][0]:.1f}", fontsize=10)
    rate_ax.set(ylabel="msg/s", title="throughput per interval")
    lat_ax.set(ylabel="ms", yscale="log", title="latency percentiles per interval")
    hist_ax.set(xlabel="latency ms", ylabel="share of messages", xscale="log",
                title="latency distribution (whole run)")
    for ax in (rate_ax, lat_ax, hist_ax):
        ax.grid(True, alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=7)
    lat_ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    lat_ax.set_xlabel("seconds")
    rate_ax.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _plot_rates(ax, name: str, run: dict) -> None:
    t = [i["t_s"] for i in run["intervals"]]
    style = STYLES.get(name, ":")
    ax.plot(t, [i["pub_msgs_per_s"] for i in run["intervals"]], style, marker="o", label=f"{name} publish")
    if any(i["cons_msgs_per_s"] for i in run["intervals"]):
        ax.plot(t, [i["cons_msgs_per_s"] for i in run["intervals"]], style, marker="x",
                label=f"{name} consume")


def _plot_latency(ax, name: str, run: dict) -> None:
    t = [i["t_s"] for i in run["intervals"]]
    style = STYLES.get(name, ":")
    for kind, label in (("pub_latency", "pub"), ("e2e_latency", "e2e")):
        if not any(i[kind]["count"] for i in run["intervals"]):
            continue
        for key in ("p50_ms", "p99_ms", "p99_9_ms"):
            values = [max(i[kind][key], 1e-3) for i in run["intervals"]]
            ax.plot(t, values, style, marker=".", label=f"{name} {label} {key[:-3].replace('_', '.')}")


def _plot_histogram(ax, name: str, run: dict) -> None:
    for kind in ("pub", "e2e"):
        hist = LatencyHistogram.from_sparse(run["summary"]["histograms"][kind])
        if hist.count == 0:
            continue
        values_ns, counts = hist.nonzero_buckets()
        values_ms = np.maximum(values_ns / 1e6, 1e-3)
        bins = np.logspace(np.log10(values_ms.min()) - 0.05, np.log10(values_ms.max()) + 0.05, 60)
        shares, edges = np.histogram(values_ms, bins=bins, weights=counts / hist.count)
        ax.step(edges[:-1], shares, where="post", linestyle=STYLES.get(name, ":"),
                label=f"{name} {kind}")


def backend_names(rows: list[dict]) -> set[str]:
    """The backends measured in tools.bench.sweep.medians' `rows` (the cells that hold a
    median rate; `ratios` is not one)."""
    return {name for row in rows for name, cell in row.items()
            if isinstance(cell, dict) and "msgs_per_s" in cell}


def render_scaling(rows: list[dict], path: str, *, x_label: str, load_1m: float | None = None,
                   x_log: bool = True) -> None:
    """Median publish rate and p99 per x value (e.g. producers, body bytes): `rows` as
    tools.bench.sweep.medians makes them (value, and per backend msgs_per_s and p99_ms)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate_ax, lat_ax) = plt.subplots(2, 1, figsize=(8, 7))
    rows = sorted(rows, key=lambda row: row["value"])
    backends = sorted(backend_names(rows))
    for name in backends:
        xs = [row["value"] for row in rows if name in row]
        rate_ax.plot(xs, [row[name]["msgs_per_s"] for row in rows if name in row], STYLES.get(name, ":"),
                     marker="o", label=f"{name} publish msg/s")
        lat_ax.plot(xs, [row[name]["p99_ms"] for row in rows if name in row], STYLES.get(name, ":"),
                    marker="o", label=f"{name} publish p99 ms")
    load = f" (median load {load_1m:.1f})" if load_1m is not None else ""
    rate_ax.set(ylabel="msg/s (median of runs)", title=f"publish rate vs {x_label}{load}")
    lat_ax.set(ylabel="ms", xlabel=x_label, yscale="log", title="publish latency p99")
    for ax in (rate_ax, lat_ax):
        if x_log:
            ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
