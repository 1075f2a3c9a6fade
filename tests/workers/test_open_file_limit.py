"""Issue 19, items 4 and 8, with real processes: a store with more consume queues than its
open-file limit allows mapped at once keeps running; every child exit and every failed start
leaves its cause in mqstore.log (and `start --detach` says it)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engine.files.naming import CONSUMEQUEUE_DIR
from ipc.consumer import Consumer
from ipc.control_block import Role
from ipc.producer import Producer
from tests.workers.store_harness import assert_check_clean, start_store, wait_for, write_config
from workers.child_env import REPO_ROOT, child_env

pytestmark = pytest.mark.slow

TOPICS = 160  # x 4 queues: 640 queue files, 2.5x the limit even at one fd per file
NOFILE = 256  # soft = hard: raising the soft limit cannot help, only the bound can


def nofile_limit(limit: int):
    """A preexec_fn: the child runs with RLIMIT_NOFILE soft = hard = `limit`."""
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    return apply


def queue_fds(pid: int, root: Path) -> int:
    """How many of process `pid`'s file descriptors are open on consume-queue files."""
    prefix = str(root / CONSUMEQUEUE_DIR)
    count = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{name}").startswith(prefix)
        except OSError:
            continue  # closed since the listing
    return count


def fill_queues(root: Path, topics: int) -> None:
    with Producer(root) as producer:
        for t in range(topics):
            result = producer.send_columns(f"T{t}", [f"{t}-{q}".encode() for q in range(4)],
                                           queue_ids=[0, 1, 2, 3])
            assert all(r.ok for r in result), (t, result[0])


def test_many_queues_under_a_low_open_file_limit_keep_the_store_running(tmp_path):
    store = start_store(tmp_path / "store", store={"index_shards": 1},
                        preexec_fn=nofile_limit(NOFILE))
    try:
        dispatcher = store.child_pid(Role.DISPATCHER)
        fill_queues(store.root, TOPICS)
        store.wait_caught_up(timeout_s=60)
        assert store.child_pid(Role.DISPATCHER) == dispatcher  # never crashed, never restarted
        bound = NOFILE // 4  # engine.files.open_files.queue_file_budget under this limit
        assert queue_fds(dispatcher, store.root) <= 2 * bound
        with Consumer(store.root, "g") as consumer:
            for t in range(0, TOPICS, 7):
                for q in range(4):
                    got = consumer.pull(f"T{t}", q, 0, 8)
                    assert [m.body for m in got.messages] == [f"{t}-{q}".encode()]
    finally:
        assert store.stop() == 0
    log = (store.root / "mqstore.log").read_text()
    assert "Too many open files" not in log and " ERROR " not in log
    restarted = start_store(store.root, store={"index_shards": 1},
                            preexec_fn=nofile_limit(NOFILE))  # recovery too
    assert restarted.stop() == 0
    assert_check_clean(store.root)


def test_start_detach_names_the_cause_of_a_supervisor_that_fails_to_start(tmp_path):
    root = tmp_path / "store"
    store = start_store(root, store={"index_shards": 1})
    fill_queues(root, 40)  # 160 queue files: more than fit under the limit below
    store.wait_caught_up()
    store.kill()  # recovery at the next start maps every queue file
    config = write_config(tmp_path / "detach.toml", {"index_shards": 1})
    started = subprocess.run(
        [sys.executable, "-m", "tools.cli", "start", "--store", str(root), "--config",
         str(config), "--detach"], cwd=REPO_ROOT, env=child_env(), capture_output=True,
        timeout=60, preexec_fn=nofile_limit(36))
    err = started.stderr.decode()
    assert started.returncode == 1, err
    assert "Too many open files" in err, err  # the cause, not only "see mqstore.log"
    log = (root / "mqstore.log").read_text()
    assert any("supervisor failed: " in line and "Too many open files" in line
               for line in log.splitlines()), log
    wait_for(lambda: not (root / "lock").exists() or _unlocked(root), "the lock to be free")
    assert start_store(root, store={"index_shards": 1}).stop() == 0
    assert_check_clean(root)


def _unlocked(root: Path) -> bool:
    from engine.files.store_dir import holder_pid

    return holder_pid(root) is None


def test_a_fatal_signal_leaves_its_traceback_in_the_log(tmp_path):
    store = start_store(tmp_path / "store")
    try:
        dispatcher = store.child_pid(Role.DISPATCHER)
        os.kill(dispatcher, signal.SIGBUS)  # what a write into a hole on a full disk gets
        store.wait_child_replaced(Role.DISPATCHER, dispatcher)
        log = (store.root / "mqstore.log").read_text()
        assert "Fatal Python error: Bus error" in log
        assert f"dispatcher (pid {dispatcher}) killed by SIGBUS: restarting" in log
        with Producer(store.root) as producer:
            assert producer.send("T1", b"after", keys=("k",)).ok
        store.wait_caught_up()
    finally:
        assert store.stop() == 0
    os.kill(start_store(store.root).proc.pid, signal.SIGBUS)  # the supervisor's own
    wait_for(lambda: (store.root / "mqstore.log").read_text().count("Fatal Python error") == 2,
             "the supervisor's fatal-signal report")
    wait_for(lambda: _unlocked(store.root), "the lock to be free")
    assert start_store(store.root).stop() == 0
    assert_check_clean(store.root)
