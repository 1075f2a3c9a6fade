"""Running mqstore as a service (issue 20): honest status, frozen settings, shared-memory names
nobody else can take, and the smaller defects a new user meets. Real processes throughout."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from engine.files.store_dir import holder_pid
from tests.helpers import snapshot
from tests.workers.store_harness import (
    assert_check_clean,
    checked_store,
    cli,
    start_store,
    store_shm_names,
    wait_for,
    write_config,
)
from workers.child_env import REPO_ROOT, child_env

NOBODY = 65534


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
    store = start_store(root)
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
    store = start_store(root)
    assert store.stop() == 0
    stopped = cli("status", "--store", str(root))
    assert stopped.returncode == 3, err(stopped)
    assert "STOPPED" in out(stopped) and "not running" in out(stopped) and not err(stopped)
    code, data = status_json(root)
    assert code == 3 and data["state"] == "STOPPED" and data["clean_stop"] is True
    assert_check_clean(root)


# ---------------------------------------------------------------------------------- frozen settings
def stopped_store(tmp_path: Path, sends: tuple[tuple[str, ...], ...] = ()) -> Path:
    root = tmp_path / "store"
    store = start_store(root)
    for args in sends:
        sent = cli("send", "--store", str(root), *args)
        assert sent.returncode == 0, err(sent)
    assert store.stop() == 0
    return root


def test_a_frozen_setting_asked_differently_is_refused_naming_both_values(tmp_path):
    root = stopped_store(tmp_path)
    before = snapshot(root)
    more_queues = write_config(tmp_path / "eight.toml", {"queue_count": 8})
    refused = cli("start", "--store", str(root), "--config", str(more_queues))
    assert_one_line_error(refused, 2, "queue_count: the store has 4", "asks for 8", "eight.toml")
    shards = cli("start", "--store", str(root), "--config", str(tmp_path / "store.toml"),
                 "--index-shards", "3")
    assert_one_line_error(shards, 2, "index_shards: the store has 2, --index-shards asks for 3")
    detached = cli("start", "--store", str(root), "--index-shards", "3", "--detach")
    assert_one_line_error(detached, 2, "index_shards: the store has 2")
    recover = cli("recover", "--store", str(root), "--config", str(more_queues))
    assert_one_line_error(recover, 2, "queue_count: the store has 4", "asks for 8")
    assert snapshot(root) == before
    assert holder_pid(root) is None


def edit_store_json(root: Path, **changes) -> None:
    path = root / "store.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}, indent=2))


def test_a_store_json_edited_against_the_files_is_refused(tmp_path):
    root = stopped_store(tmp_path, sends=(
        ("--topic", "T", "--body", "x", "--key", "k", "--count", "20"),
        ("--topic", "T", "--body", "y", "--queue-id", "3")))
    edit_store_json(root, index_shards=4)
    more = cli("start", "--store", str(root), "--config",
               str(write_config(tmp_path / "c4.toml", {"index_shards": 4})))
    assert_one_line_error(more, 2, "store.json says index_shards = 4", "checkpoint records 2")
    edit_store_json(root, index_shards=1)
    fewer = cli("start", "--store", str(root), "--config", str(write_config(
        tmp_path / "c1.toml", {"index_shards": 1})))
    assert_one_line_error(fewer, 2, "store.json says index_shards = 1", "index/1/")
    edit_store_json(root, index_shards=2)
    topics_json = root / "config" / "topics.json"  # T is configured: its own counts bound its queues
    kept = topics_json.read_bytes()
    table = json.loads(kept)
    table["topicConfigTable"]["T"].update(readQueueNums=2, writeQueueNums=2)
    topics_json.write_text(json.dumps(table))
    hidden = cli("recover", "--store", str(root))
    assert_one_line_error(hidden, 2, "topics.json gives topic T 2 read queues", "but it has queue 2")
    topics_json.write_bytes(kept)
    store = start_store(root)  # put back as it was: the store starts again
    assert store.stop() == 0
    assert_check_clean(root)


# ---------------------------------------------------------------------------------- smaller defects
def test_a_config_value_of_the_wrong_type_or_an_unknown_supervisor_key_is_one_clear_error(tmp_path):
    root = tmp_path / "store"
    big = write_config(tmp_path / "big.toml", {"max_body_bytes": "big"})
    assert_one_line_error(cli("start", "--store", str(root), "--config", str(big)), 2,
                          "max_body_bytes = 'big' is a str, expected an integer")
    ratio = write_config(tmp_path / "ratio.toml", {"disk_warn_ratio": True})
    assert_one_line_error(cli("start", "--store", str(root), "--config", str(ratio)), 2,
                          "disk_warn_ratio = True is a bool, expected a number")
    typo = write_config(tmp_path / "typo.toml", supervisor={"mailbox_slot": 8})
    assert_one_line_error(cli("start", "--store", str(root), "--config", str(typo)), 2,
                          "[supervisor]: unknown settings ['mailbox_slot']", "mailbox_slots",
                          "restart_budget")
    slots = write_config(tmp_path / "slots.toml", supervisor={"mailbox_slots": "many"})
    assert_one_line_error(cli("start", "--store", str(root), "--config", str(slots)), 2,
                          "mailbox_slots = 'many' is a str, expected an integer")
    assert not root.exists()


def test_stop_of_a_file_is_a_clear_not_a_store_error(tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("hello")
    result = cli("stop", "--store", str(a_file))
    assert_one_line_error(result, 2, "not a directory", "notes.txt")
    assert "Errno" not in err(result)
    assert a_file.read_text() == "hello"


EXTRA_PRODUCER = """
import sys
from ipc.producer import Producer
from engine.errors import StoreError
held = [Producer(sys.argv[1]) for _ in range(2)]
try:
    Producer(sys.argv[1])
