"""The supervisor's retention pass (DESIGN §4 "Retention"; RocketMQ's CleanCommitLogService).

Every `clean_resource_interval_ms`, and at once when `mqstore clean` asks (the request word of
ipc/retention_block.py), one pass: measure the disk, plan with engine.retention.expiry (the delete
hour, disk pressure, never the active segment), remove the planned commitlog segments and
publish the new minimum commit position as the retention line. Each child then drops its own
consume-queue or index files below the line (workers/child_retention.py). A pass that left
segments behind that may go (its batch, engine.retention.expiry.DEFAULT_MAX_FILES, was full) is
followed by another of the same kind at the next loop turn, not an interval later: the horizon
holds at any write rate, and each pass's I/O stays one batch.

The line never passes what every process has made durable (the flushed position, the consume
queues' and each index shard's durable position): no child still has to read a segment that
goes, and a crash just after a pass recovers from positions at or past the line. Segments are
removed between two flushes (GroupCommit.run_between_flushes), since a flush walks the list.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from engine.config import StoreConfig
from engine.files.filesystem import disk_usage_ratio
from engine.log.commitlog import CommitLog
from engine.retention.expiry import (
    PassKind,
    RetentionReport,
    is_disk_full,
    plan_log,
    remove_segments,
)
from engine.retention.segment_age import SegmentAges
from ipc.control_block import ControlBlock
from ipc.retention_block import RetentionBlock, RetentionLine
from workers.group_commit import GroupCommit

FLUSH_WAIT_S = 0.01  # a pass waits this long for a running flush, else the next loop turn tries

log = logging.getLogger(__name__)


class RetentionRunner:
    """Runs retention passes from the supervisor's loop and publishes the line."""

    def __init__(self, root: Path, commitlog: CommitLog, config: StoreConfig, ctl: ControlBlock,
                 group_commit: GroupCommit):
        self._root = Path(root)
        self._commitlog = commitlog
        self._config = config
        self._ctl = ctl
        self._group_commit = group_commit
        self._interval_s = config.clean_resource_interval_ms / 1000.0
        self._next_at_s = time.monotonic() + self._interval_s
        self._follow_up: PassKind | None = None  # the kind of a pass due at once
        self._ages = SegmentAges()
        self.block = RetentionBlock(ctl)
        self.line = RetentionLine(commitlog.min_pos)
        # the lowest delayed record not yet delivered (DeliveryRunner.waiting_pos): kept unless
        # the disk forces cleaning; consumers' offsets hold nothing back, as in RocketMQ
        self.scheduled_pos: Callable[[], int | None] = lambda: None

    def publish_start(self) -> None:
        """The line at start: the commitlog's first position after recovery (a pass cut short
        before the children cleaned is finished by them when they boot)."""
        self.block.publish_line(self.line)

    def run_if_due(self, now_s: float) -> RetentionReport | None:
        """One pass when the interval is up, a manual pass is asked for, or the last pass left
        segments behind that may go; None otherwise, and when a flush held the disk (the next
        call tries again)."""
        requested = self.block.manual_requested()
        kind = PassKind.MANUAL if requested > self.line.manual_done else self._follow_up
        if kind is None:
            if now_s < self._next_at_s:
                return None
            kind = PassKind.SCHEDULED
        report = self._group_commit.run_between_flushes(lambda: self._pass(kind), FLUSH_WAIT_S)
        if report is None:
            return None
        self._next_at_s = now_s + self._interval_s
        self._follow_up = kind if report.more_due else None
        finished_manual = kind is PassKind.MANUAL and not report.more_due  # `mqstore clean` waits for it
        self._publish(report, requested if finished_manual else self.line.manual_done)
        if report.segments_removed or kind is PassKind.MANUAL:
            log.info("retention (%s, disk %.0f%% used): removed %d commitlog segment(s) %s; the "
                     "store now starts at commit_pos %d", report.reason.value,
                     report.disk_usage_ratio * 100, len(report.segments_removed),
                     report.segments_removed, report.min_commit_pos)
        return report

    def durable_end(self) -> int:
        """The lowest position every process has made durable: no segment past it may go."""
        snap = self._ctl.snapshot()
        return min(snap.flushed_pos, snap.cq_durable_pos, *snap.shard_durable_pos)

    def _pass(self, kind: PassKind) -> RetentionReport:
        ratio = disk_usage_ratio(self._root)
        plan = plan_log(self._commitlog, self._config, now_ms=int(time.time() * 1000),
                        usage_ratio=ratio, end_pos=self.durable_end(), ages=self._ages, kind=kind,
                        scheduled_pos=self.scheduled_pos())
        removed = remove_segments(self._commitlog, plan.base_positions)
        return RetentionReport(segments_removed=removed, disk_usage_ratio=ratio,
                               disk_full=is_disk_full(ratio, self._config), reason=plan.reason,
                               min_commit_pos=self._commitlog.min_pos, more_due=plan.more_due)

    def _publish(self, report: RetentionReport, manual_done: int) -> None:
        old = self.line
        removed = len(report.segments_removed)
        self.line = RetentionLine(
            min_commit_pos=report.min_commit_pos, passes=old.passes + 1,
            segments_removed=old.segments_removed + removed,
            bytes_removed=old.bytes_removed + removed * self._commitlog.segment_bytes,
            last_pass_ms=int(time.time() * 1000), manual_done=manual_done,
            last_reason=report.reason)
        self.block.publish_line(self.line)
