"""engine.index.file: one RocketMQ IndexFile: put, select, header, trim, open checks."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

from engine.errors import CorruptIndexError
from engine.files.mapped_file import Access
from engine.formats.index_file import (
    INDEX_ENTRY,
    INDEX_HEADER_SIZE,
    SLOT_SIZE,
    decode_index_header,
    encode_index_header,
    entry_pos,
    slot_pos,
)
from engine.formats.java_hash import index_key_hash
from engine.index.file import IndexFile, IndexFileFullError
from engine.tuning import FEW_INDEX_KEYS
from tests.engine.files.test_mapped_file import resident_pages

TS0 = 1_700_000_000_000


def make_file(directory: Path, slots: int = 100, entries: int = 400, **seed) -> IndexFile:
    directory.mkdir(parents=True, exist_ok=True)
    return IndexFile.create(directory / "f", slots, entries, **seed)


def patch_file(path: Path, pos: int, data: bytes) -> None:
    """Write through the file, not the mapping (what a torn write-back leaves on disk)."""
    with open(path, "r+b") as fh:
        fh.seek(pos)
        fh.write(data)


def nonzero_slots(index_file: IndexFile) -> int:
    data = index_file.path.read_bytes()[slot_pos(0):slot_pos(index_file.slot_count)]
    return int(np.count_nonzero(np.frombuffer(data, dtype=">i4")))


# -- IndexFile (RocketMQ IndexFileTest) -------------------------------------------------------------


def test_index_file_put_key_400_entries_takes_399_keys_then_full(tmp_path):
    f = make_file(tmp_path)
    for i in range(398):
        f.put_key(str(i), i, TS0)
    assert not f.is_full
    f.put_key("398", 398, TS0)
    assert f.is_full and f.header.index_count == 400
    with pytest.raises(IndexFileFullError):
        f.put_key("400", 400, TS0)
    assert f.header.index_count == 400


def test_index_file_select_phy_offset_key_60_returns_exactly_its_offset(tmp_path):
    f = make_file(tmp_path)
    for i in range(399):
        f.put_key(str(i), i, TS0 + i)
    assert f.select("60", 0, 2**63 - 1, 10) == [60]
    assert f.select("not-there", 0, 2**63 - 1, 10) == []


def test_index_file_put_key_header_follows_rocketmq(tmp_path):
    f = make_file(tmp_path, slots=1, entries=10)
    assert f.header == decode_index_header(encode_index_header(f.header))
    assert (f.header.index_count, f.header.hash_slot_count, f.header.begin_ts_ms) == (1, 0, 0)
    f.put_key("a", 500, TS0)
    f.put_key("b", 600, TS0 + 2500)
    h = f.header
    assert (h.begin_commit_pos, h.end_commit_pos, h.begin_ts_ms, h.end_ts_ms) == (500, 600, TS0, TS0 + 2500)
    assert (h.hash_slot_count, h.index_count) == (1, 3)  # one slot, filled once
    buf = f.path.read_bytes()
    first = INDEX_ENTRY.unpack_from(buf, entry_pos(1, 1))
    second = INDEX_ENTRY.unpack_from(buf, entry_pos(1, 2))
    assert first == (index_key_hash("a"), 500, 0, 0)  # begin was 0: time_diff 0
    assert second == (index_key_hash("b"), 600, 2, 1)  # whole seconds since begin; chained to entry 1
    assert buf[slot_pos(0):slot_pos(0) + SLOT_SIZE] == (2).to_bytes(4, "big")


def test_index_file_select_forced_collisions_filters_by_hash_newest_first(tmp_path):
    f = make_file(tmp_path, slots=1, entries=200)
    for i in range(150):
        f.put_key(f"key{i % 5}", i * 10, TS0 + i * 1000)
    assert f.header.hash_slot_count == 1
    for k in range(5):
        assert f.select(f"key{k}", 0, 2**63 - 1, 1000) == [i * 10 for i in reversed(range(k, 150, 5))]
    assert f.select("key3", 0, 2**63 - 1, 4) == [1480, 1430, 1380, 1330]
    assert f.select("key3", TS0 + 20_000, TS0 + 40_000, 100) == [380, 330, 280, 230]
    assert f.select("key3", 0, 2**63 - 1, 0) == []


def test_index_file_select_same_java_hash_returns_both_for_caller_to_filter(tmp_path):
    f = make_file(tmp_path)
    assert index_key_hash("T#Aa") == index_key_hash("T#BB")  # Java hashCode collision
    f.put_key("T#Aa", 100, TS0)
    f.put_key("T#BB", 200, TS0)
    assert f.select("T#Aa", 0, 2**63 - 1, 10) == [200, 100]


def test_index_file_time_diff_clamped_and_zero_before_begin(tmp_path):
    f = make_file(tmp_path, slots=1, entries=10, seed_ts_ms=TS0, seed_commit_pos=0)
    f.put_key("a", 1, TS0 - 5000)  # before the seed: clamped to 0
    f.put_key("b", 2, TS0 + 2**42)  # far future: clamped to INT_MAX seconds
    buf = f.path.read_bytes()
    assert INDEX_ENTRY.unpack_from(buf, entry_pos(1, 1))[2] == 0
    assert INDEX_ENTRY.unpack_from(buf, entry_pos(1, 2))[2] == 2**31 - 1


# -- trim ------------------------------------------------------------------------------------------


def test_index_file_trim_restores_slot_heads_to_older_entries(tmp_path):
    f = make_file(tmp_path, slots=3, entries=50)
    for i in range(40):
        f.put_key(f"key{i % 4}", i, TS0 + i * 1000)
    assert f.trim_from(25) == 15
    assert f.index_count == 26
    for k in range(4):
        assert f.select(f"key{k}", 0, 2**63 - 1, 100) == list(reversed(range(k, 25, 4)))
    slots_used = len({index_key_hash(f"key{k}") % 3 for k in range(4)})
    assert f.header.hash_slot_count == nonzero_slots(f) == slots_used
    assert (f.header.end_commit_pos, f.header.end_ts_ms) == (24, TS0 + 24_000)


def test_index_file_trim_after_power_loss_drops_unflushed_and_torn_entries(tmp_path):
    """Entries past the last sync may be zero pages or torn; trimming to the durable position
    gives the bytes of a file that only ever held the durable entries."""
    f = make_file(tmp_path / "a", slots=4, entries=60)
    ref = make_file(tmp_path / "b", slots=4, entries=60)
    durable = [(f"key{i % 6}", i * 10, TS0 + i * 1000) for i in range(20)]
    for key, pos, ts in durable:
        f.put_key(key, pos, ts)
        ref.put_key(key, pos, ts)
    for i in range(20, 40):
        f.put_key(f"key{i % 6}", i * 10, TS0 + i * 1000)
    # entries 25..34 never reached the disk, entry 36 is torn (only its hash landed)
    patch_file(f.path, entry_pos(4, 25), bytes(entry_pos(4, 35) - entry_pos(4, 25)))
    patch_file(f.path, entry_pos(4, 36) + 4, bytes(16))
    f.trim_from(200)
    assert f.path.read_bytes() == ref.path.read_bytes()


def test_index_file_slot_heads_problem_is_a_zeroed_head_not_a_crash_s_leftovers(tmp_path):
    """A sound file, and one whose entries past the cut a trim would remove (a crash), have
    none; a zeroed head of a used slot, where the trim would leave the file as it is, is one."""
    f = make_file(tmp_path, slots=8, entries=60)
    for i in range(30):
        f.put_key(f"key{i % 11}", i * 10, TS0 + i)
    assert f.slot_heads_problem(300) is None
    assert f.slot_heads_problem(200) is None  # entries past the cut: the trim rewrites the header
    used = int(np.flatnonzero(np.frombuffer(f.path.read_bytes(), ">i4", 8, slot_pos(0)))[0])
    patch_file(f.path, slot_pos(used), bytes(SLOT_SIZE))
    assert f.slot_heads_problem(300) == f"{nonzero_slots(f)} slot heads are set, the header counts " \
        f"{nonzero_slots(f) + 1}"


def test_index_file_trim_repairs_slot_heads_past_a_stale_index_count(tmp_path):
    f = make_file(tmp_path / "a", slots=4, entries=60)
    ref = make_file(tmp_path / "b", slots=4, entries=60)
    for i in range(10):
        f.put_key(f"key{i}", i, TS0)
        ref.put_key(f"key{i}", i, TS0)
    durable_header = f.path.read_bytes()[:INDEX_HEADER_SIZE]
    for i in range(10, 13):
        f.put_key(f"key{i}", i, TS0)
    patch_file(f.path, 0, durable_header)  # the header page was written back before the new puts
    patch_file(f.path, entry_pos(4, 11), bytes(3 * (entry_pos(4, 1) - entry_pos(4, 0))))  # entries never
    assert f.trim_from(10) == 0
    assert f.path.read_bytes() == ref.path.read_bytes()
    for i in range(10):
        assert i in f.select(f"key{i}", 0, 2**63 - 1, 100)


# -- open checks -----------------------------------------------------------------------------------


@pytest.mark.parametrize("index_count", [0, -1, 401])
def test_index_file_open_bad_index_count_raises_corrupt(tmp_path, index_count):
    f = make_file(tmp_path)
    f.put_key("a", 1, TS0)
    header = decode_index_header(f.path.read_bytes())
    f.close()
    patch_file(f.path, 0, encode_index_header(dataclasses.replace(header, index_count=index_count)))
    with pytest.raises(CorruptIndexError, match="index_count"):
        IndexFile.open(f.path, 100, 400, Access.READ_WRITE)


def test_index_file_open_bad_hash_slot_count_or_size_raises_corrupt(tmp_path):
    f = make_file(tmp_path)
    f.put_key("a", 1, TS0)
    h = f.header
    f.close()
    patch_file(f.path, 0, encode_index_header(dataclasses.replace(h, hash_slot_count=5)))
    with pytest.raises(CorruptIndexError, match="hash_slot_count"):
        IndexFile.open(f.path, 100, 400, Access.READ_ONLY)
    with pytest.raises(CorruptIndexError):
        IndexFile.open(f.path, 100, 401, Access.READ_ONLY)


@pytest.mark.parametrize("reopen", [None, Access.READ_WRITE, Access.READ_ONLY])
def test_an_index_file_reads_no_pages_around_the_ones_it_touches(tmp_path, reopen):
    """The builder writes entries through the mapping, lookups follow chains through it: a fault
    on the entry area must not read the reserved, unwritten blocks around it (8 MiB here),
    neither in the file create() made nor in one open() maps."""
    slots, entries = 1024, 1_000_000  # the entries start on their own page; ~20 MB of them
    f = make_file(tmp_path, slots, entries)
    path = tmp_path / "f"
    first_page = entry_pos(slots, 1) - entry_pos(slots, 1) % 4096
    end = entry_pos(slots, entries + 1)
    try:
        for i in range(300):  # 6,000 bytes of entries: two pages
            f.put_key(f"T#k{i}", 100 + i, TS0)
        if reopen is not None:
            f.close()
            fd = os.open(path, os.O_RDONLY)
            try:  # out of the page cache, so the lookup below faults
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            f = IndexFile.open(path, slots, entries, reopen)
            assert f.select("T#k299", 0, TS0 + 1, 4) == [399]  # a slot, then an entry
        assert resident_pages(path, first_page, end) <= 2
    finally:
        f.close()


@pytest.mark.parametrize("batches", [(1, 5, FEW_INDEX_KEYS), (FEW_INDEX_KEYS + 1, 100), (3, 150, 1, 40)])
def test_index_file_put_hashes_key_by_key_and_vectorized_write_put_key_bytes(tmp_path, batches):
    """Up to FEW_INDEX_KEYS keys go key by key, more through numpy: both write what put_key writes,
    colliding slots and the first key's begin included."""
    keys = [f"T#k{i % 37}" for i in range(sum(batches))]  # repeats: chains inside and across batches
    positions = [1000 + 50 * i for i in range(len(keys))]
    times = [TS0 + 700 * i for i in range(len(keys))]
    one, many = make_file(tmp_path / "one", slots=13), make_file(tmp_path / "many", slots=13)
    for key, pos, ts in zip(keys, positions, times, strict=True):
        one.put_key(key, pos, ts)
    lo = 0
    for n in batches:
        hashes = np.array([index_key_hash(k) for k in keys[lo:lo + n]], dtype=np.int64)
        assert many.put_hashes(hashes, np.array(positions[lo:lo + n]), np.array(times[lo:lo + n])) == n
        lo += n
    one.sync()
    many.sync()
    assert one.path.read_bytes() == many.path.read_bytes()
    assert many.select("T#k5", TS0, TS0 + 10**9, 100) == [p for k, p in zip(keys, positions, strict=True)
                                                          if k == "T#k5"][::-1]