except StoreError as exc:
    print(type(exc).__name__, exc)
for producer in held:
    producer.close()
"""


def test_the_producer_past_the_last_mailbox_slot_is_told_about_mailbox_slots(tmp_path):
    from tests.workers.store_harness import run_python

    with checked_store(tmp_path / "store", supervisor={"mailbox_slots": 2}) as store:
        result = run_python(EXTRA_PRODUCER, str(store.root))
        assert result.returncode == 0, result.stderr.decode()
        said = result.stdout.decode()
        assert said.startswith("SlotsExhaustedError"), said
        assert "all 2 producer mailbox slots are in use" in said and "mailbox_slots" in said, said
        assert "slot slots" not in said


AS_NOBODY = """
import os, sys
from tools import cli
import tools.start_settings, workers.supervisor, engine.frozen_settings, engine.files.owners  # noqa: F401
os.setgid(65534); os.setgroups([]); os.setuid(65534)
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.fixture
def public_tmp():
    """A directory another user may traverse (tmp_path's parents are root's only)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to hand a store to another user")
    parent = Path(tempfile.mkdtemp(prefix="mqstore-service-"))
    parent.chmod(0o755)
    yield parent
    shutil.rmtree(parent)


def test_a_read_only_store_is_called_read_only_not_another_users(public_tmp):
    from tests.workers.store_harness import run_python

    root = public_tmp / "store"
    store = start_store(root)
    assert store.stop() == 0
    for path in [root, *root.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)
    root.chmod(0o500)
    before = snapshot(root)
    result = run_python(AS_NOBODY, "start", "--store", str(root), cwd=public_tmp)
    assert_one_line_error(result, 5, "read-only (mode dr-x------) for its owner", str(root))
    assert "another user" not in err(result)
    assert snapshot(root) == before


def test_send_without_queue_id_round_robins_from_a_random_queue(tmp_path):
    with checked_store(tmp_path / "store") as store:
        singles = [json.loads(out(cli("send", "--store", str(store.root), "--topic", "One",
                                      "--body", "x", "--json")))["queue_id"] for _ in range(12)]
        assert len(set(singles)) > 1, singles  # not always queue 0 (chance of that: 4 ** -11)
        counted = cli("send", "--store", str(store.root), "--topic", "Many", "--body", "x",
                      "--count", "8", "--json")
        queues = [json.loads(line)["queue_id"] for line in out(counted).splitlines()]
        assert sorted(queues) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_ctrl_c_during_send_count_lists_what_was_stored_and_exits_130(tmp_path):
    with checked_store(tmp_path / "store") as store:
        before = store.positions().appended_msgs
        with open(tmp_path / "sent.out", "wb") as sent_out:  # a file: a full pipe would block it
            sender = subprocess.Popen([sys.executable, "-m", "tools.cli", "send", "--store",
                                       str(store.root), "--topic", "Big", "--body", "b", "--count",
                                       "5000000"], cwd=REPO_ROOT, env=child_env(), stdout=sent_out,
                                      stderr=subprocess.PIPE)
            wait_for(lambda: store.positions().appended_msgs - before >= 3000, "thousands stored")
            sender.send_signal(signal.SIGINT)
            _, stderr = sender.communicate(timeout=60)
        assert sender.returncode == 130, stderr.decode()
        printed = [line for line in (tmp_path / "sent.out").read_text().splitlines()
                   if line.startswith("PUT_OK")]
        said = stderr.decode()
        assert f"interrupted: {len(printed)} of 5000000 message(s) stored" in said, said
        assert f"the other {5000000 - len(printed)} were not sent" in said, said
        assert len(printed) >= 1024 and "Traceback" not in said
        store.wait_caught_up()
        assert store.positions().appended_msgs - before == len(printed)  # none in doubt


def test_root_refuses_a_store_under_a_world_writable_directory_of_another_user(public_tmp):
    shared = public_tmp / "shared"
    shared.mkdir()
    os.chown(shared, NOBODY, NOBODY)
    shared.chmod(0o1777)  # sticky, but its owner may still rename what root puts there
    for args in (("start",), ("start", "--detach"), ("recover",)):
        result = cli(*args, "--store", str(shared / "store"))
        assert_one_line_error(result, 5, f"refusing to run a store as root under {shared}",
                              f"owned by uid {NOBODY} (nobody)")
    assert list(shared.iterdir()) == []
    own = public_tmp / "own"
    own.mkdir()
    own.chmod(0o1777)  # like /tmp: sticky and root's, so fine
    store = start_store(own / "store")
    assert store.stop() == 0


def test_a_new_store_says_it_is_new_not_recovering_after_a_clean_shutdown(tmp_path):
    store = start_store(tmp_path / "store")
    assert store.stop() == 0
    first = store.stderr
    assert "new store" in first and "nothing to recover" in first, first
    assert "shutdown" not in first.split("mqstore ready")[0], first
    again = start_store(tmp_path / "store")
    assert again.stop() == 0
    assert "after a clean shutdown" in again.stderr[len(first):]


def test_shared_memory_names_come_from_the_owner_only_token_and_change_each_start(tmp_path):
    import hashlib
    import stat

    root = tmp_path / "store"
    store = start_store(root)
    try:
        token_file = root / "run" / "shm-token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        first = store_shm_names(root)
        assert f"mqstore-{token_file.read_text().strip()}-ctl" in first
        path_hash = hashlib.sha1(os.path.realpath(root).encode()).hexdigest()[:16]
        assert not any(path_hash in name for name in first)  # not derivable from the path
        sent = cli("send", "--store", str(root), "--topic", "T", "--body", "x")
        assert sent.returncode == 0, err(sent)  # clients find the names through the token
    finally:
        assert store.stop() == 0
    assert not token_file.exists() and store_shm_names(root) == []
    again = start_store(root)
    try:
        assert set(store_shm_names(root)).isdisjoint(first)
    finally:
        assert again.stop() == 0
    assert_check_clean(root)
