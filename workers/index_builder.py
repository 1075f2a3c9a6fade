"""An index-builder process: owns index/<shard>/ and indexes the keys of its shard.

DESIGN §4 has the dispatcher hand each key to its shard. This implementation uses the simpler
equivalent the issue allows: every builder tails the same published position as the
dispatcher (flushed under sync flush, written under async) through its own read-only mapping of
the commitlog, and indexes only the keys that hash to its shard (engine.dispatch.key_hashes_and_shards,
CRC32C of `topic#key` modulo the shard count, then dispatch_columns_to_shard, the batch form of
dispatch_to_shard). No ring is needed and a
builder never waits for the dispatcher. The cost is CPU: each of the N builders scans every
record (CommitLog.scan_batches + DispatchColumns) and CRC32Cs every key to find its shard, so
that work is done N + 1 times instead of once; on a 2-core host the builders compete with the supervisor for
those cores at high rates. A ring fed by the dispatcher would parse once and is the upgrade path.

Every `cq_flush_interval_ms` the builder msyncs its files and publishes its durable position.
Restart: ShardIndex.load, trim_from(durable_pos) (entries past it go, slot heads repaired),
mark_processed(durable_pos), and continue; re-putting the trimmed keys rebuilds the same bytes.
"""

from __future__ import annotations

import logging

from engine.commitlog import CommitLog
from engine.config import FlushPolicy
from engine.dispatch import dispatch_columns_to_shard, key_hashes_and_shards
from engine.formats.record import Verify
from engine.hash_index import ShardIndex
from engine.mapped_file import Access
from ipc.control_block import GROUP_SIZE, SHARD_GROUP, SHARD_GROUPS_OFFSET, Role
from workers.child import ChildProcess, child_main, read_own_group
from workers.dispatcher import scan_window

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
        trimmed = self.index.trim_from(durable)
        self.index.mark_processed(durable)
        self.durable_pos = durable
        self.ctl.reset_shard(self.shard, durable, durable)
        self.sync_flush = self.ctl.flush_policy is FlushPolicy.SYNC
        log.info("index builder %d resumes at commit_pos %d (%d entries trimmed)", self.shard,
                 durable, trimmed)

    def _limit(self) -> int:
        return self.ctl.flushed_pos if self.sync_flush else self.ctl.written_pos

    def step(self) -> bool:
        start = self.index.processed_pos
        limit = self._limit()
        if limit <= start:
            return False
        scanner = scan_window(self.commitlog, start, limit)
        self._index(scanner)
        if scanner.pos == start:
            scanner = self.commitlog.scan_batches(start, limit, Verify.STRUCTURE)
            self._index(scanner)
        if scanner.pos > self.index.processed_pos:
            self.index.mark_processed(scanner.pos)
        if self.index.processed_pos > start:
            self.ctl.publish_shard(self.shard, self.index.processed_pos, self.durable_pos)
        return True

    def _index(self, scanner) -> None:
        for run in scanner:
            cols = run.columns()
            keys = key_hashes_and_shards(cols, self.shard_count)
            dispatch_columns_to_shard(self.index, cols, self.shard, keys)

    def flush(self) -> None:
        if self.durable_pos >= self.index.processed_pos:
            return
        self.durable_pos = self.index.sync()
        self.ctl.publish_shard(self.shard, self.index.processed_pos, self.durable_pos)

    def close(self) -> None:
        self.index.close()
        self.commitlog.close()


def main(argv: list[str] | None = None) -> None:
    child_main(IndexBuilder, argv)


if __name__ == "__main__":
    main()
