"""A read-only view of a store's records, for `mqstore query` and the console's lookups.

It opens the commitlog and the index files read-only, so it works with or without a running
supervisor; with one, reads stop at its published positions (flushed under sync flush, written
under async), so a reader never shows a record a crash could still take back.
"""

from __future__ import annotations

from pathlib import Path

from engine.errors import BadInputError, CorruptRecordError, NotAStoreError, StoreError
from engine.files.mapped_file import Access
from engine.files.naming import validate_topic
from engine.files.store_dir import StoreKind, inspect_store_dir, read_meta
from engine.formats.index_file import shard_of
from engine.formats.record import Record, Verify
from engine.index.shard import ShardIndex
from engine.log.commitlog import CommitLog
from engine.log.record_reads import read_key_records
from engine.topics.table import TopicTableFile
from ipc.control_block import ControlBlock


class ReadView:
    """Read-only commitlog + index of a store, bounded by a running supervisor's positions
    (`limit`, the first commit position not to read; None when no supervisor runs)."""

    def __init__(self, root: Path):
        if inspect_store_dir(root) is not StoreKind.MQSTORE:
            raise NotAStoreError("not an mqstore store (no store.json)", path=str(root))
        self.root = root
        self.meta = read_meta(root)
        self.commitlog = CommitLog.open(root, self.meta.commitlog_file_size, Access.READ_ONLY)
        self.limit = _readable_limit(root)

    def at(self, commit_pos: int) -> Record:
        """The record at `commit_pos`, checksum verified; BadInputError when there is none."""
        if commit_pos < 0 or (self.limit is not None and commit_pos >= self.limit):
            raise BadInputError("commit_pos", f"{commit_pos} is past the readable end {self.limit}")
        try:
            return self.commitlog.read_at(commit_pos, verify=Verify.MQSTORE)
        except CorruptRecordError as exc:
            raise BadInputError("commit_pos", f"no record at {commit_pos} ({exc.reason})") from None

    def by_key(self, topic: str, key: str, begin_ms: int, end_ms: int, max_count: int):
        """(records, corrupt records skipped) of `topic` with `key` (engine.log.record_reads)."""
        validate_topic(topic)
        if max_count < 1:
            raise BadInputError("max", f"{max_count} must be >= 1")
        shard_no = shard_of(topic, key, self.meta.index_shards)
        shard = ShardIndex.load(self.root, shard_no, self.meta.index_slot_count,
                                self.meta.index_entry_count, Access.READ_ONLY)
        try:
            candidates = shard.query(topic, key, begin_ms, end_ms, max_count * 4)
        finally:
            shard.close()
        end_pos = self.commitlog.segments.end_pos if self.limit is None else self.limit
        return read_key_records(self.commitlog, candidates, topic, key, begin_ms, end_ms,
                                max_count=max_count, end_pos=end_pos,
                                tombstone_pos=TopicTableFile(self.root).load().tombstone_of(topic))

    def close(self) -> None:
        self.commitlog.close()

    def __enter__(self) -> ReadView:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _readable_limit(root: Path) -> int | None:
    """A live supervisor's readable_pos; None when no supervisor serves the store (no control
    block, ServiceNotAvailableError being a StoreError, or a dead supervisor's leftover)."""
    try:
        ctl = ControlBlock.attach(root)
    except StoreError:
        return None
    with ctl:
        return ctl.readable_pos if ctl.supervisor_alive() else None
