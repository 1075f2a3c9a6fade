"""`spark_session` and a read through it start quietly: no warning that Spark's discovered
source was replaced, none that PySpark does not support the installed pandas; and the spark
extra pins pandas to what the installed PySpark supports."""

from __future__ import annotations

import tomllib
from importlib.metadata import requires, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from engine.store import MessageStore
from tests.workers.store_harness import run_python

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
QUIET_SCRIPT = """
import sys
from tools.spark.session import read_store, spark_session
spark = spark_session("local[1]", {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"})
print(read_store(spark, sys.argv[1]).count(), flush=True)
spark.stop()
"""
WARNINGS = ("replaced a statically registered data source", "does not yet fully support pandas")


def extra_requirement(extra: str, name: str) -> Requirement:
    listed = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"][extra]
    found = [Requirement(text) for text in listed if Requirement(text).name == name]
    assert found, f"the [{extra}] extra of pyproject.toml does not pin {name}"
    return found[0]


def test_the_spark_extra_pins_a_pandas_the_installed_pyspark_supports():
    pin = extra_requirement("spark", "pandas").specifier
    pyspark_wants = [Requirement(r) for r in requires("pyspark") if r.startswith("pandas")]
    minimum = min(s.version for r in pyspark_wants for s in r.specifier if s.operator == ">=")
    assert pin.contains(minimum), (str(pin), minimum)
    assert not pin.contains("3.0.0"), f"PySpark warns it does not fully support pandas >= 3.0.0: {pin}"
    assert pin.contains(version("pandas")), f"installed pandas {version('pandas')} is outside {pin}"


@pytest.mark.slow
def test_a_session_and_a_read_through_it_start_without_warnings(tmp_path):
    with MessageStore.open(tmp_path / "store") as store:
        for i in range(3):
            store.put("orders", f"m{i}".encode())
    result = run_python(QUIET_SCRIPT, str(tmp_path / "store"), timeout=600)
    err = result.stderr.decode()
    assert result.returncode == 0, err
    assert result.stdout.decode().split() == ["3"]
    assert [w for w in WARNINGS if w in err] == [], err
