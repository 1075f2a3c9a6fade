"""The jobs over Spark Connect: a client in a child process, served by the test session's JVM.

`make test` runs rebuild, export and a filtered count over Connect (each a DataFrame-only job,
as tools/spark/tasks.py requires); the check job over Connect, 30 s more here, runs in `make soak`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from engine.check.fsck import check as engine_check
from tests.spark.stores import REPO_ROOT
from workers.child_env import child_env

pytestmark = pytest.mark.slow


def run_over_connect(url: str, store_dir, tmp_path, *job_names: str) -> tuple[dict, object]:
    """Run the named jobs in a Connect session; returns their JSON line and the rebuilt copy."""
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copytree(store_dir / "commitlog", copy / "commitlog")
    shutil.copy(store_dir / "store.json", copy / "store.json")
    env = child_env({"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable})
    done = subprocess.run([sys.executable, "-m", "tests.spark.connect_jobs", url, str(store_dir), str(copy),
                           str(tmp_path / "export"), *job_names], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["session"] == "pyspark.sql.connect.session"
    return result, copy


def test_register_rebuild_export_and_count_run_over_spark_connect(spark_connect_url, store_dir, records,
                                                                  tmp_path):
    result, copy = run_over_connect(spark_connect_url, store_dir, tmp_path, "rebuild", "export", "count")
    assert "check_ok" not in result  # only the jobs asked for ran
    assert result["rebuilt_entries"] == len(records) and result["exported"] == len(records)
    assert result["orders"] == sum(r.topic == "orders" for r in records.values())
    assert engine_check(copy) == []


@pytest.mark.soak
def test_register_check_rebuild_and_export_run_over_spark_connect(spark_connect_url, store_dir, records,
                                                                  tmp_path):
    result, copy = run_over_connect(spark_connect_url, store_dir, tmp_path)
    assert result["check_ok"] and result["records"] == len(records)
    assert result["rebuilt_entries"] == len(records) and result["exported"] == len(records)
    assert result["orders"] == sum(r.topic == "orders" for r in records.values())
    assert engine_check(copy) == []
