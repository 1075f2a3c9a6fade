"""A full filesystem under the consume queues and the index: DiskFullError (never SIGBUS), nothing
of the batch written, and the same writes succeed, byte for byte, once space returns.

The files live on a small filesystem mounted by the test (a tmpfs; a loop-mounted ext4 image if
tmpfs cannot be mounted; skipped with both reasons if neither can), filled for real with a
ballast file, as tests/faults/test_disk_full.py does. A reference built the same way on the
ordinary disk gives the bytes the files must end with.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from engine.check.fsck import check
from engine.config import FlushPolicy, StoreConfig
from engine.errors import DiskFullError
from engine.files.mapped_file import RESERVE_STEP_BYTES, Access
from engine.files.naming import consume_queue_dir, index_shard_dir
from engine.formats.cq_entry import CQ_ENTRY_SIZE, FILLER_ENTRY, encode_cq_entry
from engine.formats.index_file import entry_pos, index_file_size
from engine.formats.java_hash import index_key_hash
from engine.index.file import IndexFile
from engine.index.shard import ShardIndex
from engine.queues.consume_queue import ConsumeQueue
from engine.status import PutStatus
from engine.store import MessageStore
from tools.torture.filesystems import (
    FilesystemUnavailable,
    MiB,
    fill,
    small_loop_ext4,
    small_tmpfs,
    unfill,
    unmount,
)

TOPIC = "Orders"
EPF = 64  # entries per consume-queue file: 1280-byte files, so a batch crosses several
FIXED_CLOCK_MS = 1_700_000_000_000


@pytest.fixture
def small_disk(tmp_path):
    mount_point = tmp_path / "disk"
    try:
        small_tmpfs(mount_point, 16 * MiB)
    except FilesystemUnavailable as tmpfs_error:
        try:
            small_loop_ext4(tmp_path / "disk.img", mount_point, 16 * MiB)
        except FilesystemUnavailable as loop_error:
            pytest.skip(f"no small filesystem: tmpfs: {tmpfs_error}; loop ext4: {loop_error}")
    yield mount_point
    unmount(mount_point)


def queue_at(root) -> ConsumeQueue:
    return ConsumeQueue.load(root, TOPIC, 0, EPF, Access.READ_WRITE)


def put_entries(queue: ConsumeQueue, start: int, stop: int) -> int:
    offsets = np.arange(start, stop)
    return queue.put_entries(offsets, offsets * 100, np.full(len(offsets), 100), offsets % 5)


def queue_bytes(root) -> dict[str, bytes]:
    directory = consume_queue_dir(root, TOPIC, 0)
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())} if directory.is_dir() else {}


def shard_at(root, slots: int, entries: int) -> ShardIndex:
    return ShardIndex.load(root, 0, slots, entries, Access.READ_WRITE, clock_ms=lambda: FIXED_CLOCK_MS)


def shard_bytes(root) -> dict[str, bytes]:
    directory = index_shard_dir(root, 0)
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())} if directory.is_dir() else {}


def key_batch(start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    numbers = np.arange(start, stop)
    hashes = np.array([index_key_hash(f"{TOPIC}#k{i}") for i in numbers], dtype=np.int64)
    return hashes, numbers * 100, 1_700_000_000_000 + numbers * 10


def test_consume_queue_batch_on_a_full_disk_writes_nothing_then_resumes(tmp_path, small_disk):
    root, ref_root = small_disk / "store", tmp_path / "ref"
    queue, ref = queue_at(root), queue_at(ref_root)
    assert put_entries(queue, 0, 10) == put_entries(ref, 0, 10) == 10
    before = queue_bytes(root)
    fill(small_disk, leave_bytes=0)
    with pytest.raises(DiskFullError):
        put_entries(queue, 10, 200)  # room in the first file, none for the three it crosses into
    assert queue.max_offset == 10 and queue.entry(10) is None
    assert queue_bytes(root)[min(before)] == before[min(before)]  # not even the first file's part
    with pytest.raises(DiskFullError):
        put_entries(queue, 10, 200)  # a retry while still full: the same
    unfill(small_disk)
    assert put_entries(queue, 10, 200) == put_entries(ref, 10, 200) == 190
    assert queue_bytes(root) == queue_bytes(ref_root)
    queue.close()
    assert queue_at(root).max_offset == 200


def test_new_consume_queue_on_a_full_disk_gets_its_first_page_once_space_returns(tmp_path, small_disk):
    root, ref_root = small_disk / "store", tmp_path / "ref"
    fill(small_disk, leave_bytes=0)
    queue = queue_at(root)
    with pytest.raises(DiskFullError):
        queue.put_entries([0], [0], [100], [7])
    with pytest.raises(DiskFullError):
        queue.put_entries([EPF + 3], [100], [100], [7])  # a queue starting past 0 writes fillers first
    assert (queue.min_offset, queue.max_offset) == (0, 0)
    assert all(not any(data) for data in queue_bytes(root).values())  # no entry, no filler
    unfill(small_disk)
    assert queue.put_entries([EPF + 3], [100], [100], [7]) == 1
    ref = queue_at(ref_root)
    ref.put_entries([EPF + 3], [100], [100], [7])
    assert queue_bytes(root) == queue_bytes(ref_root)
    assert queue_bytes(root)[min(queue_bytes(root))][:CQ_ENTRY_SIZE] == encode_cq_entry(*FILLER_ENTRY)


def test_index_entries_past_the_reserved_step_on_a_full_disk_give_disk_full(tmp_path, small_disk):
    """Entries are reserved ahead in steps; the batch that crosses a step on a full disk writes
    nothing (entries, slots and header as before) and the retry gives a never-failed file's bytes."""
    slots = 16
    entries = (RESERVE_STEP_BYTES + 2 * MiB) // 20  # a file a step and a half long
    first = (RESERVE_STEP_BYTES - entry_pos(slots, 0)) // 20 - 50  # entries below the step
    root, ref_root = small_disk / "store", tmp_path / "ref"
    shard, ref = shard_at(root, slots, entries), shard_at(ref_root, slots, entries)
    for index in (shard, ref):
        index.put_hashes(*key_batch(1, first))
    before = shard_bytes(root)
    fill(small_disk, leave_bytes=0)
    with pytest.raises(DiskFullError):
        shard.put_hashes(*key_batch(first, first + 100))
    assert shard_bytes(root) == before
    unfill(small_disk)
    for index in (shard, ref):
        index.put_hashes(*key_batch(first, first + 100))
    assert shard_bytes(root) == shard_bytes(ref_root)
    assert shard.query(TOPIC, f"k{first + 99}") == [(first + 99) * 100]


