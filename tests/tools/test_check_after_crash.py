"""`mqstore check` on a SIGKILLed store, before any start: the records its dispatcher and index
builders had not reached are reported as recovery pending, exit 0; a start re-dispatches them."""

from __future__ import annotations

import json
import os
import signal

import pytest

from engine.recovery.checkpoint import load_checkpoint
from ipc.producer import Producer
from tests.workers.store_harness import assert_check_clean, cli, start_store, wait_for
from tools.store_process import is_stopped

LATE = 7  # records written while the children are stopped


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.slow
def test_check_after_sigkill_reports_recovery_pending_and_exits_0(tmp_path):
    root = tmp_path / "store"
    running = start_store(root)
    children: list[int] = []
    try:
        with Producer(root) as producer:
            assert all(producer.send("Orders", b"early-%d" % i, keys=(f"e{i}",)).ok for i in range(5))
            running.wait_caught_up()
            written = running.positions().written_pos
            wait_for(lambda: (cp := load_checkpoint(root).checkpoint) is not None
                     and cp.cq_durable_pos == written and set(cp.index_durable_pos) == {written},
                     "the checkpoint to record everything dispatched")
            children += running.child_pids()
            for pid in children:
                os.kill(pid, signal.SIGSTOP)
            wait_for(lambda: all(is_stopped(pid) for pid in children), "the children to stop")
            assert all(producer.send("Orders", b"late-%d" % i, keys=(f"l{i}",)).ok for i in range(LATE))
    finally:
        running.kill()  # first: a supervisor that saw its children die would restart them
        for pid in children:
            os.kill(pid, signal.SIGKILL)
    wait_for(lambda: all(_gone(pid) for pid in children), "the stopped children to die")

    checked = cli("check", "--store", str(root))
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()
    assert checked.stdout.decode().splitlines() == [
        f"recovery pending: {LATE} records past the dispatched position; a start re-dispatches them",
        "no findings"]
    as_json = json.loads(cli("check", "--store", str(root), "--json").stdout)
    assert as_json["findings"] == [] and as_json["pending_records"] == LATE
    assert {f["kind"] for f in as_json["pending"]} == {"cq_missing_entry", "index_key_missing"}

    restarted = start_store(root)
    assert restarted.stop() == 0
    assert_check_clean(root)
    assert "recovery pending" not in cli("check", "--store", str(root)).stdout.decode()
