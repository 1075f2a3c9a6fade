"""ShardIndex's paced sync: the changed pages go to disk a piece at a time (page-cache dirty
counts from the cachestat syscall say which), the durable position is the one the sync began at,
and a trim, a roll or a full sync in between gives back what the sync had not written."""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

import numpy as np
import pytest

from engine.errors import ReadOnlyStoreError
from engine.files.filesystem import PAGE_BYTES
from engine.files.mapped_file import Access, MappedFile
from engine.formats.index_file import INDEX_ENTRY_SIZE, entry_pos, slot_pos
from engine.index.shard import ShardIndex

SLOTS = 16_384  # a 64 KiB slot table: 16 pages
ENTRIES = 4_096
PIECE = 4 * PAGE_BYTES
TS0 = 1_700_000_000_000
SYS_CACHESTAT = {"x86_64": 451, "aarch64": 451}.get(os.uname().machine)


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64)
                for name in ("cache", "dirty", "writeback", "evicted", "recently_evicted")]


def dirty_pages(path: Path, start: int, end: int) -> int:
    """Page-cache pages of [start, end) of `path` that are dirty (Linux cachestat, 6.5+)."""
    if SYS_CACHESTAT is None:
        pytest.skip(f"no cachestat syscall number known for {os.uname().machine}")
    fd = os.open(path, os.O_RDONLY)
    try:
        stat, span = _Stat(), _Range(start, end - start)
        if ctypes.CDLL(None, use_errno=True).syscall(SYS_CACHESTAT, fd, ctypes.byref(span),
                                                     ctypes.byref(stat), 0) != 0:
            code = ctypes.get_errno()
            if code == errno.ENOSYS:
                pytest.skip("this kernel has no cachestat (Linux 6.5+)")
            raise OSError(code, f"cachestat: {os.strerror(code)}")
        return stat.dirty + stat.writeback
    finally:
        os.close(fd)


def synced_shard(root: Path, keys: int, first_pos: int = 0) -> ShardIndex:
    """A shard with `keys` keys spread over the slot table, everything synced."""
    shard = ShardIndex.load(root, 0, SLOTS, ENTRIES, Access.READ_WRITE, clock_ms=lambda: TS0)
    put(shard, keys, first_pos)
    shard.sync()
    return shard


def put(shard: ShardIndex, keys: int, first_pos: int) -> None:
    """`keys` keys whose hashes land in every page of the slot table; commit_pos first_pos + i."""
    hashes = (np.arange(keys, dtype=np.int64) * 977 + first_pos) % SLOTS
    positions = np.arange(first_pos, first_pos + keys, dtype=np.int64)
    shard.put_hashes(hashes.astype(np.int32), positions, np.full(keys, TS0, dtype=np.int64))
    shard.mark_processed(first_pos + keys)


def one_piece_in(root: Path) -> tuple[ShardIndex, Path]:
    """A shard with 1,000 keys put since its last sync and a paced sync of them one piece in."""
    shard = synced_shard(root, 100)
    put(shard, 1000, 100)
    shard.begin_paced_sync(PIECE)
    shard.sync_piece()
    return shard, shard.files[-1].path


