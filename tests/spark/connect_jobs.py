"""Run the Spark jobs in a local Spark Connect session (a child process: one JVM per process).

    python -m tests.spark.connect_jobs STORE REBUILD_COPY EXPORT_DIR   -> one JSON line on stdout
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession

from tools.spark import jobs
from tools.spark.source import register


def main(store: str, copy: str, out: str) -> None:
    spark = (SparkSession.builder.remote("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.python.filterPushdown.enabled", "true").getOrCreate())
    try:
        register(spark)
        register(spark)
        check = jobs.check(spark, store)
        rebuild = jobs.rebuild(spark, copy)
        export = jobs.export(spark, store, out, mode=jobs.ExportMode.INCREMENTAL)
        orders = jobs.read_store(spark, store).where("topic = 'orders'").count()
        print(json.dumps({"session": type(spark).__module__, "check_ok": check.ok, "records": check.records,
                          "rebuilt_entries": rebuild.cq_entries, "exported": export.rows, "orders": orders}))
    finally:
        spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
