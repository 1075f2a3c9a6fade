"""A reader that loads files while retention deletes them (issue 20, item 1): a file listed and
gone when opened lies behind the retention line, with every file before it, so a read-only load
starts after it instead of failing; a writer's load still fails (nothing deletes its files).

The race is made without timing: the listed file is a dangling symlink, which the directory
listing shows and opening says is gone (FileNotFoundError), as for a file unlinked in between.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.config import StoreConfig
from engine.files.mapped_file import Access
from engine.files.naming import commitlog_dir, consume_queue_dir, index_shard_dir
from engine.index.shard import ShardIndex
from engine.log.commitlog import CommitLog
from engine.queues.table import ConsumeQueueTable
from engine.store import MessageStore

SEGMENT_BYTES = 4096
CONFIG = StoreConfig(commitlog_file_size=SEGMENT_BYTES, consume_queue_entries=4, index_slot_count=16,
                     index_entry_count=5, index_shards=1, queue_count=1)  # 4 keys per index file
BODY = b"b" * 2500  # one record per segment


@pytest.fixture
def store_root(tmp_path) -> Path:
    root = tmp_path / "store"
    with MessageStore.open(root, CONFIG) as store:
        for i in range(12):
            assert store.put("T", BODY, keys=(f"k{i}",)).status.name == "PUT_OK"
    return root


def vanish(path: Path) -> None:
    """Replace `path` with a dangling symlink: listed, but gone when opened."""
    path.unlink()
    os.symlink(path.parent / "gone-by-retention", path)


def test_a_commitlog_reader_starts_after_a_segment_that_went(store_root):
    paths = sorted(commitlog_dir(store_root).iterdir())
    vanish(paths[1])  # the ones before it went first (retention deletes from the front)
    log = CommitLog.open(store_root, SEGMENT_BYTES, Access.READ_ONLY)
    try:
        assert log.min_pos == 2 * SEGMENT_BYTES
        assert log.read_at(log.min_pos).body == BODY
    finally:
        log.close()
    with pytest.raises(FileNotFoundError):
        CommitLog.open(store_root, SEGMENT_BYTES, Access.READ_WRITE)


def test_a_consume_queue_reader_starts_after_a_file_that_went(store_root):
    paths = sorted(consume_queue_dir(store_root, "T", 0).iterdir())
    assert len(paths) >= 3
    vanish(paths[0])
    queues = ConsumeQueueTable.load(store_root, CONFIG.consume_queue_entries, Access.READ_ONLY)
    try:
        queue = queues.get("T", 0)
        assert queue.min_offset == CONFIG.consume_queue_entries
        assert queue.max_offset == 12
    finally:
        queues.close()


def test_an_index_reader_starts_after_a_file_that_went(store_root):
    paths = sorted(index_shard_dir(store_root, 0).iterdir())
    assert len(paths) >= 3
    vanish(paths[0])
    shard = ShardIndex.load(store_root, 0, CONFIG.index_slot_count, CONFIG.index_entry_count,
                            Access.READ_ONLY)
    try:
        assert len(shard.files) == len(paths) - 1
        assert shard.query("T", "k11", 0, 2**62, 4)  # the newest key is still found
        assert not shard.query("T", "k0", 0, 2**62, 4)  # the oldest went with its file
    finally:
        shard.close()
    with pytest.raises(FileNotFoundError):
        ShardIndex.load(store_root, 0, CONFIG.index_slot_count, CONFIG.index_entry_count,
                        Access.READ_WRITE)
