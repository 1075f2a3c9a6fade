"""GroupCommit.flush_if_idle: the appender flushes in its own thread when no flush runs, and is
told to hand off (never made to wait) while another flush holds the disk."""

from __future__ import annotations

import threading
import time

import pytest

from engine.config import FlushPolicy, StoreConfig
from engine.errors import ServiceNotAvailableError
from engine.files.mapped_file import Access
from engine.log.commitlog import CommitLog
from ipc.control_block import ControlBlock, FlushCode
from ipc.shm import issue_shm_token, unlink_stale_regions
from ipc.wakeup import unlink_all
from tests.helpers import append_records
from tests.workers.store_harness import wait_for
from workers.group_commit import GroupCommit

SEG = 1 << 20


def fill(log: CommitLog, count: int) -> None:
    append_records(log, count, "GC", 100)


@pytest.fixture
def rig(tmp_path):
    log = CommitLog.open(tmp_path, SEG, Access.READ_WRITE)
    issue_shm_token(tmp_path)
    ctl = ControlBlock.create(tmp_path, 1, FlushCode.SYNC)
    flushed_in: list[str] = []
    stall = tmp_path / "stall"
    commit = GroupCommit(log, ctl, StoreConfig(flush=FlushPolicy.SYNC),
                         on_flushed=lambda: flushed_in.append(threading.current_thread().name),
                         fault_stall_path=stall)
    yield log, ctl, commit, flushed_in, stall
    stall.unlink(missing_ok=True)
    log.close()
    ctl.close()
    unlink_stale_regions(tmp_path)
    unlink_all(tmp_path)


def test_an_idle_group_commit_is_flushed_by_the_caller(rig):
    log, ctl, commit, flushed_in, _ = rig
    fill(log, 3)
    written = commit.publish_written(3)
    assert commit.flush_if_idle(written) is True
    assert commit.published_flushed == ctl.flushed_pos == written == log.flushed_pos
    assert flushed_in == [threading.current_thread().name]
    assert commit.flush_if_idle(written) is True and len(flushed_in) == 1  # nothing new: no flush


def test_while_another_flush_holds_the_disk_the_caller_hands_off_without_waiting(rig):
    log, ctl, commit, flushed_in, stall = rig
    fill(log, 2)
    first = commit.publish_written(2)
    stall.touch()  # the next flush waits before its sync while this file exists
    other = threading.Thread(target=commit.flush_now, name="other-flush")
    other.start()
    wait_for(lambda: commit._flush_lock.locked(), "the other flush to start")
    fill(log, 1)
    second = commit.publish_written(1)
    assert commit.flush_if_idle(second) is False  # returned while the disk is still held
    assert commit.published_flushed < first and other.is_alive()
    stall.unlink()
    other.join(30)
    assert commit.published_flushed == ctl.flushed_pos == second and flushed_in == ["other-flush"]


def test_after_a_failed_sync_nothing_more_is_published_as_durable(rig):
    """Linux reports a lost write-back once: a second sync of the same range would succeed and
    make records whose write-back failed look durable."""
    log, ctl, commit, flushed_in, _ = rig
    fill(log, 2)
    written = commit.publish_written(2)
    commit.error = OSError(5, "Input/output error")  # as the flush that failed left it
    assert commit.flush_if_idle(written) is True  # nothing for the caller to hand off
    assert commit.published_flushed == ctl.flushed_pos == 0 and flushed_in == []


def test_the_flush_thread_serves_on_idle_while_the_appenders_flush_holds_the_disk(rig):
    """A flush requested while the appender's own flush is stuck must not park the flush thread
    on the flush lock: it keeps calling on_idle (the appender's sweep_if_stuck)."""
    log, _ctl, commit, flushed_in, stall = rig
    idle_calls: list[float] = []
    commit.on_idle = lambda: idle_calls.append(time.monotonic())
    commit.start()
    try:
        fill(log, 1)
        first = commit.publish_written(1)
        stall.touch()
        own = threading.Thread(target=commit.flush_if_idle, args=(first,), name="appender")
        own.start()
        wait_for(lambda: commit._flush_lock.locked(), "the appender's flush to start")
        fill(log, 1)
        commit.request(commit.publish_written(1))  # due, but the disk is held
        seen = len(idle_calls)
        wait_for(lambda: len(idle_calls) >= seen + 3, "the flush thread to keep calling on_idle")
        assert commit.published_flushed == 0
        stall.unlink()
        own.join(30)
        wait_for(lambda: commit.published_flushed == commit.published_written, "everything flushed")
    finally:
        stall.unlink(missing_ok=True)
        commit.stop()
    assert flushed_in[0] == "appender"


def test_flush_written_makes_everything_written_durable_and_returns_its_end(rig):
    log, ctl, commit, _, _ = rig
    fill(log, 3)
    written = commit.publish_written(3)
    assert commit.flush_written() == written == log.flushed_pos == ctl.flushed_pos


def test_flush_written_after_a_failed_sync_raises_and_flushes_nothing(rig):
    log, _, commit, _, _ = rig
    fill(log, 2)
    commit.publish_written(2)
    commit.error = OSError(5, "Input/output error")  # as the flush that failed left it
    with pytest.raises(ServiceNotAvailableError, match="Input/output error"):
        commit.flush_written()  # a delete asking for a durable tombstone is refused
    assert log.flushed_pos == 0


def test_flush_written_records_a_failing_sync_as_the_flush_threads_error(rig, monkeypatch):
    log, _, commit, _, _ = rig
    fill(log, 2)
    commit.publish_written(2)
    failure = OSError(28, "No space left on device")

    def failing_sync(start_pos, end_pos):
        raise failure

    monkeypatch.setattr(log.segments, "sync_range", failing_sync)
    with pytest.raises(ServiceNotAvailableError, match="No space left"):
        commit.flush_written()
    assert commit.error is failure  # the loop stops the store; the sync is never retried