def test_pieces_write_the_changed_pages_one_piece_at_a_time(tmp_path):
    shard = synced_shard(tmp_path, 100)
    path = shard.files[-1].path
    put(shard, 1000, 100)
    slots_end = slot_pos(SLOTS)
    assert dirty_pages(path, 0, slots_end) >= SLOTS * 4 // PAGE_BYTES  # every slot page changed
    shard.begin_paced_sync(PIECE)
    assert shard.syncing
    assert shard.sync_piece() is None
    assert dirty_pages(path, 0, PIECE) == 0  # the first piece is on disk ...
    assert dirty_pages(path, PIECE, slots_end) > 0  # ... and nothing else yet
    pieces = 1
    while (durable := shard.sync_piece()) is None:
        pieces += 1
    # header and slot table, then the 1,000 new entries, each range cut in PIECE-byte pieces
    assert pieces + 1 == -(-slots_end // PIECE) + -(-(1000 * INDEX_ENTRY_SIZE) // PIECE)
    assert durable == 1100 and not shard.syncing
    assert dirty_pages(path, 0, os.path.getsize(path)) == 0
    shard.close()


def test_the_durable_position_is_the_one_the_sync_began_at(tmp_path):
    shard = synced_shard(tmp_path, 10)
    put(shard, 20, 10)
    shard.begin_paced_sync(PIECE)
    put(shard, 30, 30)  # keys after the start are not promised by this sync
    while (durable := shard.sync_piece()) is None:
        pass
    assert durable == 30 and shard.processed_pos == 60
    assert shard.sync() == 60  # the next sync has the rest
    shard.close()


def test_a_trim_during_a_paced_sync_gives_back_what_it_had_not_written(tmp_path):
    shard, path = one_piece_in(tmp_path)
    shard.trim_from(600)  # a full disk took a batch back (or recovery)
    assert not shard.syncing
    # what the cancelled sync took is dirty again for the next: entries from the last sync on
    taken = shard.files[-1].take_dirty_ranges()
    assert taken is not None
    assert (0, slot_pos(SLOTS)) in taken.ranges
    assert any(lo <= entry_pos(SLOTS, 101) < hi for lo, hi in taken.ranges)
    shard.files[-1].untake(taken)
    assert shard.sync() == 600
    assert dirty_pages(path, 0, os.path.getsize(path)) == 0
    shard.close()


def test_a_full_sync_during_a_paced_one_writes_everything(tmp_path):
    shard, path = one_piece_in(tmp_path)
    assert shard.sync() == 1100  # the stop's flush: what the paced sync took is written too
    assert not shard.syncing
    assert dirty_pages(path, 0, os.path.getsize(path)) == 0
    shard.close()


def test_a_roll_during_a_paced_sync_syncs_the_full_file_whole(tmp_path):
    shard, first = one_piece_in(tmp_path)
    put(shard, ENTRIES, 1100)  # fills the file: the roll syncs it whole
    assert len(shard.files) == 2 and not shard.syncing
    assert dirty_pages(first, 0, os.path.getsize(first)) == 0
    shard.close()


def test_nothing_changed_ends_at_once(tmp_path):
    shard = synced_shard(tmp_path, 10)
    shard.begin_paced_sync(PIECE)
    assert shard.sync_piece() == 10 and not shard.syncing
    shard.close()


def test_paced_sync_misuse_is_refused(tmp_path):
    shard = synced_shard(tmp_path, 10)
    with pytest.raises(ValueError, match="no paced sync"):
        shard.sync_piece()
    put(shard, 5, 10)
    shard.begin_paced_sync(PIECE)
    with pytest.raises(ValueError, match="already under way"):
        shard.begin_paced_sync(PIECE)
    shard.close()
    reader = ShardIndex.load(tmp_path, 0, SLOTS, ENTRIES, Access.READ_ONLY)
    with pytest.raises(ReadOnlyStoreError):
        reader.begin_paced_sync(PIECE)
    reader.close()


def test_mapped_file_sync_range_writes_only_its_pages(tmp_path):
    path = tmp_path / "f"
    mapped = MappedFile.create(path, 16 * PAGE_BYTES)
    mapped.reserve(16 * PAGE_BYTES)
    mapped.buf[:] = b"\x01" * (16 * PAGE_BYTES)
    mapped.sync_range(PAGE_BYTES + 100, 3 * PAGE_BYTES)  # an unaligned start covers its page
    assert dirty_pages(path, PAGE_BYTES, 3 * PAGE_BYTES) == 0
    assert dirty_pages(path, 0, PAGE_BYTES) == 1 and dirty_pages(path, 3 * PAGE_BYTES, 16 * PAGE_BYTES) == 13
    mapped.sync_range(15 * PAGE_BYTES, 99 * PAGE_BYTES)  # clipped at the end
    assert dirty_pages(path, 15 * PAGE_BYTES, 16 * PAGE_BYTES) == 0
    mapped.close()
