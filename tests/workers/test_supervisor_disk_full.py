"""The supervisor's own metadata on a full disk: the checkpoint and run/supervisor.json are not
written (the previous ones stay), producers get DISK_FULL, and everything resumes with space."""

from __future__ import annotations

import json
import os
import signal

import pytest

from engine.check.fsck import check
from engine.files.mapped_file import Access
from engine.log.commitlog import CommitLog
from engine.recovery.checkpoint import load_checkpoint
from engine.status import PutStatus
from ipc.control_block import Role, process_slot_index
from ipc.producer import Producer
from ipc.run_info import run_info_path
from tools.store_process import StoreProcess, wait_until, write_store_config
from tools.torture.filesystems import FilesystemUnavailable, MiB, fill, small_tmpfs, unfill, unmount
from tools.torture.rounds import TORTURE_STORE
from workers.exit_codes import CliExit

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


@pytest.mark.parametrize("what", ["checkpoint", "run info"])
def test_a_metadata_write_that_fails_stops_the_store_cleanly(tmp_path, what):
    """A checkpoint or run/supervisor.json write failing with anything but a full disk (here a
    directory in the way of its temp file: EISDIR, as an fsync EIO would) stops the store like a
    failed commitlog flush: "flushing ... failed", exit code 1, no escaped exception; nothing
    acknowledged is lost and the next start recovers."""
    config = write_store_config(tmp_path / "store.toml", TORTURE_STORE)
    store = StoreProcess(tmp_path / "store", config, tmp_path / "supervisor.log")
    store.start()
    try:
        store.wait_ready()
        with Producer(store.root) as producer:
            acked = producer.send("Meta", b"m" * 100, keys=("meta",))
        assert acked.status is PutStatus.PUT_OK
        if what == "checkpoint":
            blocker, file_name = store.root / "checkpoint.tmp", "the checkpoint"
            blocker.mkdir()  # the next checkpoint (every cq_flush_interval_ms) meets it
        else:
            info = run_info_path(store.root)
            blocker, file_name = info.with_name(info.name + ".tmp"), "run/supervisor.json"
            blocker.mkdir()
            os.kill(store.child_pid(Role.DISPATCHER), signal.SIGKILL)  # its restart is recorded
        wait_until(lambda: store.proc.poll() is not None, "the supervisor to stop", 30)
        log = store.log_text()
        assert store.proc.returncode == CliExit.FAILED, log[-3000:]
        assert f"flushing {file_name} failed" in log and "Is a directory" in log, log[-3000:]
        assert "mqstore: error" not in log, log[-3000:]
        blocker.rmdir()
        store.start()
        store.wait_ready()
        assert store.stop() == 0
        assert "mqstore: error" not in store.log_text()
    finally:
        if store.running:
            store.kill()
    assert check(store.root) == []
    log_file = CommitLog.open(store.root, TORTURE_STORE["commitlog_file_size"], Access.READ_ONLY)
    try:
        assert log_file.read_at(acked.commit_pos).body == b"m" * 100
    finally:
        log_file.close()
