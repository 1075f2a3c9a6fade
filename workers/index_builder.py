"""An index-builder process: owns index/<shard>/ and indexes the keys of its shard.

The dispatcher hands each shard its keys (DESIGN §4) through the key ring (ipc/key_ring.py):
blocks of (key_hash, commit_pos, store_ts_ms) columns, each tagged with the commitlog range
[start_pos, end_pos) it covers, so a builder only does ShardIndex.put_hashes. The builder keeps
its own position (processed_pos, durable on its flush interval) and never trusts the ring for
more than the range a block names:

* a block that starts at or before its position and ends after it is applied (its keys at or
  past the position; the rest are already indexed), whatever dispatcher life published it;
* a block wholly behind its position is skipped (a restarted dispatcher re-dispatches);
* any range the ring does not give it is scanned from the commitlog as before
  (CommitLog.scan_batches + key_hashes_and_shards + dispatch_columns_to_shard): the range up
  to the next block when blocks were overwritten (a slow builder) or never written (a
  restart, a block too big for the ring), the range up to the dispatcher's published position
  when the dispatcher is past it and the ring has nothing for it, and everything up to the
  flushed position when there is no ring, when stopping, when retrying a write a full disk
  refused, or when the dispatcher made no progress for RING_PATIENCE_S (dead or stuck) while
  there was work.

Otherwise the builder waits for the dispatcher, which posts it after its steps (at most every
BUILDER_POST_INTERVAL_S, an owed post also when the dispatcher is idle).

Every `index_flush_interval_ms` the builder starts a paced sync of its index files
(ShardIndex.begin_paced_sync): one piece of at most SYNC_PIECE_BYTES every SYNC_PIECE_GAP_S,
and when the last piece is synced it publishes the position the sync began at as durable: the
slot table takes random writes, and one sync of it all would hold the commitlog's group commit
behind it (see docs/DECISIONS.md#paced-index-sync). On stop everything is synced at once.
Restart: ShardIndex.load, trim_for_recovery(durable_pos) (entries past it go, slot heads
repaired; a damaged entry below it makes the builder resume at the newest record it kept), and
continue; re-putting the trimmed keys rebuilds the same bytes.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from engine.config import FlushPolicy, StoreConfig
from engine.dispatch.record import (
    KeyColumns,
    dispatch_columns_to_shard,
    key_hashes_and_shards,
    put_key_columns,
)
from engine.errors import DiskFullError, StoreError
from engine.files.mapped_file import Access
from engine.index.shard import ShardIndex
from engine.log.commitlog import CommitLog, window_scans
from engine.retention.expiry import expire_shards
from ipc.control_block import GROUP_SIZE, SHARD_GROUP, SHARD_GROUPS_OFFSET, Role
from ipc.key_ring import KeyBlock, KeyRing, RingReader
from workers.child import ChildProcess, child_main, read_own_group
from workers.child_retention import LineFollower
from workers.step_window import MAX_STEP_BYTES

RING_PATIENCE_S = 0.5  # no dispatcher progress for this long while there is work: scan
RING_ATTACH_RETRY_S = 0.5
RING_ATTACH_FIRST_RETRY_S = 0.02  # doubling up to RING_ATTACH_RETRY_S: a builder that boots before
# the dispatcher has made the ring attaches within ms, not after scanning for half a second

SYNC_PIECE_BYTES = 1 << 20  # what one msync of a paced index sync writes at most
SYNC_PIECE_GAP_S = 0.1  # between pieces: at most ~10 MB/s of index writes a builder

log = logging.getLogger(__name__)


class IndexBuilder(ChildProcess):
    role = Role.INDEX_BUILDER

    def boot(self) -> None:
        cfg = self.config
        self.commitlog = CommitLog.open(self.store_dir, cfg.commitlog_file_size, Access.READ_ONLY)
        self.index = ShardIndex.load(self.store_dir, self.shard, cfg.index_slot_count,
                                     cfg.index_entry_count, Access.READ_WRITE)
        self.shard_count = self.ctl.shard_count
        _, durable = read_own_group(self.ctl, SHARD_GROUPS_OFFSET + self.shard * GROUP_SIZE,
                                    SHARD_GROUP)
        trimmed = self.index.trim_for_recovery(durable)  # lower when it took durable entries
        self.index.mark_processed(max(self.index.processed_pos, self.commitlog.min_pos))
        resume_pos = self.durable_pos = self.index.processed_pos  # all the trim kept is durable
        self._sync_interval_s = cfg.index_flush_interval_ms / 1000.0
        self._next_sync_at = time.monotonic() + self._sync_interval_s
        self.ctl.reset_shard(self.shard, resume_pos, resume_pos)
        self.sync_flush = self.ctl.flush_policy is FlushPolicy.SYNC
        self.ring: KeyRing | None = None
        self.reader: RingReader | None = None
        self._attach_at = 0.0
        self._attach_retry_s = RING_ATTACH_FIRST_RETRY_S
        self._pending: KeyBlock | None = None  # read from the ring, not applicable yet
        self._waiting_since: float | None = None
        self._dispatched_seen = -1
        self._write_failed = False  # the last step met a full disk
        self.ring_bytes = self.scanned_bytes = 0  # commitlog bytes indexed each way
        self.retention = LineFollower(self.ctl, Role.INDEX_BUILDER, self.shard, self.commitlog,
                                      lambda min_pos: expire_shards([self.index], min_pos))
        self._attach_ring()
        log.info("index builder %d resumes at commit_pos %d (%d entries trimmed, key ring %s)",
                 self.shard, resume_pos, trimmed, "on" if self.reader is not None else "off")

    def _limit(self) -> int:
        return self.ctl.flushed_pos if self.sync_flush else self.ctl.written_pos

    def step(self) -> bool:
        start = self.index.processed_pos
        limit = self._limit()
        if limit <= start:
            return False
        dispatched = self.ctl.dispatched_pos  # before the ring: blocks below it are published
        try:
            self._apply_ring(limit)
            pos = self.index.processed_pos
            if pos < limit:
                gap_end = self._gap_end(pos, limit, dispatched)
                if gap_end > pos:
                    self._scan(pos, gap_end)
        except DiskFullError:
            self._write_failed = True  # the retry must write again, not wait for the dispatcher
            raise
        if self.index.processed_pos == start:
            return False
        self._waiting_since = None
        self._write_failed = False
        self.ctl.publish_shard(self.shard, self.index.processed_pos, self.durable_pos)
        return True

    # -- the ring ------------------------------------------------------------------------------
    def _apply_ring(self, limit: int) -> None:
        """Apply ring blocks in order while they continue the position (at most
        MAX_STEP_BYTES of commitlog per step); one that does not is kept pending."""
        start = self.index.processed_pos
        while self.index.processed_pos - start < MAX_STEP_BYTES:
            pos = self.index.processed_pos
            block = self._pending if self._pending is not None else self._next_block(pos)
            self._pending = None
            if block is None:
                return
            if block.end_pos <= pos:
                continue  # behind: re-published by a restarted dispatcher
            if block.end_pos > limit:
                limit = self._limit()
            if block.start_pos > pos or block.end_pos > limit:
                self._pending = block
                return
            block = self._join_continuing(block, limit, start + MAX_STEP_BYTES)
            self._pending = block  # until its keys are in: a full disk retries it
            put_key_columns(self.index, KeyColumns(block.key_hash, block.commit_pos, block.store_ts_ms),
                            block.end_pos)
            self._pending = None
            self.ring_bytes += block.end_pos - pos

    def _join_continuing(self, block: KeyBlock, limit: int, step_end_pos: int) -> KeyBlock:
        """`block` joined with the blocks that continue it up to `limit` (while it ends before
        step_end_pos): one put_hashes for all of them, whose fixed cost is most of a small
        block's (the dispatcher publishes a block per step; a builder wakes for several)."""
        parts = [block]
        while self.reader is not None and parts[-1].end_pos < step_end_pos:
            following = self.reader.read_continuing(parts[-1].end_pos, limit)
            if following is None:
                break
            parts.append(following)
        if len(parts) == 1:
            return block
        return KeyBlock(parts[-1].block_no, block.start_pos, parts[-1].end_pos,
                        np.concatenate([p.key_hash for p in parts]),
                        np.concatenate([p.commit_pos for p in parts]),
                        np.concatenate([p.store_ts_ms for p in parts]))

    def _next_block(self, pos: int) -> KeyBlock | None:
        if self.reader is None or self.ring.retired:
            self._attach_ring()
            if self.reader is None:
                return None
        return self.reader.read(pos)

    def _attach_ring(self) -> None:
        """(Re)attach the dispatcher's ring; failed tries are retried after RING_ATTACH_FIRST_RETRY_S,
        doubling up to RING_ATTACH_RETRY_S."""
        now = time.monotonic()
        if now < self._attach_at:
            return
        self._attach_at = now + self._attach_retry_s
        self._attach_retry_s = min(2 * self._attach_retry_s, RING_ATTACH_RETRY_S)
        if self.ring is not None:
            self.ring.close()
            self.ring = self.reader = None
        try:
            self.ring = KeyRing.attach(self.store_dir, self.ctl.generation)
        except StoreError:
            return
        if self.ring.shard_count != self.shard_count:
            self.ring.close()
            self.ring = None
            return
        self.reader = self.ring.reader(self.shard)
        self._attach_retry_s = RING_ATTACH_FIRST_RETRY_S

    def _gap_end(self, pos: int, limit: int, dispatched: int) -> int:
        """Where to scan the commitlog to from `pos` (pos itself: wait for the dispatcher)."""
        if self._pending is not None:
            return pos if self._pending.start_pos <= pos else min(limit, self._pending.start_pos)
        if self.reader is None or self._stopping or self._write_failed:
            return limit  # stopping: the dispatcher may be gone; a failed write: retry it now
        if dispatched > pos:  # the dispatcher is past pos and the ring has no block for it
            return min(limit, dispatched)
        return limit if self._dispatcher_stalled(dispatched) else pos

    def _dispatcher_stalled(self, dispatched: int) -> bool:
        """True when the dispatcher's position has not moved for RING_PATIENCE_S while this
        builder waited for it."""
        now = time.monotonic()
        if self._waiting_since is None or dispatched != self._dispatched_seen:
            self._waiting_since, self._dispatched_seen = now, dispatched
            return False
        return now - self._waiting_since > RING_PATIENCE_S

    # -- the commitlog -------------------------------------------------------------------------
    def _scan(self, start: int, end: int) -> None:
        """Index [start, end) from the commitlog (at most MAX_STEP_BYTES, or one record)."""
        end_pos = start
        for scanner in window_scans(self.commitlog, start, end, MAX_STEP_BYTES):
            self._index(scanner)
            end_pos = scanner.pos
        if end_pos > self.index.processed_pos:
            self.index.mark_processed(end_pos)
        self.scanned_bytes += self.index.processed_pos - start

    def _index(self, scanner) -> None:
        for run in scanner:
            cols = run.columns()
            keys = key_hashes_and_shards(cols, self.shard_count)
            dispatch_columns_to_shard(self.index, cols, self.shard, keys)

    # -- durability and the end ----------------------------------------------------------------
    def flush_interval_s(self, config: StoreConfig) -> float:
        """A piece of a paced sync every SYNC_PIECE_GAP_S; a sync starts every index_flush_interval_ms."""
        return SYNC_PIECE_GAP_S

    def flush_step(self) -> None:
        """One piece of the paced sync under way, or a new one when it is due and there are
        keys not durable yet; publishes the durable position when a sync's last piece is done.
        First the index files below the retention line go (a sync under way is cancelled)."""
        self.retention.follow()
        if not self.index.syncing:
            now = time.monotonic()
            if now < self._next_sync_at or self.durable_pos >= self.index.processed_pos:
                return
            self._next_sync_at = now + self._sync_interval_s
            self.index.begin_paced_sync(SYNC_PIECE_BYTES)
        durable = self.index.sync_piece()
        if durable is not None:
            self._publish_durable(durable)

    def flush(self) -> None:
        """Everything durable now (the stop's flush)."""
        if self.durable_pos < self.index.processed_pos:
            self._publish_durable(self.index.sync())

    def _publish_durable(self, durable_pos: int) -> None:
        self.durable_pos = durable_pos
        self.ctl.publish_shard(self.shard, self.index.processed_pos, self.durable_pos)

    def close(self) -> None:
        log.info("index builder %d: %d bytes of commitlog indexed from the key ring, %d scanned",
                 self.shard, self.ring_bytes, self.scanned_bytes)
        if self.ring is not None:
            self.ring.remove_if_writer_gone()
            self.ring.close()
        self.index.close()
        self.commitlog.close()


def main(argv: list[str] | None = None) -> None:
    child_main(IndexBuilder, argv)


if __name__ == "__main__":
    main()
