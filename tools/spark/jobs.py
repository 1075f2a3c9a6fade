"""The Spark jobs over a store, as importable functions: export, check, rebuild, stats.

Each takes a SparkSession (make one with `spark_session`, which defaults to local[*]; any
master and Spark configuration work) and a store directory that every executor can read.
`say` receives one line per stage, for progress on the command line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tools.spark.export import ExportMode, ExportResult, export
from tools.spark.fsck import CheckReport, check
from tools.spark.rebuild import RebuildReport, rebuild
from tools.spark.session import configured_master, prepare_worker_env, read_store, spark_session

__all__ = ["CheckReport", "ExportMode", "ExportResult", "RebuildReport", "StatsReport", "check",
           "configured_master", "export", "prepare_worker_env", "read_store", "rebuild", "spark_session",
           "stats"]

Say = Callable[[str], None]


# ------------------------------------------------------------------------------- stats


@dataclass
class StatsReport:
    store: str
    records: int = 0
    bytes: int = 0
    queues: list[dict] = field(default_factory=list)
    topics: list[dict] = field(default_factory=list)
    per_minute: list[dict] = field(default_factory=list)
    size_histogram: list[dict] = field(default_factory=list)
    plot_path: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def stats(spark, store: str | Path, *, plot_path: str | Path | None = None,
          options: Mapping[str, str] | None = None, say: Say = lambda _: None) -> StatsReport:
    """Per topic and queue: counts, bytes, messages per minute, key cardinality, size histogram."""
    from pyspark.sql import functions as F  # noqa: N812

    say(f"stats: scanning {store}")
    df = read_store(spark, str(store), **(options or {})).select(
        "topic", "queue_id", "size", "store_ts", "keys", F.length("body").alias("body_bytes")).persist()
    try:
        report = StatsReport(str(store))
        report.queues = _rows(df.groupBy("topic", "queue_id").agg(
            F.count("*").alias("messages"), F.sum("size").alias("bytes"),
            F.sum("body_bytes").alias("body_bytes")).orderBy("topic", "queue_id"))
        say("stats: topics and key cardinality")
        keys = df.select("topic", F.explode("keys").alias("key")).groupBy("topic").agg(
            F.countDistinct("key").alias("distinct_keys"))
        report.topics = _rows(df.groupBy("topic").agg(
            F.count("*").alias("messages"), F.sum("size").alias("bytes"),
            F.min("store_ts").alias("first_store_ts"), F.max("store_ts").alias("last_store_ts"))
            .join(keys, "topic", "left").fillna(0, ["distinct_keys"]).orderBy("topic"))
        say("stats: messages per minute and sizes")
        report.per_minute = _rows(df.groupBy("topic", F.date_trunc("minute", "store_ts").alias("minute"))
                                  .count().withColumnRenamed("count", "messages").orderBy("minute", "topic"))
        report.size_histogram = _rows(df.groupBy(F.floor(F.log2("size")).cast("int").alias("log2"))
                                      .count().orderBy("log2"))
    finally:
        df.unpersist()
    for row in report.size_histogram:
        row["from_bytes"], row["to_bytes"] = 2 ** row["log2"], 2 ** (row["log2"] + 1)
    report.records = sum(t["messages"] for t in report.topics)
    report.bytes = sum(t["bytes"] for t in report.topics)
    if plot_path is not None:
        report.plot_path = plot_stats(report, plot_path)
    return report


def _rows(df) -> list[dict]:
    return [{k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in r.asDict().items()}
            for r in df.collect()]


def plot_stats(report: StatsReport, path: str | Path) -> str:
    """A PNG: messages per minute per topic, and the record size histogram (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), layout="constrained")
    for topic in sorted({r["topic"] for r in report.per_minute}):
        points = [(r["minute"], r["messages"]) for r in report.per_minute if r["topic"] == topic]
        top.plot([p[0][5:16] for p in points], [p[1] for p in points], marker=".", label=topic)
    top.set_title("messages per minute (store time, UTC)")
    top.tick_params(axis="x", labelrotation=60, labelsize=7)
    top.legend(fontsize=8)
    labels = [f"{_human(r['from_bytes'])}-{_human(r['to_bytes'])}" for r in report.size_histogram]
    bottom.bar(labels, [r["count"] for r in report.size_histogram])
    bottom.set_title("record size (bytes, TOTALSIZE)")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


def _human(n: int) -> str:
    for unit in ("", "Ki", "Mi"):
        if n < 1024:
            return f"{n}{unit}"
        n //= 1024
    return f"{n}Gi"
