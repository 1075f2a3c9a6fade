"""The jobs over Spark Connect: a local Connect server started by PySpark in a child process."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from engine.check import check as engine_check
from tests.spark.stores import REPO_ROOT
from workers.child_env import child_env

pytestmark = pytest.mark.slow


def test_register_check_rebuild_and_export_run_over_spark_connect(store_dir, records, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copytree(store_dir / "commitlog", copy / "commitlog")
    shutil.copy(store_dir / "store.json", copy / "store.json")
    env = child_env({"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable})
    done = subprocess.run([sys.executable, "-m", "tests.spark.connect_jobs", str(store_dir), str(copy),
                           str(tmp_path / "export")], env=env, cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["session"] == "pyspark.sql.connect.session"
    assert result["check_ok"] and result["records"] == len(records)
    assert result["rebuilt_entries"] == len(records) and result["exported"] == len(records)
    assert result["orders"] == sum(r.topic == "orders" for r in records.values())
    assert engine_check(copy) == []
