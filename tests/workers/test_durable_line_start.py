"""`mqstore start` never cuts durable data by surprise (issue 19 items 2 and 3), with real
processes: a crashed sync store with a flipped byte below the checkpoint's flushed position, and
a stopped store whose commitlog was moved away. Start refuses (non-zero exit, the position, the
path and the operator's command on stderr) and leaves the store's data files as they were;
`mqstore recover --rebuild` then cuts there and quarantines the rest byte for byte.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.files.naming import ABORT_FILE, CHECKPOINT_FILE, commitlog_dir, is_segment_name
from engine.formats.record import BODY_OFFSET
from engine.recovery.checkpoint import load_checkpoint
from ipc.control_block import Role, pid_alive
from tests.helpers import snapshot
from tests.workers.store_harness import assert_check_clean, cli, start_store, wait_for, write_config
from tools.store_process import StoreProcess
from tools.torture.faults import flip_byte, record_spans
from tools.torture.verify import store_config

TOPIC = "durable"
DATA_DIRS = ("commitlog", "consumequeue", "index", "quarantine")


def data_files(root: Path) -> dict[str, str]:
    """The store's data (commitlog, queues, index, checkpoint, quarantine, abort), hashed:
    what a refused start must leave as it was."""
    return {k: v for k, v in snapshot(root).items()
            if k.split("/")[0] in DATA_DIRS or k.startswith(CHECKPOINT_FILE) or k == ABORT_FILE}


def log_bytes(root: Path) -> bytes:
    directory = commitlog_dir(root)
    return b"".join((directory / n).read_bytes() for n in sorted(directory.iterdir())
                    if is_segment_name(n.name))


def send(root: Path, count: int) -> None:
    done = cli("send", "--store", str(root), "--topic", TOPIC, "--body", "acknowledged",
               "--key", "k", "--count", str(count), "--queue-id", "0")
    assert done.returncode == 0, done.stderr


def start_detached(root: Path, config: Path):
    """`mqstore start --detach`; one that should have been refused but ran is stopped again."""
    started = cli("start", "--store", str(root), "--config", str(config), "--detach")
    if started.returncode == 0:
        cli("stop", "--store", str(root))
    return started


def crash(store: StoreProcess) -> None:
    """SIGKILL the supervisor once everything is durable; its children exit by themselves."""
    store.wait_caught_up()
    children = [store.child_pid(Role.DISPATCHER)] + [store.child_pid(Role.INDEX_BUILDER, n)
                                                     for n in range(2)]
    store.kill()
    wait_for(lambda: not any(pid_alive(pid) for pid in children), "orphaned children to exit")
    assert (store.root / ABORT_FILE).exists()


def test_flip_below_the_line_after_a_crash_refuses_start_then_rebuild_cuts(tmp_path):
    root = tmp_path / "store"
    store = start_store(root)
    send(root, 40)
    wait_for(lambda: load_checkpoint(root).checkpoint.commitlog_flushed_pos == len(
        log_bytes(root).rstrip(b"\0")), "a checkpoint of every record")
    crash(store)
    spans = record_spans(root, store_config(root))
    path, file_pos, _size, commit_pos = spans[-1]  # re-verified by recovery; durable
    assert load_checkpoint(root).checkpoint.commitlog_flushed_pos > commit_pos
    original = log_bytes(root)
    flip_byte(path, file_pos + BODY_OFFSET, 0x04)
    damaged = log_bytes(root)
    before = data_files(root)
    config = root.parent / f"{root.name}.toml"
    started = start_detached(root, config)
    err = started.stderr.decode()
    assert started.returncode == 1, err
    assert f"commit_pos {commit_pos}" in err and str(path) in err and "recover --rebuild" in err
    assert data_files(root) == before  # nothing cut, nothing quarantined, abort still there
    recovered = cli("recover", "--store", str(root), "--config", str(config), "--rebuild", "--json")
    assert recovered.returncode == 0, recovered.stderr
    report = json.loads(recovered.stdout)
    assert (report["mode"], report["cut_pos"]) == ("rebuild", commit_pos)
    quarantine = Path(report["quarantine_path"]).read_bytes()
    assert quarantine == damaged[commit_pos:commit_pos + len(quarantine)]
    assert not damaged[commit_pos + len(quarantine):].strip(b"\0")
    assert log_bytes(root)[:commit_pos] == original[:commit_pos]  # the prefix kept as it was
    assert_check_clean(root)
    store = start_store(root)
    consumed = cli("consume", "--store", str(root), "--topic", TOPIC, "--queue-id", "0",
                   "--offset", "0", "--json")
    assert store.stop() == 0
    assert len(consumed.stdout.splitlines()) == len(spans) - 1
    assert_check_clean(root)


def test_missing_commitlog_refuses_start_and_keeps_the_queues(tmp_path):
    root = tmp_path / "store"
    config = write_config(tmp_path / "store.toml")
    assert cli("start", "--store", str(root), "--config", str(config), "--detach").returncode == 0
    send(root, 1)
    assert cli("stop", "--store", str(root)).returncode == 0
    shutil.move(commitlog_dir(root), tmp_path / "moved-away")
    before = data_files(root)
    started = start_detached(root, config)
    err = started.stderr.decode()
    assert started.returncode == 1, err
    assert "commitlog directory is missing" in err and str(commitlog_dir(root)) in err
    assert data_files(root) == before  # the queues and index are not trimmed
    shutil.move(tmp_path / "moved-away", commitlog_dir(root))
    assert cli("start", "--store", str(root), "--config", str(config), "--detach").returncode == 0
    consumed = cli("consume", "--store", str(root), "--topic", TOPIC, "--queue-id", "0",
                   "--offset", "0", "--json")
    assert cli("stop", "--store", str(root)).returncode == 0
    assert [json.loads(line)["body"] for line in consumed.stdout.splitlines()] == ["acknowledged"]
    assert_check_clean(root)


@pytest.mark.slow
def test_missing_first_segment_refuses_start_until_a_rebuild_accepts_the_loss(tmp_path):
    root = tmp_path / "store"
    config = write_config(tmp_path / "store.toml", {"commitlog_file_size": 4096, "max_body_bytes": 1024})
    assert cli("start", "--store", str(root), "--config", str(config), "--detach").returncode == 0
    send(root, 80)  # ~20 segments
    assert cli("stop", "--store", str(root)).returncode == 0
    first = sorted(commitlog_dir(root).iterdir())[0]
    first.unlink()
    before = data_files(root)
    started = start_detached(root, config)
    err = started.stderr.decode()
    assert started.returncode == 1, err
    assert "the commitlog starts at 4096, but retention removed only the segments below 0" in err
    assert "recover --rebuild" in err and data_files(root) == before
    rebuilt = cli("recover", "--store", str(root), "--config", str(config), "--rebuild")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert cli("start", "--store", str(root), "--config", str(config), "--detach").returncode == 0
    assert cli("stop", "--store", str(root)).returncode == 0
    assert_check_clean(root)
