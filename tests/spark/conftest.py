"""One local[2] SparkSession for every Spark test, and small real stores written by the engine.

The session's JVM also serves Spark Connect (its plugin, on a port the kernel picks, with a
token): the Connect tests' clients talk to it, rather than each starting a Connect server of
its own (another JVM, ~40 s here).

Workers must import `engine`, `tools` and the top-level `pyspark_mqstore` module (which Spark
discovers by itself): the repository root goes on PYTHONPATH and this interpreter becomes
PYSPARK_PYTHON before the JVM starts.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.spark.stores import T0_MS, FakeClock, engine_records, message_batches, write_store
from workers.child_env import python_path

try:
    import pyarrow  # noqa: F401 - Python data sources exchange Arrow batches
    import pyspark  # noqa: F401
except ImportError:  # the [spark] extra is not installed: nothing here can run
    collect_ignore_glob = ["test_*.py"]


def _spark_env() -> None:
    os.environ["PYTHONPATH"] = python_path()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


CONNECT_TOKEN = uuid.uuid4().hex


@pytest.fixture(scope="session")
def spark() -> Iterator:
    from pyspark.sql import SparkSession

    _spark_env()
    session = (SparkSession.builder.master("local[2]").appName("mqstore-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.python.filterPushdown.enabled", "true")
               .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
               .config("spark.connect.grpc.binding.address", "127.0.0.1")
               .config("spark.connect.grpc.binding.port", "0")  # any free port: read back below
               .config("spark.connect.authenticate.token", CONNECT_TOKEN)
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_connect_url(spark) -> str:
    """Where a Spark Connect client reaches the shared session's JVM (localhost: PySpark sends a
    token without TLS only there)."""
    service = getattr(spark._jvm.org.apache.spark.sql.connect.service, "SparkConnectService$")
    port = service.__getattr__("MODULE$").server().getPort()
    return f"sc://localhost:{port}/;token={CONNECT_TOKEN}"


@pytest.fixture(scope="session")
def store_dir(tmp_path_factory) -> Path:
    """A closed store: several segments with fillers, rolled consume-queue and index files."""
    root = tmp_path_factory.mktemp("spark-store") / "store"
    write_store(root, message_batches(), FakeClock(T0_MS))
    return root


@pytest.fixture(scope="session")
def records(store_dir) -> dict[int, object]:
    return engine_records(store_dir)
