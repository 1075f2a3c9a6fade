"""Whole-file and directory operations on the store's filesystem, each made durable: create a
directory, write a file whole (atomically or as a new side file), remove a file or a tree, and
the disk's state (a full disk's errnos, the used fraction). Mapped files are engine.files.mapped_file.
"""

from __future__ import annotations

import errno
import mmap
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from engine.files.naming import TEMP_SUFFIX

PAGE_BYTES = mmap.PAGESIZE  # the page cache's unit: what a sync or a fault covers at least
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})  # what a write or allocation raises on a full disk


def fsync_dir(directory: Path) -> None:
    """Make a create, rename or unlink in `directory` durable."""
    _fsync_path(directory, os.O_RDONLY | os.O_DIRECTORY)


def ensure_dir(directory: Path) -> Path:
    """Create `directory` (owner-only) and its parents, durably."""
    directory = Path(directory)
    if not directory.is_dir():
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fsync_dir(directory.parent)
    return directory


def write_file_atomically(path: Path, data: bytes, *, backup_suffix: str | None = None) -> None:
    """Replace `path` with `data`: write temp, fsync, (copy old to backup), rename, fsync dir."""
    path = Path(path)
    tmp = path.with_name(path.name + TEMP_SUFFIX)
    _write_synced(tmp, (data,))
    if backup_suffix is not None and path.exists():
        backup = path.with_name(path.name + backup_suffix)
        backup_tmp = backup.with_name(backup.name + TEMP_SUFFIX)
        shutil.copyfile(path, backup_tmp)
        os.chmod(backup_tmp, 0o600)
        _fsync_path(backup_tmp)
        os.replace(backup_tmp, backup)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_new_file(path: Path, chunks: Iterable) -> None:
    """Write a new side file (e.g. a quarantined tail) durably from `chunks` (bytes-like, in
    order: a large file is never whole in memory), under a temporary name that is renamed once
    synced, so a crash leaves the whole file or none."""
    path = Path(path)
    tmp = path.with_name(path.name + TEMP_SUFFIX)
    _write_synced(tmp, chunks)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _write_synced(path: Path, chunks: Iterable) -> None:
    """Write `chunks` in order as the whole content of `path` (owner-only) and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def overwrite_in_place(path: Path, data: bytes) -> bool:
    """Rewrite an existing file of exactly len(data) bytes in place and fdatasync it: no new
    block is needed, so it works on a full disk. False, nothing written, when the file is
    missing or of another size."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return False
    try:
        if os.fstat(fd).st_size != len(data):
            return False
        view = memoryview(data)
        at = 0
        while at < len(data):
            at += os.pwrite(fd, view[at:], at)
        os.fdatasync(fd)
        return True
    finally:
        os.close(fd)


def remove_file(path: Path) -> None:
    """Remove a file durably (missing is fine)."""
    path = Path(path)
    path.unlink(missing_ok=True)
    fsync_dir(path.parent)


def remove_tree(directory: Path) -> None:
    """Remove a directory tree durably (missing is fine)."""
    directory = Path(directory)
    if directory.exists():
        shutil.rmtree(directory)
        fsync_dir(directory.parent)


def move_aside(path: Path, into: Path, name: str) -> Path:
    """Move a file or directory to `into`/`name` durably (damage kept for inspection, never
    deleted); returns the new path."""
    target = ensure_dir(Path(into)) / name
    os.replace(path, target)
    fsync_dir(target.parent)
    fsync_dir(Path(path).parent)
    return target


def _fsync_path(path: Path, flags: int = os.O_RDONLY) -> None:
    """fsync what `path` names, opened read-only with `flags`."""
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def disk_usage_ratio(path: Path) -> float:
    """Used fraction of the filesystem holding `path` (what retention's thresholds compare)."""
    return usage_ratio_of(os.statvfs(path))


def usage_ratio_of(st: os.statvfs_result) -> float:
    """used / (used + available to us), as RocketMQ's getDiskPartitionSpaceUsedPercent and df's
    Use% count it: blocks reserved for root are neither, so a disk with a large reserve is not
    taken for full (which would start forced retention early)."""
    used_blocks = st.f_blocks - st.f_bfree
    counted_blocks = used_blocks + st.f_bavail
    if counted_blocks <= 0:
        return 0.0
    return used_blocks / counted_blocks
