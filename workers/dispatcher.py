"""The dispatcher process: tails the commitlog and writes the consume queues (RocketMQ reput).

It reads the commitlog through its own read-only mapping, up to the supervisor's published
flushed position under sync flush (a consumer must never see a message a crash can take back)
or the written position under async flush. For each run of records (CommitLog.scan_batches: many
records per step, checked and decoded with whole-array operations) it writes the consume-queue
entries (engine.dispatch.dispatch_columns_to_consume_queues: one put_batch per queue, the rules
of dispatch_to_consume_queue), publishes `dispatched_pos` after each batch and wakes
long-polling consumers. Every `cq_flush_interval_ms` it msyncs the queues and publishes
`cq_durable_pos`, from which the supervisor's checkpoint is written.

Index keys are not handed on: each index builder tails the same published position and picks
its own shard's keys (see workers/index_builder.py for the trade-off).

Restart: ConsumeQueueTable.load + recover_all keeps every valid entry (a killed dispatcher's
page-cache writes survive it), then dispatch resumes from the published cq_durable_pos;
re-putting an entry that is already there is a no-op, so the restart leaves no gap and no
duplicate. The published dispatched_pos is left where the previous dispatcher put it (its
entries are still there), so consumers never see the queues shrink during a restart.
"""

from __future__ import annotations

import logging

from engine.commitlog import BatchScanner, CommitLog
from engine.config import FlushPolicy
from engine.consume_queue import ConsumeQueueTable
from engine.dispatch import dispatch_columns_to_consume_queues
from engine.formats.record import Verify
from engine.mapped_file import Access
from ipc.control_block import DISPATCHER_GROUP, DISPATCHER_GROUP_OFFSET, Role
from ipc.wakeup import WaiterTable
from workers.child import MAX_STEP_BYTES, ChildProcess, child_main, read_own_group

log = logging.getLogger(__name__)


def scan_window(commitlog: CommitLog, start_pos: int, limit_pos: int) -> BatchScanner:
    """A batch scanner (many records per step, structure checked) over at most MAX_STEP_BYTES
    from start_pos; the caller rescans to limit_pos if one record or filler is bigger."""
    return commitlog.scan_batches(start_pos, min(limit_pos, start_pos + MAX_STEP_BYTES),
                                  Verify.STRUCTURE)


class Dispatcher(ChildProcess):
    role = Role.DISPATCHER

    def boot(self) -> None:
        self.commitlog = CommitLog.open(self.store_dir, self.config.commitlog_file_size,
                                        Access.READ_ONLY)
        self.queues = ConsumeQueueTable.load(self.store_dir, self.config.consume_queue_entries,
                                             Access.READ_WRITE)
        self.queues.recover_all()
        published, durable, _ = read_own_group(self.ctl, DISPATCHER_GROUP_OFFSET, DISPATCHER_GROUP)
        # Re-dispatch from the durable position; entries up to `published` survived the
        # previous dispatcher (page cache), so consumers keep their view: it never goes back.
        self.pos = self.durable_pos = durable
        self.published_pos = published
        self.ctl.reset_dispatcher(published, durable)
        self.waiters = WaiterTable.attach(self.store_dir)
        self.sync_flush = self.ctl.flush_policy is FlushPolicy.SYNC
        log.info("dispatcher resumes at commit_pos %d (%d consume queues)", self.pos, len(self.queues))

    def _limit(self) -> int:
        return self.ctl.flushed_pos if self.sync_flush else self.ctl.written_pos

    def step(self) -> bool:
        limit = self._limit()
        if limit <= self.pos:
            return False
        scanner = scan_window(self.commitlog, self.pos, limit)
        count = self._dispatch(scanner)
        if scanner.pos == self.pos:  # one record larger than the window
            scanner = self.commitlog.scan_batches(self.pos, limit, Verify.STRUCTURE)
            count += self._dispatch(scanner)
        if scanner.pos > self.pos:
            self.pos = scanner.pos
            if self.pos > self.published_pos:
                self.ctl.publish_dispatched(self.pos, msg_count=count)
                self.published_pos = self.pos
                self.waiters.notify_waiters()
        return True

    def _dispatch(self, scanner: BatchScanner) -> int:
        """Consume-queue entries for every record of the scan (one put_batch per queue and run);
        returns the records scanned."""
        count = 0
        for run in scanner:
            cols = run.columns()
            dispatch_columns_to_consume_queues(self.queues, cols)
            count += cols.count
        return count

    def flush(self) -> None:
        if self.durable_pos >= self.pos:
            return
        pos = self.pos
        self.queues.flush_all()
        self.durable_pos = pos
        self.ctl.publish_cq_durable(pos)

    def close(self) -> None:
        self.waiters.close()
        self.queues.close()
        self.commitlog.close()


def main(argv: list[str] | None = None) -> None:
    child_main(Dispatcher, argv)


if __name__ == "__main__":
    main()
