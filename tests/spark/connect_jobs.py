"""Run the Spark jobs as a Spark Connect client (a child process: a Python process holds either a
classic session or a Connect one; the tests' own session's JVM is the server).

    python -m tests.spark.connect_jobs URL STORE REBUILD_COPY EXPORT_DIR [JOB ...]  -> one JSON line

JOB is one of check, rebuild, export, count (default: all four); the JSON has a key per job run.
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession

from tools.spark import jobs
from tools.spark.source import register

JOBS = ("check", "rebuild", "export", "count")


def run_job(spark, name: str, store: str, copy: str, out: str) -> dict:
    """One job over the Connect session: what the test compares with the store."""
    if name == "check":
        check = jobs.check(spark, store)
        return {"check_ok": check.ok, "records": check.records}
    if name == "rebuild":
        return {"rebuilt_entries": jobs.rebuild(spark, copy).cq_entries}
    if name == "export":
        return {"exported": jobs.export(spark, store, out, mode=jobs.ExportMode.INCREMENTAL).rows}
    if name == "count":
        return {"orders": jobs.read_store(spark, store).where("topic = 'orders'").count()}
    raise SystemExit(f"unknown job {name!r}: one of {', '.join(JOBS)}")


def main(url: str, store: str, copy: str, out: str, *names: str) -> None:
    spark = (SparkSession.builder.remote(url).config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.python.filterPushdown.enabled", "true").getOrCreate())
    try:
        register(spark)
        register(spark)
        result = {"session": type(spark).__module__}
        for name in names or JOBS:
            result.update(run_job(spark, name, store, copy, out))
        print(json.dumps(result))
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
