"""tools.store_process (the one store-process harness) and workers.child_env."""

from __future__ import annotations

import os

import pytest

from tests.workers.store_harness import write_config
from tools.store_process import StoreProcess, StoreProcessError, wait_until, write_store_config
from workers.child_env import REPO_ROOT, child_env, python_path


def test_python_path_puts_the_repository_first_and_every_entry_once():
    other = os.pathsep.join(["/x", str(REPO_ROOT), "", "/y", "/x"])
    assert python_path(other).split(os.pathsep) == [str(REPO_ROOT), "/x", "/y"]
    assert python_path("") == str(REPO_ROOT)


def test_child_env_keeps_the_environment_and_applies_extra_last(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv("MQSTORE_PROBE", "parent")
    env = child_env({"MQSTORE_PROBE": "child"})
    assert env["PYTHONPATH"] == os.pathsep.join([str(REPO_ROOT), "/elsewhere"])
    assert env["MQSTORE_PROBE"] == "child" and os.environ["MQSTORE_PROBE"] == "parent"


def test_wait_until_returns_the_value_or_raises_at_the_deadline():
    assert wait_until(lambda: 7, "seven", 1.0) == 7
    with pytest.raises(StoreProcessError, match=r"timed out after 0\.05 s waiting for nothing"):
        wait_until(lambda: None, "nothing", 0.05)


def test_write_store_config_writes_both_tables(tmp_path):
    path = write_store_config(tmp_path / "c.toml", {"flush": "async", "queue_count": 2},
                              {"child_timeout_s": 1.5})
    assert path.read_text() == ('[store]\nflush = "async"\nqueue_count = 2\n\n'
                                "[supervisor]\nchild_timeout_s = 1.5\n")


def test_wait_ready_quotes_the_log_of_a_supervisor_that_exits_first(tmp_path):
    config = write_config(tmp_path / "store.toml", {"queue_count": 0})
    process = StoreProcess(tmp_path / "store", config, tmp_path / "supervisor.log", timeout_s=60)
    process.start()
    with pytest.raises(StoreProcessError, match=r"the supervisor exited with [1-9]") as caught:
        process.wait_ready()
    assert "queue_count" in str(caught.value)
    assert not process.running
    assert not (tmp_path / "store").exists()  # a refused setting creates nothing
