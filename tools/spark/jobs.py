"""The Spark jobs over a store, as importable functions: export, check, rebuild, stats.

Each takes a SparkSession (make one with `spark_session`, which defaults to local[*]; any
master and Spark configuration work) and a store directory that every executor can read.
`say` receives one line per stage, for progress on the command line.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tools.spark.fsck import CheckReport, check
from tools.spark.rebuild import RebuildReport, rebuild
from tools.spark.source import register

__all__ = ["CheckReport", "ExportResult", "RebuildReport", "StatsReport", "check", "export", "read_store",
           "rebuild", "spark_session", "stats"]

Say = Callable[[str], None]
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONF = {"spark.sql.session.timeZone": "UTC", "spark.ui.showConsoleProgress": "true"}


def prepare_worker_env() -> None:
    """Python workers must run this interpreter and import mqstore's packages."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(REPO_ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *paths])


def configured_master() -> str | None:
    """spark.master from the usual configuration (MASTER, spark-defaults.conf), if any."""
    if os.environ.get("MASTER"):
        return os.environ["MASTER"]
    conf_dirs = [os.environ.get("SPARK_CONF_DIR"), os.environ.get("SPARK_HOME") and
                 os.path.join(os.environ["SPARK_HOME"], "conf")]
    for conf_dir in filter(None, conf_dirs):
        path = Path(conf_dir) / "spark-defaults.conf"
        lines = path.read_text().splitlines() if path.is_file() else []
        for line in lines:
            parts = line.split(None, 1)
            if len(parts) == 2 and parts[0] == "spark.master":
                return parts[1].strip()
    return None


def spark_session(master: str | None = None, conf: Mapping[str, str] | None = None,
                  app_name: str = "mqstore"):
    """A SparkSession with format("mqstore") available; `conf` wins over the defaults. The
    master is `master`, else the configured spark.master, else local[*]."""
    from pyspark.sql import SparkSession

    prepare_worker_env()
    builder = SparkSession.builder.appName(app_name)
    if master or not configured_master():
        builder = builder.master(master or "local[*]")
    for key, value in {**DEFAULT_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark


def read_store(spark, store: str, **options: str):
    """spark.read.format("mqstore") with `options` (see tools.spark.source)."""
    register(spark)
    return spark.read.format("mqstore").options(**options).load(str(store))


# ------------------------------------------------------------------------------ export


@dataclass
class ExportResult:
    path: str
    format: str
    rows: int
    partitions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def export(spark, store: str | Path, to: str | Path, *, fmt: str = "parquet", mode: str = "errorifexists",
           options: Mapping[str, str] | None = None, say: Say = lambda _: None) -> ExportResult:
    """Write every message (after `options` filters) to `to`, partitioned by topic and date."""
    from pyspark.sql import functions as F  # noqa: N812 - the PySpark convention

    say(f"export: reading {store}, writing {fmt} to {to}")
    df = read_store(spark, str(store), **(options or {})).withColumn("date", F.to_date("store_ts"))
    df.write.partitionBy("topic", "date").mode(mode).format(fmt).save(str(to))
    say("export: counting what was written")
    written = spark.read.format(fmt).load(str(to))
    pairs = written.select("topic", "date").distinct().collect()
    parts = sorted(f"topic={r.topic}/date={r.date}" for r in pairs)
    return ExportResult(str(to), fmt, written.count(), parts)


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


def log2_bucket(size_bytes: int) -> int:
    """The histogram bucket of a record size (what stats computes in Spark)."""
    return math.floor(math.log2(size_bytes))
