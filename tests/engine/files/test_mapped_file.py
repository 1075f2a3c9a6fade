"""MappedFile's flush and allocation: sync lets other threads run, leaves nothing dirty, raises
StoreError on EIO; reserve allocates blocks without filling the page cache; a fault under
ReadAhead.OWN_PAGE brings in its own page only; close unmaps."""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from engine.errors import DiskFullError, StoreError
from engine.files.filesystem import PAGE_BYTES
from engine.files.mapped_file import (
    FIRST_RESERVE_STEP_BYTES,
    RESERVE_STEP_BYTES,
    ZERO_AHEAD_BYTES,
    ZERO_LEAD_BYTES,
    ZERO_STEP_BYTES,
    Access,
    MappedFile,
    ReadAhead,
    reserve_end,
)
from tools.torture.filesystems import FilesystemUnavailable, MiB, ThinDisk, small_tmpfs, unmount

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long)
_LIBC.mmap.restype = ctypes.c_void_p
_LIBC.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_LIBC.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
MAP_FAILED = ctypes.c_void_p(-1).value


def resident_pages(path: Path, start_pos: int, end_pos: int) -> int:
    """How many pages of [start_pos, end_pos) are in the page cache (mincore on a fresh mapping)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        length = end_pos - start_pos
        addr = _LIBC.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, start_pos)
        assert addr != MAP_FAILED, os.strerror(ctypes.get_errno())
        try:
            vec = ctypes.create_string_buffer(-(-length // PAGE_BYTES))  # mincore fills a byte per page begun
            assert _LIBC.mincore(addr, length, vec) == 0, os.strerror(ctypes.get_errno())
            return sum(byte & 1 for byte in vec.raw)
        finally:
            _LIBC.munmap(addr, length)
    finally:
        os.close(fd)


def write_dirty(mapped: MappedFile, length: int) -> None:
    mapped.reserve(length)
    mapped.write(0, os.urandom(length))


def is_mapped_here(path: Path) -> bool:
    return str(path) in Path("/proc/self/maps").read_text()


# ------------------------------------------------------------------------------ sync


def test_sync_lets_another_thread_run_while_it_waits_for_the_disk(tmp_path):
    """With a switch interval far longer than the test, a thread waiting for the GIL gets it only
    when the holder releases it; so the helper runs before sync() returns only if sync released
    the GIL (CPython 3.11's mmap.flush does not: it would stop the appender for the whole msync)."""
    mapped = MappedFile.create(tmp_path / "f", 64 * MiB)
    interval = sys.getswitchinterval()
    try:
        sys.setswitchinterval(1000.0)
        ran_during_sync = False
        for _attempt in range(5):  # the helper may not yet wait for the GIL when a flush is short
            go, ran = threading.Event(), threading.Event()
            helper = threading.Thread(target=lambda go=go, ran=ran: (go.wait(), ran.set()))
            helper.start()
            write_dirty(mapped, 16 * MiB)
            go.set()  # the helper wakes and waits for the GIL, which this thread holds
            mapped.sync(0, 16 * MiB)
            ran_during_sync = ran.is_set()  # no GIL release between sync() and here
            helper.join()
            if ran_during_sync:
                break
        assert ran_during_sync, "another thread never ran while sync() flushed 16 MiB"
    finally:
        sys.setswitchinterval(interval)
        mapped.close()


def test_sync_leaves_no_dirty_page_in_the_range(tmp_path):
    """After sync the range's pages are clean: POSIX_FADV_DONTNEED drops clean pages (a dirty one
    stays until writeback finishes), so none of them is left in the page cache."""
    mapped = MappedFile.create(tmp_path / "f", 64 * MiB)
    try:
        write_dirty(mapped, 8 * MiB)
        assert resident_pages(mapped.path, 0, 8 * MiB) == 8 * MiB // PAGE_BYTES
        mapped.sync(0, 8 * MiB)
        fd = os.open(mapped.path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 8 * MiB, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        assert resident_pages(mapped.path, 0, 8 * MiB) == 0
        with open(mapped.path, "rb") as fh:  # and what is on disk is what was written
            assert fh.read(4096) == bytes(mapped.read(0, 4096))
    finally:
        mapped.close()


@pytest.fixture
def thin_disk(tmp_path):
    disk = ThinDisk(tmp_path / "thin", backing_bytes=6 * MiB, image_bytes=64 * MiB)
    try:
        (tmp_path / "thin").mkdir()
        disk.create()
    except FilesystemUnavailable as exc:
        disk.destroy()
        pytest.skip(f"no thin loop device: {exc}")
    yield disk
    disk.destroy()


def test_sync_raises_store_error_when_writeback_fails(thin_disk):
    """The bytes do not fit the thin disk's backing store: writeback fails and sync raises the
    StoreError naming the file (the supervisor stops on it), never returns as if durable."""
    path = thin_disk.mount_point / "f"
    mapped = MappedFile.create(path, 32 * MiB)
    try:
        write_dirty(mapped, 16 * MiB)
        with pytest.raises(StoreError, match="failed") as info:
            mapped.sync(0, 16 * MiB)
        assert info.value.path == str(path)
    finally:
        mapped.close()


# --------------------------------------------------------------------------- reserve


def test_reserve_allocates_blocks_without_filling_the_page_cache(tmp_path):
    """The blocks are the disk's (no SIGBUS on a full disk), the pages come with the writes: a
    read-ahead of each 4 MiB step stalled the dispatcher at every consume-queue reserve."""
    mapped = MappedFile.create(tmp_path / "f", 64 * MiB)
    try:
        mapped.reserve(RESERVE_STEP_BYTES)
        assert os.stat(mapped.path).st_blocks * 512 >= RESERVE_STEP_BYTES
        assert resident_pages(mapped.path, 0, RESERVE_STEP_BYTES) == 0
        mapped.write(0, b"kept")
        assert resident_pages(mapped.path, 0, RESERVE_STEP_BYTES) == 1
        assert bytes(mapped.read(0, 4)) == b"kept"
    finally:
        mapped.close()


def test_reserve_steps_double_from_64_kib_to_4_mib_then_go_by_4_mib(tmp_path):
    """A file's first write costs 64 KiB of disk, not a 4 MiB step; the steps then double, so a
    file written entry by entry takes one allocation a doubling, not one a write."""
    assert [reserve_end(n) for n in (0, 1, 64 << 10, (64 << 10) + 1, 3 << 20, 4 << 20, (4 << 20) + 1)] \
        == [64 << 10, 64 << 10, 64 << 10, 128 << 10, 4 << 20, 4 << 20, 8 << 20]
    mapped = MappedFile.create(tmp_path / "f", 16 * MiB)
    calls = []
    real_allocate = mapped.allocate
    mapped.allocate = lambda start, end: (calls.append((start, end)), real_allocate(start, end))
    try:
        mapped.reserve(20)
        assert os.stat(mapped.path).st_blocks * 512 == FIRST_RESERVE_STEP_BYTES
        for end in range(40, 9 * MiB, 20 * 1000):
            mapped.reserve(end)
        assert [end for _, end in calls] == [64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20,
                                             2 << 20, 4 << 20, 8 << 20, 12 << 20]
        assert [start for start, _ in calls[1:]] == [end for _, end in calls[:-1]]
    finally:
        mapped.close()


def test_allocate_stays_within_the_file(tmp_path):
    """A page past the end of a small file is not allocated: posix_fallocate would grow the file
    and change its size, which readers check."""
    mapped = MappedFile.create(tmp_path / "f", 5000)
    try:
        mapped.allocate(4096, 8192)
        mapped.allocate(6000, 9000)  # wholly past the end: nothing
        assert os.stat(mapped.path).st_size == 5000
        assert os.stat(mapped.path).st_blocks * 512 == 4096
    finally:
        mapped.close()


def faulted_pages(path: Path, read_ahead: ReadAhead) -> int:
    """Pages in the cache after one read fault in the middle of a 32 MiB reserved, unwritten file."""
    mapped = MappedFile.create(path, 32 * MiB, read_ahead)
    try:
        mapped.reserve(32 * MiB)
        assert mapped.buf[16 * MiB] == 0
        return resident_pages(mapped.path, 0, 32 * MiB)
    finally:
        mapped.close()


def test_a_fault_under_own_page_read_ahead_brings_in_its_own_page_only(tmp_path):
    """The kernel reads around a fault (read_ahead_kb; 8 MiB on the bench VM), zero-filling the
    reserved pages not yet written: ~22 ms of system time in an index builder every 8 MiB of
    entries, on both builders at once, which stalled the whole pipeline."""
    assert faulted_pages(tmp_path / "kernel", ReadAhead.KERNEL) > 1, "no read-around here to avoid"
    assert faulted_pages(tmp_path / "own", ReadAhead.OWN_PAGE) == 1


# ------------------------------------------------------------------------------ close


def test_close_unmaps_after_reserve_write_and_sync(tmp_path):
    """No buffer export outlives the calls (close() would then leave the file mapped)."""
    mapped = MappedFile.create(tmp_path / "f", 16 * MiB)
    write_dirty(mapped, 1 * MiB)
    mapped.sync(0, 1 * MiB)
    assert is_mapped_here(mapped.path)
    mapped.close()
    assert not is_mapped_here(mapped.path)


# ----------------------------------------------------------------------- reserve_zeroed


def fill_with(mapped: MappedFile, byte: int, length: int) -> None:
    mapped.write(0, bytes([byte]) * length)


def test_reserve_zeroed_keeps_what_lies_before_the_write_and_zeroes_ahead_of_it(tmp_path):
    """A reopened segment knows nothing reserved yet: the zeros start at the write, never at 0."""
    path = tmp_path / "f"
    mapped = MappedFile.create(path, 64 * MiB)
    fill_with(mapped, 0xAB, 2 * ZERO_AHEAD_BYTES + 2 * ZERO_STEP_BYTES)
    mapped.close()
    mapped = MappedFile.open(path, Access.READ_WRITE)
    try:
        mapped.reserve_zeroed(1000, 1010)
        target = -(-(1010 + ZERO_AHEAD_BYTES) // ZERO_STEP_BYTES) * ZERO_STEP_BYTES
        view = np.frombuffer(mapped.read(0, target + ZERO_STEP_BYTES), dtype=np.uint8)
        assert (view[:1000] == 0xAB).all()  # the records before the write are kept
        assert not view[1000:target].any()  # zeros through ZERO_AHEAD_BYTES past the write
        assert (view[target:] == 0xAB).all()  # and no further
    finally:
        mapped.close()


def test_reserve_zeroed_writes_nothing_inside_what_it_reserved_before(tmp_path):
    mapped = MappedFile.create(tmp_path / "f", 64 * MiB)
    try:
        mapped.reserve_zeroed(0, 10)
        mapped.write(0, b"record")
        mapped.reserve_zeroed(6, ZERO_AHEAD_BYTES)  # still inside the zeroed range
        assert bytes(mapped.read(0, 6)) == b"record"
        mapped.write(ZERO_AHEAD_BYTES, b"next")
        mapped.reserve_zeroed(ZERO_AHEAD_BYTES + 4, ZERO_AHEAD_BYTES + ZERO_STEP_BYTES + 1)  # past it
        assert bytes(mapped.read(0, 6)) == b"record"
        assert bytes(mapped.read(ZERO_AHEAD_BYTES, 4)) == b"next"
        assert not np.frombuffer(mapped.read(6, ZERO_AHEAD_BYTES - 6), dtype=np.uint8).any()
    finally:
        mapped.close()


def test_records_only_land_in_zeros_an_earlier_sync_committed(tmp_path, monkeypatch):
    """A write past the zeros (a segment's first) has its fresh zeros synced before it lands;
    later writes top up while still ZERO_LEAD_BYTES before the zeros' end, so they land in zeros
    the group commit's fdatasync committed before, and add no sync of their own."""
    synced: list[int] = []
    real_fdatasync = os.fdatasync

    def counting_fdatasync(fd: int) -> None:
        synced.append(fd)
        real_fdatasync(fd)

    monkeypatch.setattr("engine.files.mapped_file.os.fdatasync", counting_fdatasync)
    mapped = MappedFile.create(tmp_path / "f", 64 * MiB)
    try:
        mapped.reserve_zeroed(0, 4096)  # the segment's first write: fresh zeros, synced first
        assert len(synced) == 1 and mapped.data_ranges()[0][0] == 0
        pos, write_bytes = 4096, 60 << 10
        while pos < 8 * ZERO_AHEAD_BYTES:  # a group commit's worth at a time, as the appender writes
            reserved_before = mapped._reserved_until
            mapped.reserve_zeroed(pos, pos + write_bytes)
            assert pos + write_bytes <= reserved_before  # it lands in zeros of an earlier call
            assert mapped._reserved_until >= min(pos + write_bytes + ZERO_LEAD_BYTES, mapped.size_bytes)
            pos += write_bytes
        assert len(synced) == 1  # no sync of its own past the first
        big = ZERO_LEAD_BYTES + ZERO_STEP_BYTES + 1  # longer than the lead: past the zeros again
        mapped.reserve_zeroed(pos, mapped._reserved_until + big)
        assert len(synced) == 2
    finally:
        mapped.close()


def test_reserve_zeroed_blocks_are_allocated_data_not_holes(tmp_path):
    """The point of zero-filling: the blocks hold written data, so a later fdatasync converts no
    unwritten extents (SEEK_DATA finds them; the rest of the sparse file stays a hole)."""
    mapped = MappedFile.create(tmp_path / "f", 64 * MiB)
    try:
        mapped.reserve_zeroed(0, 1)
        mapped.sync(0, PAGE_BYTES)
        target = -(-(1 + ZERO_AHEAD_BYTES) // ZERO_STEP_BYTES) * ZERO_STEP_BYTES
        assert mapped.data_ranges() == [(0, target)]
        assert os.stat(mapped.path).st_blocks * 512 >= target
    finally:
        mapped.close()


def test_reserve_zeroed_on_a_full_filesystem_is_disk_full_and_keeps_the_records(tmp_path):
    mount_point = small_tmpfs(tmp_path / "mnt", 2 * MiB)
    try:
        mapped = MappedFile.create(mount_point / "f", 16 * MiB)
        try:
            mapped.write(0, b"record")
            for _ in range(2):  # nothing was counted as reserved: the second ask fails the same way
                with pytest.raises(DiskFullError) as info:
                    mapped.reserve_zeroed(6, 3 * MiB)  # the write itself needs 3 MiB on a 2 MiB filesystem
                assert info.value.path == str(mount_point / "f")
                assert bytes(mapped.read(0, 6)) == b"record"
        finally:
            mapped.close()
    finally:
        unmount(mount_point)


def test_reserve_zeroed_does_not_refuse_a_write_that_fits_when_the_zeros_ahead_do_not(tmp_path):
    """The zeros beyond the write are best effort: near a full disk a record that fits is written."""
    mount_point = small_tmpfs(tmp_path / "mnt", 2 * MiB)
    try:
        mapped = MappedFile.create(mount_point / "f", 16 * MiB)
        try:
            end = 3 * MiB // 2  # fits; end + ZERO_AHEAD_BYTES does not
            mapped.reserve_zeroed(0, end)
            mapped.write(0, b"\x07" * end)
            mapped.sync(0, end)
            assert bytes(mapped.read(end - 1, 1)) == b"\x07"
            assert mapped._reserved_until == end  # the next write asks for its own room again
        finally:
            mapped.close()
    finally:
        unmount(mount_point)


def test_create_on_a_failed_disk_raises_store_error_and_leaves_no_temp_file(thin_disk):
    """An EIO or EROFS while creating a file (the commitlog preallocating its next segment) is a
    StoreError the writer stops on, never a bare OSError that escapes the supervisor."""
    mapped = MappedFile.create(thin_disk.mount_point / "f", 32 * MiB)
    try:
        write_dirty(mapped, 16 * MiB)
        with pytest.raises(StoreError):
            mapped.sync(0, 16 * MiB)
    finally:
        mapped.close()
    path = thin_disk.mount_point / "g"
    with pytest.raises(StoreError, match="cannot create the file") as info:
        MappedFile.create(path, 32 * MiB)
    assert info.value.path == str(path)
    assert not path.with_name("g.tmp").exists()


def test_create_in_a_missing_directory_raises_store_error(tmp_path):
    path = tmp_path / "gone" / "f"
    with pytest.raises(StoreError, match="cannot create the file") as info:
        MappedFile.create(path, 1 * MiB)
    assert info.value.path == str(path) and not path.parent.exists()


def test_nonzero_end_is_past_the_last_nonzero_byte_and_reads_no_hole(tmp_path):
    """The offset just past the last non-zero byte at or after a start, read over the data ranges
    (None when there is none)."""
    mapped = MappedFile.create(tmp_path / "f", 16 * MiB)
    assert mapped.nonzero_end() is None  # all hole
    mapped.write(5 * MiB - 3, b"\x01\x00\x02\x00\x00")  # data, then zeros in the same page
    mapped.write(1000, b"\x07")
    assert mapped.nonzero_end() == 5 * MiB
    assert mapped.nonzero_end(5 * MiB) is None
    assert mapped.nonzero_end(2000) == 5 * MiB
    assert mapped.nonzero_end(1001) == 5 * MiB
    mapped.close()
