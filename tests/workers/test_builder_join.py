"""An index builder applies the ring blocks that continue each other with one put_hashes
(IndexBuilder._join_continuing): the same index files as block by block, and a block after a
gap stays pending for the commitlog scan."""

from __future__ import annotations

import numpy as np

from engine.dispatch.record import KeyColumns, put_key_columns
from engine.files.mapped_file import Access
from engine.index.shard import ShardIndex
from ipc.key_ring import KeyRing
from ipc.shm import issue_shm_token, unlink_stale_regions
from workers.index_builder import IndexBuilder

SPAN = 1000  # commitlog bytes per block
TS0 = 1_700_000_000_000


def block_keys(block_no: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    count = block_no % 3 + 2
    i = np.arange(count, dtype=np.int64)
    return (block_no * 7919 + i * 104729) % 50_000, block_no * SPAN + 10 * i, TS0 + block_no * 1000 + i


def builder_over(root, ring: KeyRing) -> IndexBuilder:
    """An IndexBuilder with only what applying the ring reads: its shard index and the ring."""
    builder = IndexBuilder.__new__(IndexBuilder)
    builder.index = ShardIndex.load(root, 0, 101, 1000, Access.READ_WRITE, clock_ms=lambda: TS0)
    builder.ring, builder.reader = ring, ring.reader(0)
    builder._pending, builder.ring_bytes = None, 0
    return builder


def test_blocks_that_continue_each_other_are_put_once_and_index_what_each_alone_would(tmp_path, monkeypatch):
    issue_shm_token(tmp_path)
    ring = KeyRing.create(tmp_path, 1, generation=1, block_slots=16, key_slots=256)
    writer = ring.writer(0)
    for block_no in (0, 1, 2, 3, 6):  # 4..5 never handed on: a gap
        assert writer.publish(block_no * SPAN, (block_no + 1) * SPAN, *block_keys(block_no))
    builder = builder_over(tmp_path / "joined", ring)
    puts, put_hashes = [], builder.index.put_hashes

    def counted_put_hashes(*cols):
        puts.append(len(cols[0]))
        return put_hashes(*cols)

    monkeypatch.setattr(builder.index, "put_hashes", counted_put_hashes)
    builder._apply_ring(limit=10 * SPAN)
    assert builder.index.processed_pos == 4 * SPAN == builder.ring_bytes
    assert puts == [sum(len(block_keys(n)[0]) for n in range(4))]  # one put for blocks 0..3
    assert builder._pending.start_pos == 6 * SPAN  # after the gap: kept for the scan's end

    alone = ShardIndex.load(tmp_path / "alone", 0, 101, 1000, Access.READ_WRITE, clock_ms=lambda: TS0)
    for block_no in range(4):
        put_key_columns(alone, KeyColumns(*block_keys(block_no)), (block_no + 1) * SPAN)
    for shard in (builder.index, alone):
        shard.sync()
    assert [f.path.read_bytes() for f in builder.index.files] == [f.path.read_bytes() for f in alone.files]
    builder.index.close()
    alone.close()
    ring.close()
    unlink_stale_regions(tmp_path)
