"""Running mqstore as a service (issue 20): honest status, frozen settings, shared-memory names
nobody else can take, and the smaller defects a new user meets. Real processes throughout."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workers"))
from store_harness import (
    RunningStore,
    assert_check_clean,
    cli,
    store_shm_names,
    wait_for,
)

from engine.store_dir import holder_pid


def out(result) -> str:
    return result.stdout.decode()


def err(result) -> str:
    return result.stderr.decode()


def assert_one_line_error(result, code: int, *words: str) -> None:
    text = err(result)
    assert result.returncode == code, (result.returncode, text)
    assert "Traceback" not in text, text
    assert len([line for line in text.splitlines() if line.startswith("mqstore: error")]) == 1, text
    for word in words:
        assert word in text, (word, text)


def status_json(root: Path) -> tuple[int, dict]:
    result = cli("status", "--store", str(root), "--json")
    return result.returncode, json.loads(out(result))


# ---------------------------------------------------------------------------------- status
def test_status_after_kill_9_is_stale_exit_3_and_recover_leaves_it_stopped(tmp_path):
    root = tmp_path / "store"
    store = RunningStore.start(root)
    pid = store.proc.pid
    assert status_json(root)[1]["state"] == "READY"
    store.kill()
    wait_for(lambda: holder_pid(root) is None, "the lock to be free")

    code, data = status_json(root)
    assert code == 3 and data["state"] == "STALE" and data["supervisor_pid"] == pid, data
    text = cli("status", "--store", str(root))
    assert text.returncode == 3 and "STALE" in out(text) and "not running" in out(text)
    assert store_shm_names(root)  # what the dead supervisor left

    recovered = cli("recover", "--store", str(root))
    assert recovered.returncode == 0, err(recovered)
    assert store_shm_names(root) == []
    code, data = status_json(root)
    assert code == 3 and data["state"] == "STOPPED", data
    assert_check_clean(root)


def test_status_of_a_stopped_or_missing_store_says_not_running(tmp_path):
    missing = cli("status", "--store", str(tmp_path / "nothing"))
    assert missing.returncode == 3 and "not running" in out(missing), (out(missing), err(missing))
    code, data = status_json(tmp_path / "nothing")
    assert code == 3 and data["state"] == "STOPPED" and data["running"] is False
    assert not (tmp_path / "nothing").exists()

    root = tmp_path / "store"
    store = RunningStore.start(root)
    assert store.stop() == 0
    stopped = cli("status", "--store", str(root))
    assert stopped.returncode == 3, err(stopped)
    assert "STOPPED" in out(stopped) and "not running" in out(stopped) and not err(stopped)
    code, data = status_json(root)
    assert code == 3 and data["state"] == "STOPPED" and data["clean_stop"] is True
    assert_check_clean(root)