# -- disk use ---------------------------------------------------------------------------------------


def allocated_bytes(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def test_a_new_index_file_costs_a_page_of_disk_not_its_slot_table(tmp_path):
    """The default geometry's 20 MB slot table was allocated whole at creation; now a slot page
    is allocated when a key first hashes into it, and unallocated pages read as empty slots."""
    f = IndexFile.create(tmp_path / "f", 5_000_000, 20_000_000)  # StoreConfig's defaults
    try:
        assert allocated_bytes(f.path) <= 4096
        for i in range(10):
            f.put_key(f"T#k{i}", i * 100, TS0 + i)
        assert allocated_bytes(f.path) <= 4096 + 10 * 4096 + (64 << 10)  # header, slot pages, entries
        assert [f.select(f"T#k{i}", TS0, TS0 + 10, 4) for i in (0, 9)] == [[0], [900]]
        with open(f.path, "rb") as fh:  # the slot table as a reader of the file sees it
            fh.seek(slot_pos(0))
            slots = np.frombuffer(fh.read(5_000_000 * SLOT_SIZE), dtype=">i4")
        assert sorted(slots[slots != 0]) == list(range(1, 11))
    finally:
        f.close()
    reopened = IndexFile.open(tmp_path / "f", 5_000_000, 20_000_000, Access.READ_WRITE)
    try:
        reopened.put_key("T#k10", 1000, TS0 + 10)  # pages it does not know of are allocated again
        assert reopened.select("T#k10", TS0, TS0 + 10, 4) == [1000]
    finally:
        reopened.close()


def test_index_slot_pages_and_entries_are_allocated_once_not_once_a_put(tmp_path):
    """Each slot page is allocated at its first key and the entries by doubling steps, so puts
    past the first ones allocate nothing."""
    f = make_file(tmp_path, slots=8192, entries=40_000)  # 8 slot pages, 800 KB of entries
    calls = []
    real_allocate = f._mapped.allocate
    f._mapped.allocate = lambda start, end: (calls.append((start, end)), real_allocate(start, end))
    try:
        for i in range(5000):
            f.put_key(f"T#k{i}", i, TS0)
        hashes = np.array([index_key_hash(f"T#b{i}") for i in range(20_000)], dtype=np.int64)
        f.put_hashes(hashes, np.arange(20_000), np.full(20_000, TS0))
        slot_pages = [c for c in calls if c[1] <= entry_pos(8192, 0) + 4096]
        assert len(calls) <= 9 + 4  # 9 pages hold the header and slots; 64 KiB..512 KiB, then the file
        assert sum(end - start for start, end in slot_pages) <= 9 * 4096
        assert allocated_bytes(f.path) <= 9 * 4096 + (512 << 10) + 2 * 4096  # 500 KB of entries, not 800
    finally:
        f.close()


def test_a_file_whose_slots_fit_the_header_page_allocates_only_entries(tmp_path):
    """Header and slots in one page are allocated at creation, so no put allocates a slot page:
    the allocations are the entries' doubling steps alone."""
    f = make_file(tmp_path, slots=100, entries=8000)
    calls = []
    real_allocate = f._mapped.allocate
    f._mapped.allocate = lambda start, end: (calls.append((start, end)), real_allocate(start, end))
    try:
        assert f._slot_pages._unallocated_pages == 0
        for i in range(10):
            f.put_key(f"T#a{i}", i, TS0)
        f.put_hashes(np.arange(5000, dtype=np.int64), np.arange(5000), np.full(5000, TS0))
        base = entry_pos(100, 0)
        assert calls == [(base, base + (64 << 10)), (base + (64 << 10), base + (128 << 10))]
        assert f.select("T#a3", TS0, TS0, 4) == [3]
    finally:
        f.close()
