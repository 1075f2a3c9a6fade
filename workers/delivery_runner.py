"""The delivery service, run from the supervisor's loop: due delayed messages into their topics.

The supervisor is the only writer of the commitlog, so delivery lives in its loop rather than in
a child that would have to send its copies back as a producer. Each turn reads the
SCHEDULE_TOPIC_XXXX queues the dispatcher wrote (read-only, up to its published position),
appends the due messages' real-topic copies through the appender's door for store-made records
(Appender.append_store_made) and asks for their flush; config/delayOffset.json is written once
the flushed position passes every copy it counts (engine.delivery.scheduled says why that makes
delivery exactly once across crashes).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from engine.config import StoreConfig
from engine.delivery.scheduled import ScheduledDelivery, encode_deliveries
from engine.errors import DiskFullError
from engine.files.mapped_file import Access
from engine.log.commitlog import CommitLog
from engine.queues.table import ConsumeQueueTable
from ipc.control_block import ControlBlock
from workers.appender import Appender
from workers.group_commit import GroupCommit

DELIVERIES_PER_TURN = 4096  # a turn's appends stay one batch; a full turn is followed at once
POLL_INTERVAL_S = 0.02  # how often the queues are looked at when nothing is known to be due
SAVE_INTERVAL_S = 0.5  # the progress file at most this often (a restart rescans what is after it)
QUEUE_FILES_OPEN = 64  # SCHEDULE_TOPIC_XXXX files kept mapped (one queue per level)

log = logging.getLogger(__name__)


class DeliveryRunner:
    """Delivers due delayed messages from the supervisor's loop and keeps their progress."""

    def __init__(self, root: Path, commitlog: CommitLog, config: StoreConfig, ctl: ControlBlock,
                 appender: Appender, group_commit: GroupCommit):
        self._commitlog = commitlog
        self._ctl = ctl
        self._appender = appender
        self._group_commit = group_commit
        self._store_host = config.store_ip_port
        self.queues = ConsumeQueueTable(root, config.consume_queue_entries, Access.READ_ONLY,
                                        QUEUE_FILES_OPEN, delay_levels_ms=config.delay_levels_ms)
        self.delivery = ScheduledDelivery.load(root, config.delay_levels_ms, config.queue_count,
                                               time.time_ns() // 1_000_000)
        found = self.delivery.recover_delivered(commitlog, self.queues)
        if found:
            log.info("delivery: %d delayed message(s) were delivered after the last progress "
                     "save; they are not delivered again", found)
        self._next_at_s = 0.0
        self._saved_at_s = 0.0
        self._copies_end_pos = 0  # the end of the last copy appended: the save waits for its flush

    def wait_s(self, now_s: float) -> float:
        """How long the loop may wait before the next turn is due."""
        return max(0.0, self._next_at_s - now_s)

    def run_if_due(self, now_s: float) -> int:
        """One turn when due: append what is due, save the progress when flushed; copies appended."""
        appended = self._turn() if now_s >= self._next_at_s else 0
        self.maybe_save(now_s)
        return appended

    def _turn(self) -> int:
        now_ms = time.time_ns() // 1_000_000
        readable = range(self._commitlog.min_pos, self._ctl.dispatched_pos)
        plan = self.delivery.due(self.queues, self._commitlog.read_at, readable, now_ms, DELIVERIES_PER_TURN)
        if plan.deliveries:
            records = encode_deliveries(plan.deliveries, self._store_host)
            try:
                self._copies_end_pos = self._appender.append_store_made(
                    records, [d.topic for d in plan.deliveries], [d.queue_id for d in plan.deliveries])
            except DiskFullError as exc:  # nothing was written: the same messages are due next turn
                log.warning("delivery waits for disk space: %s", exc)
                self._next_at_s = time.monotonic() + SAVE_INTERVAL_S
                return 0
            self._group_commit.request(self._copies_end_pos)
        self.delivery.done(plan)
        full = len(plan.deliveries) >= DELIVERIES_PER_TURN
        wait_s = POLL_INTERVAL_S
        if plan.next_due_ms is not None:
            wait_s = min(wait_s, max(0.0, (plan.next_due_ms - now_ms) / 1000.0))
        self._next_at_s = time.monotonic() + (0.0 if full else wait_s)
        return len(plan.deliveries)

    def maybe_save(self, now_s: float, *, min_interval_s: float = SAVE_INTERVAL_S) -> None:
        """Write delayOffset.json when there is progress to save, the copies it counts are
        flushed and `min_interval_s` has passed since the last save."""
        if not self.delivery.unsaved or now_s - self._saved_at_s < min_interval_s:
            return
        if self._group_commit.published_flushed < self._copies_end_pos:
            return
        self.delivery.save(self._commitlog.written_pos)
        self._saved_at_s = now_s

    def waiting_pos(self) -> int | None:
        """The lowest delayed record not delivered yet: retention keeps the log from there."""
        return self.delivery.waiting_pos(self.queues)

    def close(self) -> None:
        self.queues.close()