@pytest.mark.parametrize("keys", [30, 200], ids=["key_by_key", "vectorized"])
def test_index_keys_on_slot_pages_not_yet_allocated_on_a_full_disk_give_disk_full(tmp_path, small_disk, keys):
    """Slot pages are allocated when a key first hashes into them: a batch whose keys land on new
    pages of a full disk writes nothing (not a SIGBUS from a store into a hole) and the retry gives
    a never-failed file's bytes."""
    slots, entries = 64 * 1024, 4096  # 65 pages of header and slots; entries well inside a step
    root, ref_root = small_disk / "store", tmp_path / "ref"
    shard, ref = shard_at(root, slots, entries), shard_at(ref_root, slots, entries)
    for index in (shard, ref):
        index.put_hashes(*key_batch(0, 1))
    before = shard_bytes(root)
    fill(small_disk, leave_bytes=0)
    with pytest.raises(DiskFullError):
        shard.put_hashes(*key_batch(1, 1 + keys))
    assert shard_bytes(root) == before
    unfill(small_disk)
    for index in (shard, ref):
        index.put_hashes(*key_batch(1, 1 + keys))
    assert shard_bytes(root) == shard_bytes(ref_root)
    assert shard.query(TOPIC, f"k{keys}") == [keys * 100]


def test_shard_batch_that_rolls_on_a_full_disk_is_taken_back_whole(tmp_path, small_disk):
    root, ref_root = small_disk / "store", tmp_path / "ref"
    shard, ref = shard_at(root, 8, 32), shard_at(ref_root, 8, 32)  # 31 keys a file
    for index in (shard, ref):
        index.put_hashes(*key_batch(0, 20))
    before = shard_bytes(root)
    fill(small_disk, leave_bytes=0)
    with pytest.raises(DiskFullError):
        shard.put_hashes(*key_batch(20, 50))  # 11 fit, the new file for the rest does not
    assert shard_bytes(root) == before  # the 11 were taken back, the new file removed
    assert len(shard.files) == 1 and shard.files[0].index_count == 21
    with pytest.raises(DiskFullError):
        shard.put_record_keys(TOPIC, [f"r{i}" for i in range(12)], 5000, 1_700_000_001_000)
    assert shard_bytes(root) == before
    unfill(small_disk)
    for index in (shard, ref):
        index.put_hashes(*key_batch(20, 50))
    assert shard_bytes(root) == shard_bytes(ref_root)
    assert sorted(shard.query(TOPIC, "k3") + shard.query(TOPIC, "k45")) == [300, 4500]


def test_index_file_created_on_a_full_disk_leaves_no_file(small_disk):
    directory = small_disk / "index"
    directory.mkdir()
    fill(small_disk, leave_bytes=0)
    with pytest.raises(DiskFullError):
        IndexFile.create(directory / "20240101000000000", 64, 256)
    assert os.listdir(directory) == []
    unfill(small_disk)
    created = IndexFile.create(directory / "20240101000000000", 64, 256)
    assert created.path.stat().st_size == index_file_size(64, 256)
    created.close()


