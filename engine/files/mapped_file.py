"""One store file mapped whole (MappedFile): the only module that maps, reserves, writes, syncs
and zeroes store files. Whole-file operations (atomic writes, removal, directory fsync) are
engine.files.filesystem.

Segments are fixed-size and created sparse (ftruncate), so a 1 GiB default costs no disk
until written. Readers map read-only and see the writer's bytes through the page cache.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engine.errors import (
    DiskFullError,
    SegmentLayoutError,
    StoreClosedError,
    StoreError,
    StorePermissionError,
)
from engine.files.filesystem import DISK_FULL_ERRNOS, PAGE_BYTES, fsync_dir, remove_file
from engine.files.naming import TEMP_SUFFIX
from engine.files.owners import permission_hint

if TYPE_CHECKING:
    from engine.files.open_files import OpenFileBudget

# Reserves grow by doubling from FIRST_RESERVE_STEP_BYTES to RESERVE_STEP_BYTES, then go in steps of
# that: a queue with one entry costs 64 KiB of disk, not 4 MiB (see docs/DECISIONS.md#reserve-blocks-ahead)
FIRST_RESERVE_STEP_BYTES = 64 << 10
RESERVE_STEP_BYTES = 4 << 20
ZERO_CHUNK_BYTES = 1 << 20  # blocks are allocated ahead of the writer in steps of this size
_ZEROS_VIEW = memoryview(bytes(ZERO_CHUNK_BYTES))
ZERO_AHEAD_BYTES = 1 << 20  # reserve_zeroed keeps this much written zeros ahead of the writer
ZERO_STEP_BYTES = 256 << 10  # the zeros ahead end on a multiple of this
# Zeros are topped up while a write still ends this far before their end, so that the group
# commit's next fdatasync commits their blocks before any record lands in them (reserve_zeroed).
ZERO_LEAD_BYTES = 256 << 10
SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of the range's dirty pages, do not wait


class ReadAhead(Enum):
    """What a fault on a mapping reads. KERNEL: the kernel's read-around window, right for files
    read in order. OWN_PAGE (MADV_RANDOM): the faulting page only, for a file with a reserved,
    not-yet-written tail, which that window would zero-fill in one burst; the price is a slow
    cold read of a whole file (see docs/DECISIONS.md#read-ahead-own-page)."""

    KERNEL = "kernel"
    OWN_PAGE = "own page"


class Access(Enum):
    """How a file is mapped: the writer maps read-write, everyone else read-only."""

    READ_WRITE = "rw"
    READ_ONLY = "ro"

    @property
    def open_flags(self) -> int:
        """The os.open flags of a file mapped with this access."""
        return os.O_RDWR if self is Access.READ_WRITE else os.O_RDONLY


def page_floor(pos: int) -> int:
    return pos - pos % PAGE_BYTES


def reserve_end(used_bytes: int) -> int:
    """How far a region whose writes reach `used_bytes` from its start is reserved: the next power
    of two from FIRST_RESERVE_STEP_BYTES to RESERVE_STEP_BYTES, then the next multiple of
    RESERVE_STEP_BYTES. A growing region takes one allocation a doubling, never one a put."""
    if used_bytes <= RESERVE_STEP_BYTES:
        return max(FIRST_RESERVE_STEP_BYTES, 1 << (used_bytes - 1).bit_length())
    return -(-used_bytes // RESERVE_STEP_BYTES) * RESERVE_STEP_BYTES


class MappedFile:
    """One fixed-size file mapped whole; positions inside it are `file_pos`.

    With a `budget` (engine.files.open_files) the file may be parked, synced, unmapped and closed to
    bound the process's open files, and is mapped again on its next access."""

    def __init__(self, path: Path, size_bytes: int, fd: int, access: Access,
                 read_ahead: ReadAhead = ReadAhead.KERNEL, budget: OpenFileBudget | None = None):
        self.path = path
        self.size_bytes = size_bytes
        self.access = access
        self._read_ahead = read_ahead
        self._budget = budget
        self._reserved_until = 0
        self._closed = False
        self._map(fd)

    def _map(self, fd: int) -> None:
        """Map the file open on `fd` (taken over: closed here unless a writer keeps it)."""
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if self.access is Access.READ_WRITE else 0)
        try:
            self._mmap = mmap.mmap(fd, self.size_bytes, mmap.MAP_SHARED, prot)
            self._madvise()  # before the first fault
        except BaseException:
            with contextlib.suppress(AttributeError):
                self._mmap.close()
            os.close(fd)
            raise
        self._fd = fd if self.access is Access.READ_WRITE else -1
        if self._fd < 0:
            os.close(fd)
        self._view: memoryview | None = memoryview(self._mmap)
        if self._budget is not None:
            self._budget.opened(self)

    @property
    def buf(self) -> memoryview:
        """The whole mapping (mapped again first if the budget parked it)."""
        view = self._view
        if view is None or self._budget is not None:  # one test on the commitlog's hot path
            self._ensure_mapped()
            view = self._view
        return view

    @property
    def parked(self) -> bool:
        """True while the budget keeps the file closed (it reopens on the next access)."""
        return self._view is None

    def _ensure_mapped(self) -> None:
        if self._view is None:
            if self._closed:
                raise StoreClosedError("file is closed", path=str(self.path))
            self._remap()
        elif self._budget is not None:
            self._budget.touch(self)

    def _remap(self) -> None:
        try:
            fd = os.open(self.path, self.access.open_flags)
        except FileNotFoundError:
            raise SegmentLayoutError("file was removed while it was closed to bound open files",
                                     path=str(self.path)) from None
        self._map(fd)

    def park(self) -> None:
        """Sync a writer's file, then unmap and close it (engine.files.open_files.OpenFileBudget):
        nothing written is left for a later flush to reach through a closed file. The next
        access maps it again. A failed sync still closes it, then raises StoreError."""
        if self._view is None:
            return
        try:
            if self.access is Access.READ_WRITE:
                try:
                    os.fdatasync(self._fd)
                except OSError as exc:
                    raise StoreError(f"fdatasync before closing failed: {exc}",
                                     path=str(self.path)) from exc
        finally:
            self._unmap()

    @classmethod
    def create(cls, path: Path, size_bytes: int, read_ahead: ReadAhead = ReadAhead.KERNEL,
               budget: OpenFileBudget | None = None) -> MappedFile:
        """Create a new sparse file of `size_bytes` (owner-only) and map it read-write.

        It is sized under a temporary name and renamed, so a crash never leaves a short file
        under a segment name (only a `.tmp` file, which the writer's load removes: see
        settled_names). A failure is
        DiskFullError or StoreError (EIO, EROFS), never a bare OSError: the writer stops cleanly.
        """
        path = Path(path)
        if path.exists():
            raise FileExistsError(path)
        tmp = path.with_name(path.name + TEMP_SUFFIX)
        with _disk_full_as_error(path, "create the file"):
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.ftruncate(fd, size_bytes)
                os.rename(tmp, path)
                fsync_dir(path.parent)
            except OSError:
                os.close(fd)
                with contextlib.suppress(OSError):  # a failed disk may refuse this too
                    tmp.unlink(missing_ok=True)
                raise
        return cls(path, size_bytes, fd, Access.READ_WRITE, read_ahead, budget)

    @classmethod
    def open(cls, path: Path, access: Access, expected_bytes: int | None = None,
             read_ahead: ReadAhead = ReadAhead.KERNEL, budget: OpenFileBudget | None = None) -> MappedFile:
        """Map an existing file; a size other than `expected_bytes` is a layout error."""
        path = Path(path)
        try:
            fd = os.open(path, access.open_flags)
        except PermissionError:
            raise StorePermissionError("no permission to open store file", path=str(path),
                                       hint=permission_hint(path)) from None
        size_bytes = os.fstat(fd).st_size
        if expected_bytes is not None and size_bytes != expected_bytes:
            os.close(fd)
            raise SegmentLayoutError(
                f"file is {size_bytes} bytes, expected {expected_bytes}", path=str(path))
        if size_bytes == 0:
            os.close(fd)
            raise SegmentLayoutError("file is empty", path=str(path))
        return cls(path, size_bytes, fd, access, read_ahead, budget)

    def advise(self, read_ahead: ReadAhead) -> None:
        """Set what a fault reads from now on (ReadAhead); a file that stops growing can go
        back to the kernel's window."""
        self._read_ahead = read_ahead  # a parked file takes it up when mapped again
        if self._view is not None:
            self._madvise()

    def _madvise(self) -> None:
        self._mmap.madvise(mmap.MADV_RANDOM if self._read_ahead is ReadAhead.OWN_PAGE
                           else mmap.MADV_NORMAL)

    def reserve(self, end_file_pos: int, base_pos: int = 0) -> int:
        """Allocate disk blocks up to end_file_pos, rounded up by `reserve_end` from `base_pos`
        (where the growing region starts: 0 for a segment, entry 0 for an index file) within the
        file, before writing through the map; returns the end now reserved.

        A write into an unallocated page of a sparse mapped file on a full disk kills the process
        with SIGBUS; allocating first turns that into DiskFullError while nothing is written.
        The pages are not read ahead here: the writer's own writes fill them a page at a time,
        where a WILLNEED would zero-fill a whole step inside a dispatcher step
        (see docs/DECISIONS.md#reserve-blocks-ahead).
        """
        if end_file_pos <= self._reserved_until:
            return self._reserved_until
        target = min(self.size_bytes, base_pos + reserve_end(end_file_pos - base_pos))
        self.allocate(max(self._reserved_until, base_pos), target)
        self._reserved_until = target
        return target

    def allocate(self, start_pos: int, end_pos: int) -> None:
        """Allocate disk blocks for [start_pos, end_pos) within the file (posix_fallocate:
        unwritten extents, read as zeros; it never grows the file); DiskFullError when the disk
        has no room, with nothing written. For a writer that tracks what it reserved itself."""
        end_pos = min(end_pos, self.size_bytes)
        if end_pos <= start_pos:
            return
        self._ensure_mapped()
        with _disk_full_as_error(self.path, "allocate file blocks"):
            os.posix_fallocate(self._fd, start_pos, end_pos - start_pos)

    def reserve_zeroed(self, write_file_pos: int, end_file_pos: int) -> None:
        """Reserve blocks for a write of [write_file_pos, end_file_pos) by writing zeros from there
        to ZERO_AHEAD_BYTES beyond (rounded up to ZERO_STEP_BYTES) and start their writeback;
        bytes before write_file_pos are kept.

        Unlike reserve() (posix_fallocate: unwritten extents), the fdatasync that later makes
        records here durable finds allocated, written blocks and converts no extents in a journal
        commit; the blocks are written twice. The zeros ahead stay short, since the group commit's
        fdatasync waits for those in flight (see docs/DECISIONS.md#zeros-ahead).

        Records only land in zeros whose blocks an earlier fdatasync committed: after a write
        error aborts ext4's journal, an fdatasync racing the failed commit can report success
        for blocks that commit allocated, and records in them are lost with the allocation
        (see docs/DECISIONS.md#zeros-committed-first). So a top-up runs while the write still
        ends ZERO_LEAD_BYTES before the zeros' end, and a write that goes past the zeros (the
        first of a segment, or one longer than the lead) has its fresh zeros synced before it
        is made. DiskFullError when the disk has no room for [write_file_pos, end_file_pos);
        the zeros beyond are best effort.
        """
        if end_file_pos + ZERO_LEAD_BYTES <= self._reserved_until or self._reserved_until >= self.size_bytes:
            return
        end_file_pos = min(end_file_pos, self.size_bytes)
        fresh = end_file_pos > self._reserved_until  # the write itself needs zeros made now
        start = max(self._reserved_until, write_file_pos)
        target = self._step_end(end_file_pos + ZERO_AHEAD_BYTES, ZERO_STEP_BYTES)
        self._ensure_mapped()
        if fresh:
            with _disk_full_as_error(self.path, "write zeros ahead"):
                self._write_zeros(start, end_file_pos)  # what the write needs: DiskFullError if no room
        ahead_from = max(start, end_file_pos)
        reached = target
        try:
            self._write_zeros(ahead_from, target)
        except OSError as exc:  # ahead is best effort: a record that fits is not refused for it
            if exc.errno not in DISK_FULL_ERRNOS:
                raise StoreError(f"cannot write zeros ahead: {exc}", path=str(self.path)) from exc
            reached = ahead_from
        if fresh:
            self._fdatasync()  # their blocks committed before the write lands in them
        else:
            _start_writeback(self._fd, start, reached - start)
        self._reserved_until = reached  # >= what it was: ahead_from starts at it or past it

    def _write_zeros(self, start_pos: int, end_pos: int) -> None:
        for pos in range(start_pos, end_pos, ZERO_CHUNK_BYTES):
            self._pwrite_all(_ZEROS_VIEW[:min(ZERO_CHUNK_BYTES, end_pos - pos)], pos)

    def _step_end(self, file_pos: int, step_bytes: int) -> int:
        """file_pos rounded up to a multiple of step_bytes, within the file."""
        return min(self.size_bytes, -(-file_pos // step_bytes) * step_bytes)

    def write(self, file_pos: int, data) -> None:
        """Write `data` at `file_pos` with pwrite (the mapping sees it: one page cache).

        Not a copy into the mapping: a store into a mapped page can block in the page fault
        (ext4 waits there for the journal or that page's writeback), and pwrite does not
        (see docs/DECISIONS.md#pwrite-not-mapped-stores). Blocks must be reserved first."""
        with _disk_full_as_error(self.path, "write store file"):
            self._pwrite_all(data, file_pos)

    def _pwrite_all(self, data, file_pos: int) -> None:
        self._ensure_mapped()
        with memoryview(data) as view:
            view = view.cast("B")
            done, total = 0, len(view)
            while done < total:
                done += os.pwrite(self._fd, view[done:], file_pos + done)

    def read(self, file_pos: int, length: int) -> memoryview:
        """A zero-copy view of `length` bytes at `file_pos` (clamped to the file)."""
        return self.buf[file_pos:min(file_pos + length, self.size_bytes)]

    def zero(self, start_pos: int, end_pos: int) -> None:
        """Overwrite [start_pos, end_pos) with zeros so stale bytes cannot come back."""
        end_pos = min(end_pos, self.size_bytes)
        step = 1 << 20
        for pos in range(start_pos, end_pos, step):
            n = min(step, end_pos - pos)
            self.buf[pos:pos + n] = bytes(n)

    def data_ranges(self, start_pos: int = 0, end_pos: int | None = None) -> list[tuple[int, int]]:
        """Sub-ranges of [start_pos, end_pos) that may hold data; holes of the sparse file are skipped.

        SEEK_DATA/SEEK_HOLE account for dirty page-cache pages, so bytes written through the
        mapping but not yet synced are reported as data.
        """
        end_pos = self.size_bytes if end_pos is None else min(end_pos, self.size_bytes)
        fd = os.open(self.path, os.O_RDONLY)
        ranges = []
        try:
            pos = start_pos
            while pos < end_pos:
                try:
                    data = os.lseek(fd, pos, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # only a hole remains
                        break
                    return [(start_pos, end_pos)]  # no SEEK_DATA here: treat all as data
                if data >= end_pos:
                    break
                hole = min(os.lseek(fd, data, os.SEEK_HOLE), end_pos)
                ranges.append((data, hole))
                pos = hole
        finally:
            os.close(fd)
        return ranges

    def is_zero(self, start_pos: int = 0, end_pos: int | None = None) -> bool:
        """True when every byte of [start_pos, end_pos) is zero (holes are not read)."""
        for lo, hi in self.data_ranges(start_pos, end_pos):
            for pos in range(lo, hi, ZERO_CHUNK_BYTES):
                if np.frombuffer(self.buf[pos:min(pos + ZERO_CHUNK_BYTES, hi)], dtype=np.uint8).any():
                    return False
        return True

    def nonzero_end(self, start_pos: int = 0) -> int | None:
        """The offset just past the file's last non-zero byte at or after `start_pos`; None when
        there is none. Read back a chunk at a time over the data ranges only: a read fault on a
        hole allocates the page on tmpfs (SIGBUS when it is full)."""
        for lo, hi in reversed(self.data_ranges(start_pos)):
            for stop in range(hi, lo, -ZERO_CHUNK_BYTES):
                chunk = np.frombuffer(self.buf[max(stop - ZERO_CHUNK_BYTES, lo):stop], dtype=np.uint8)
                if chunk.any():
                    return stop - int(np.argmax(chunk[::-1] != 0))
        return None

    def zero_nonzero(self, start_pos: int, end_pos: int | None = None) -> None:
        """Zero [start_pos, end_pos), writing only chunks that hold something (keeps holes holes)."""
        for lo, hi in self.data_ranges(start_pos, end_pos):
            for pos in range(lo, hi, ZERO_CHUNK_BYTES):
                stop = min(pos + ZERO_CHUNK_BYTES, hi)
                if np.frombuffer(self.buf[pos:stop], dtype=np.uint8).any():
                    self.zero(pos, stop)

    def sync(self, start_pos: int = 0, end_pos: int | None = None) -> None:
        """Make [start_pos, end_pos) durable; errors are raised, not swallowed.

        fdatasync of the whole file, not msync of the range: CPython 3.11's mmap.flush keeps the
        GIL during the msync, stopping the appender thread (see docs/DECISIONS.md#sync-by-fdatasync).
        """
        if self.access is not Access.READ_WRITE:
            return
        end_pos = self.size_bytes if end_pos is None else min(end_pos, self.size_bytes)
        if end_pos <= page_floor(start_pos) or self._view is None:
            return  # nothing in range, or parked: synced when it was closed
        self._fdatasync()

    def _fdatasync(self) -> None:
        try:
            os.fdatasync(self._fd)
        except OSError as exc:
            raise StoreError(f"fdatasync failed: {exc}", path=str(self.path)) from exc

    def sync_range(self, start_pos: int, end_pos: int) -> None:
        """Make [start_pos, end_pos) durable and nothing else: msync(MS_SYNC) of those pages,
        which writes back only their dirty pages (ext4 then commits what the range needs).

        For a paced flush, one piece of a file at a time (workers.index_builder), where
        `sync`'s fdatasync would write every dirty page of the file at once. mmap.flush keeps
        the GIL during the msync: use it from a process with no other busy thread."""
        if self.access is not Access.READ_WRITE:
            return
        start = page_floor(start_pos)
        end = min(end_pos, self.size_bytes)
        if end <= start or self._view is None:
            return  # nothing in range, or parked: synced when it was closed
        try:
            self._mmap.flush(start, end - start)
        except OSError as exc:
            raise StoreError(f"msync failed: {exc}", path=str(self.path)) from exc

    def close(self) -> None:
        """Unmap; views still held elsewhere keep the mapping alive until they go."""
        self._unmap()
        self._closed = True  # for good: a later access is an error, not a reopen

    def _unmap(self) -> None:
        if self._budget is not None:
            self._budget.forget(self)
        if self._view is None:
            return
        view, self._view = self._view, None
        try:
            view.release()
            self._mmap.close()
        except BufferError:
            pass  # an exported view is alive; the mapping (and mmap's fd) is freed with it
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        """Unmap and remove the file, then make the removal durable."""
        self.close()
        self.path.unlink(missing_ok=True)
        fsync_dir(self.path.parent)


@contextlib.contextmanager
def _disk_full_as_error(path: Path, doing: str):
    """OSError from a write or allocation as DiskFullError (no space) or StoreError (the rest)."""
    try:
        yield
    except OSError as exc:
        if exc.errno in DISK_FULL_ERRNOS:
            raise DiskFullError(f"no space left to {doing}", path=str(path)) from exc
        raise StoreError(f"cannot {doing}: {exc}", path=str(path)) from exc


def _libc_sync_file_range():
    try:
        func = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):  # not Linux, or no such symbol: writeback starts later
        return None
    func.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    func.restype = ctypes.c_int
    return func


_SYNC_FILE_RANGE = _libc_sync_file_range()


def _start_writeback(fd: int, start_pos: int, length: int) -> None:
    """Start writing [start_pos, start_pos + length) back without waiting for it. Advice only:
    it makes nothing durable (fdatasync does), and a failure changes nothing."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, start_pos, length, SYNC_FILE_RANGE_WRITE)


def settled_names(directory: Path, access: Access) -> list[str]:
    """The names in `directory`, sorted, without `.tmp` files: creates that have not renamed
    yet (MappedFile.create). The writer, which loads before it writes, removes them as a
    crash's leftovers; a reader leaves them alone, since the running writer may be sizing one
    right now."""
    names = []
    for path in sorted(Path(directory).iterdir()):
        if not path.name.endswith(TEMP_SUFFIX):
            names.append(path.name)
        elif access is Access.READ_WRITE:
            remove_file(path)
    return names
