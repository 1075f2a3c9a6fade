"""Disk a store allocates and uses (engine.files.disk_use): at StoreConfig's defaults, a store of a few
messages costs a few MiB, not RocketMQ-sized reserve steps and slot tables (issue #32's 77 MB for
ten messages on 8 queues), and the used figures count the bytes that hold data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.config import StoreConfig
from engine.files.disk_use import DiskUse, store_disk_use
from engine.files.naming import offset_to_name
from engine.formats.cq_entry import CQ_ENTRY_SIZE
from engine.formats.index_file import INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, SLOT_SIZE
from engine.store import MessageStore
from tests.helpers import close_and_check

MiB = 1 << 20
QUEUES = 8


def du_bytes(directory: Path) -> int:
    """What `du` counts: the allocated blocks of every file."""
    return sum(os.stat(Path(d) / n).st_blocks * 512 for d, _, names in os.walk(directory) for n in names)


@pytest.mark.slow
def test_ten_messages_on_eight_queues_allocate_a_few_mib(tmp_path):
    root = tmp_path / "store"
    store = MessageStore.open(root, StoreConfig())
    results = [store.put("Orders", b"x" * 256, keys=[f"k{i}"], queue_id=i % QUEUES) for i in range(10)]
    assert close_and_check(store) == []
    assert du_bytes(root / "consumequeue") <= QUEUES * (64 << 10)  # was 8 x 4 MiB
    assert du_bytes(root / "index") <= 2 * (4096 + 10 * 4096 + (64 << 10))  # was 2 x 20 MiB of slots
    use = store_disk_use(root)
    assert {part: u.allocated_bytes for part, u in use.items()} == {
        part: du_bytes(root / part) for part in ("commitlog", "consumequeue", "index")}
    assert use["consumequeue"].used_bytes == 10 * CQ_ENTRY_SIZE
    keys = 2 * len(results)  # KEYS and the UNIQ_KEY of each message, in 2 shards
    assert use["index"].used_bytes == 2 * INDEX_HEADER_SIZE + keys * (SLOT_SIZE + INDEX_ENTRY_SIZE)
    reopened = MessageStore.open(root, StoreConfig())  # recovery takes files whose reserved tail is short
    try:
        end = results[-1].commit_pos + reopened.read_at(results[-1].commit_pos).total_size
        assert use["commitlog"].used_bytes == -(-end // 4096) * 4096  # to the last written page
        counts = [len(reopened.get_messages("Orders", q, 0).messages) for q in range(QUEUES)]
        assert counts == [2, 2] + [1] * 6
        assert reopened.query_by_key("Orders", "k9")[0].body == b"x" * 256
    finally:
        assert close_and_check(reopened) == []


def test_disk_use_of_leftovers_and_missing_parts_is_counted_not_refused(tmp_path):
    """What a crash leaves (a queue file created but never written, an index file shorter than a
    header) and a part not created yet are measured, never an error: status reads a live store."""
    assert store_disk_use(tmp_path) == {part: DiskUse() for part in ("commitlog", "consumequeue", "index")}
    queue_dir = tmp_path / "consumequeue" / "T" / "0"
    queue_dir.mkdir(parents=True)
    (queue_dir / offset_to_name(0)).write_bytes(b"\x01" * 200)  # a full 10-entry file
    (queue_dir / offset_to_name(200)).write_bytes(bytes(200))  # the next one, never written
    shard_dir = tmp_path / "index" / "0"
    shard_dir.mkdir(parents=True)
    (shard_dir / "20240101000000000.tmp").write_bytes(b"\x00" * 8)
    use = store_disk_use(tmp_path)
    assert use["consumequeue"] == DiskUse(du_bytes(tmp_path / "consumequeue"), 200)
    assert use["index"] == DiskUse(du_bytes(tmp_path / "index"), 0)
