"""A SparkSession that can read format("mqstore"), and the one-line read of a store.

Python workers must run an interpreter that imports mqstore's packages: `prepare_worker_env`
makes them run this one, with the repository on PYTHONPATH, before the JVM starts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from tools.spark.source import register
from workers.child_env import python_path

REPO_ROOT = Path(__file__).resolve().parents[2]
# Filter pushdown into Python data sources is off by default in Spark 4.1+; the source
# implements it, and Spark refuses to plan such a source while it is off.
DEFAULT_CONF = {"spark.sql.session.timeZone": "UTC", "spark.ui.showConsoleProgress": "true",
                "spark.sql.python.filterPushdown.enabled": "true"}


def prepare_worker_env() -> None:
    """Python workers must run this interpreter and import mqstore's packages."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = python_path()


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
    """spark.read.format("mqstore") with `options` (see tools.spark.options), filters pushed
    down when the session allows it."""
    register(spark)
    pushdown = spark.conf.get("spark.sql.python.filterPushdown.enabled", "false")
    reader = spark.read.format("mqstore").option("filterPushdown", pushdown)
    return reader.options(**options).load(str(store))


