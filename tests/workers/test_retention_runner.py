"""workers.retention_runner in-process, over a real commitlog, control block and group commit:
a pass whose batch of 10 left expired segments behind is followed by the next at once, not an
interval later, and each pass reads at most a batch and one segment's records.

Records are stamped 1970 (store time 1) and so are their files, so every sealed segment has
expired by either rule; the interval is an hour, so a pass after the first that runs without
it is a follow-up.
"""

from __future__ import annotations

import os
import time

import pytest

import engine.retention.segment_age as segment_age
from engine.config import FlushPolicy, StoreConfig
from engine.files.mapped_file import Access
from engine.log.commitlog import CommitLog
from engine.retention.expiry import RetentionReason
from ipc.control_block import ControlBlock, FlushCode
from ipc.shm import issue_shm_token, unlink_stale_regions
from ipc.wakeup import unlink_all
from tests.helpers import append_records
from workers.group_commit import GroupCommit
from workers.retention_runner import RetentionRunner

SEG = 4096  # one ~2.6 KiB record per segment
SEGMENTS = 35
CONFIG = StoreConfig(commitlog_file_size=SEG, flush=FlushPolicy.SYNC, file_reserved_hours=1,
                     disk_warn_ratio=0.001, clean_resource_interval_ms=3_600_000)  # expired go at any hour


def fill(log: CommitLog, count: int) -> None:
    append_records(log, count, "RT", 2500)


@pytest.fixture
def runner(tmp_path, monkeypatch):
    log = CommitLog.open(tmp_path, SEG, Access.READ_WRITE)
    issue_shm_token(tmp_path)
    ctl = ControlBlock.create(tmp_path, 1, FlushCode.SYNC)
    commit = GroupCommit(log, ctl, CONFIG, on_flushed=lambda: None)
    fill(log, SEGMENTS)
    for info in log.segments_info():  # expired by mtime too: the batch limit is what is tested
        os.utime(info.path, (0, 0))
    end = commit.publish_written(SEGMENTS)
    commit.flush_now()
    ctl.publish_dispatched(end)
    ctl.publish_cq_durable(end)
    ctl.publish_shard(0, end, end)
    reads: list[int] = []
    real_read = segment_age.read_segment_age
    monkeypatch.setattr(segment_age, "read_segment_age",
                        lambda commitlog, base_pos: reads.append(base_pos) or real_read(commitlog, base_pos))
    yield RetentionRunner(tmp_path, log, CONFIG, ctl, commit), reads
    log.close()
    ctl.close()
    unlink_stale_regions(tmp_path)
    unlink_all(tmp_path)


def test_a_pass_that_leaves_expired_segments_is_followed_by_another_at_once(runner):
    retention, reads = runner
    due_s = time.monotonic() + CONFIG.clean_resource_interval_ms / 1000
    assert retention.run_if_due(due_s - 1) is None  # the interval is not up
    removed, read_per_pass = [], []
    while (report := retention.run_if_due(due_s)) is not None:  # the clock stands still
        assert report.reason is RetentionReason.SPACE_WARN
        removed.append(len(report.segments_removed))
        read_per_pass.append(len(reads))
        reads.clear()
    assert removed == [10, 10, 10, 4]  # all 34 sealed segments within one interval; the active one stays
    assert max(read_per_pass) <= 11  # I/O of a pass: a batch, and the one that tells more are due
    assert retention.line.passes == 4 and retention.line.segments_removed == 34
    assert retention.run_if_due(due_s + 1) is None  # caught up: the next pass waits for the interval


def test_a_manual_pass_is_done_only_when_nothing_that_may_go_is_left(runner):
    retention, _ = runner
    wanted = retention.block.request_manual()
    now_s = time.monotonic()  # long before the scheduled pass
    more_due = []
    while retention.line.manual_done < wanted:
        report = retention.run_if_due(now_s)
        assert report is not None and report.reason is RetentionReason.SPACE_WARN
        more_due.append(report.more_due)
    assert more_due == [True, True, True, False]  # `mqstore clean` waits for all four passes
    assert retention.line.segments_removed == 34
    assert retention.run_if_due(now_s) is None
