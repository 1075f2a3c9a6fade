"""The supervisor owns its token's semaphore namespace: what consumers killed by SIGKILL or
SIGTERM leave in /dev/shm is removed while it runs, and a stop removes every name it issued."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from ipc.producer import Producer
from tests.workers.store_harness import start_store, store_shm_names, wait_for
from workers.child_env import REPO_ROOT, child_env


def _consumer_sems(root) -> list[str]:
    return [name for name in store_shm_names(root) if "-sem-wait-" in name]


def _follow(root) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tools.cli", "consume", "--store", str(root), "--topic",
                             "Orders", "--follow"], cwd=REPO_ROOT, env=child_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.slow
def test_semaphores_of_killed_consumers_are_reclaimed_and_stop_leaves_none(tmp_path):
    root = tmp_path / "store"
    running = start_store(root)
    consumers = []
    try:
        with Producer(root) as producer:
            assert producer.send("Orders", b"one").ok
        consumers = [_follow(root) for _ in range(3)]
        wait_for(lambda: len(_consumer_sems(root)) == 3, "three consumers waiting on their semaphores")
        killed, terminated, live = consumers
        killed.send_signal(signal.SIGKILL)
        terminated.send_signal(signal.SIGTERM)
        assert killed.wait(30) == -signal.SIGKILL and terminated.wait(30) == -signal.SIGTERM
        wait_for(lambda: len(_consumer_sems(root)) == 1, "the dead consumers' semaphores to go")
        assert _consumer_sems(root)[0].endswith(f"-{live.pid}")  # the live one's is kept
        assert "removed the semaphores of" in running.log_text()
    finally:
        stopped = running.stop()
        for proc in consumers:
            proc.kill()
            proc.wait(30)
    assert stopped == 0
    assert store_shm_names(root) == []  # the live consumer's too: the namespace ended with the stop