@pytest.fixture
def tmpfs_disk(tmp_path):
    """A small tmpfs: the filesystem whose read faults on a hole allocate the page."""
    mount_point = tmp_path / "tmpfs"
    try:
        small_tmpfs(mount_point, 16 * MiB)
    except FilesystemUnavailable as exc:
        pytest.skip(f"no tmpfs: {exc}")
    yield mount_point
    unmount(mount_point)


@pytest.mark.parametrize("access", [Access.READ_WRITE, Access.READ_ONLY])
def test_lookups_of_absent_keys_allocate_no_slot_page(tmpfs_disk, access):
    """A lookup reads a slot page never written without faulting it in: on tmpfs that fault
    allocates the page (a SIGBUS on a full one), so 200 lookups of absent keys would allocate
    most of the 64-page slot table."""
    slots, entries = 64 * 1024, 4096
    path = tmpfs_disk / "20240101000000000"
    created = IndexFile.create(path, slots, entries)
    created.put_key(f"{TOPIC}#k0", 100, FIXED_CLOCK_MS)
    created.sync()
    created.close()
    index_file = IndexFile.open(path, slots, entries, access)
    blocks_before = path.stat().st_blocks
    assert all(index_file.select(f"{TOPIC}#absent-{i}", 0, 2**62, 64) == [] for i in range(200))
    assert path.stat().st_blocks == blocks_before
    assert index_file.select(f"{TOPIC}#k0", 0, 2**62, 64) == [100]  # a key put is still found
    assert index_file.select(f"{TOPIC}#k0", 0, 2**62, 64) == [100]  # and again, through the mapping
    assert path.stat().st_blocks == blocks_before
    index_file.close()


@pytest.fixture
def store_with_full_index_disk(tmp_path):
    """A store whose index directory is its own small tmpfs (the commitlog's disk has room, so
    the put's disk check passes and the append succeeds), yielded with that mount point."""
    root = tmp_path / "store"
    index_dir = root / "index"
    config = StoreConfig(commitlog_file_size=256 << 10, queue_count=1, index_slot_count=100_000,
                         index_entry_count=1000, index_shards=1, flush=FlushPolicy.SYNC)
    MessageStore.open(root, config).close()  # a new store, whose index/ is then moved onto the tmpfs
    index_dir.rename(tmp_path / "index")
    try:
        small_tmpfs(index_dir, 16 * MiB)
    except FilesystemUnavailable as exc:
        pytest.skip(f"no tmpfs: {exc}")
    shutil.copytree(tmp_path / "index", index_dir, dirs_exist_ok=True)
    yield root, config, index_dir
    unmount(index_dir)


def test_put_whose_dispatch_meets_a_full_disk_is_put_ok_and_dispatched_by_the_next_put(
        store_with_full_index_disk):
    """The record is in the commitlog (durable under SYNC) before its index keys meet the full
    disk: the put is PUT_OK, not an error a caller would retry into a duplicate, and the next
    put once space returns indexes it."""
    root, config, index_dir = store_with_full_index_disk
    store = MessageStore.open(root, config)
    assert store.put(TOPIC, b"first", keys=["order-1"]).status is PutStatus.PUT_OK
    fill(index_dir, leave_bytes=0)
    written_before = store.commitlog.written_pos
    result = store.put(TOPIC, b"second", keys=["new-key"])  # a key on a slot page not yet allocated
    assert result.status is PutStatus.PUT_OK and result.commit_pos == written_before
    assert store.commitlog.flushed_pos > written_before  # durable, as PUT_OK says under SYNC
    assert store.query_by_key(TOPIC, "new-key") == []  # not indexed while the disk is full
    unfill(index_dir)
    assert store.put(TOPIC, b"third").status is PutStatus.PUT_OK
    [found] = store.query_by_key(TOPIC, "new-key")
    assert (found.commit_pos, found.body) == (result.commit_pos, b"second")
    got = store.get_messages(TOPIC, 0, 0)
    assert [m.body for m in got.messages] == [b"first", b"second", b"third"]  # no duplicate
    store.close()
    assert check(root) == []


def test_check_reads_no_hole_of_the_store_files(tmpfs_disk):
    """check reads consume queues and slot tables only where they hold data: a read fault on a
    hole allocates it on tmpfs (a whole 6 MB queue file here), and on a full one is a SIGBUS."""
    root = tmpfs_disk / "store"
    config = StoreConfig(commitlog_file_size=256 << 10, queue_count=1, index_slot_count=100_000,
                         index_entry_count=1000, index_shards=1)
    with MessageStore.open(root, config) as store:
        assert store.put(TOPIC, b"hello", keys=["order-1"]).status is PutStatus.PUT_OK
    files = [path for path in root.rglob("*") if path.is_file()]
    blocks_before = {path: path.stat().st_blocks for path in files}
    assert check(root) == []
    assert {path: path.stat().st_blocks for path in files} == blocks_before
