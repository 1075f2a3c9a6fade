"""The supervisor's own metadata on a full disk: the checkpoint and run/supervisor.json are not
written (the previous ones stay), producers get DISK_FULL, and everything resumes with space."""

from __future__ import annotations

import json
import os
import signal

import pytest

from engine.check import check
from engine.checkpoint import load_checkpoint
from engine.status import PutStatus
from ipc.control_block import Role, process_slot_index
from ipc.producer import Producer
from ipc.run_info import run_info_path
from tools.torture.filesystems import FilesystemUnavailable, MiB, fill, small_tmpfs, unfill, unmount
from tools.torture.processes import StoreProcess, wait_until, write_store_config
from tools.torture.rounds import TORTURE_STORE

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path):
    try:
        mount_point = small_tmpfs(tmp_path / "disk", 16 * MiB)
    except FilesystemUnavailable as exc:
        pytest.skip(f"no small tmpfs: {exc}")
    yield mount_point
    unmount(mount_point)


def probe(producer: Producer) -> PutStatus:
    return producer.send("Probe", b"p" * 100, keys=("probe",)).status


def test_full_disk_keeps_the_checkpoint_and_run_info_and_writes_resume(tmp_path, small_disk):
    config = write_store_config(tmp_path / "store.toml", TORTURE_STORE)
    store = StoreProcess(small_disk / "store", config, tmp_path / "supervisor.log")
    store.start()
    try:
        store.wait_ready()
        with Producer(store.root) as producer:
            assert probe(producer) is PutStatus.PUT_OK
            wait_until(lambda: load_checkpoint(store.root).checkpoint is not None, "a checkpoint", 10)
            fill(small_disk, leave_bytes=0)
            wait_until(lambda: "disk full: the checkpoint not written" in store.log_text(),
                       "a checkpoint to meet the full disk", 10)
            wait_until(lambda: probe(producer) is PutStatus.DISK_FULL, "DISK_FULL", 10)
            dispatcher = store.child_pid(Role.DISPATCHER)
            os.kill(dispatcher, signal.SIGKILL)  # its restart is recorded in run/supervisor.json
            with store.ctl() as ctl:
                slot = process_slot_index(Role.DISPATCHER, 0)
                wait_until(lambda: ctl.process_slot(slot).pid not in (0, dispatcher),
                           "the dispatcher's restart", 20)
            assert store.running, store.log_text()[-2000:]
            assert load_checkpoint(store.root).checkpoint is not None  # the previous one stays
            assert json.loads(run_info_path(store.root).read_text())["restart_history"] == []
            unfill(small_disk)
            wait_until(lambda: "disk space is back" in store.log_text(), "the metadata to resume", 10)
            wait_until(lambda: len(json.loads(run_info_path(store.root).read_text())
                                   ["restart_history"]) == 1, "the restart in the run info", 10)
            wait_until(lambda: probe(producer) is PutStatus.PUT_OK, "writes to resume", 10)
        assert store.stop() == 0
        log = store.log_text()
        assert "stopped cleanly" in log and "mqstore: error" not in log, log[-3000:]
        assert not list(store.root.glob("*.tmp"))
        assert check(store.root) == []
    finally:
        unfill(small_disk)
        if store.running:
            store.kill()
