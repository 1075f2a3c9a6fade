"""Claiming one of N numbered slots with flock, so a dead claimant's slot frees itself.

Slot N of a family is the lock file '<run_dir>/<prefix>-<N>.lock' (mode 0o600). A claimant holds
fcntl.flock(LOCK_EX) on its open file description for as long as it owns the slot; the kernel
drops the lock when the process dies, however it dies. Nothing is written into the files.

flock locks belong to the open file description: a forked child that inherits the fd keeps the
slot claimed while it lives (fds are opened O_CLOEXEC, so exec does not inherit them).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from engine.errors import BadInputError, SlotsExhaustedError, StorePermissionError

LOCK_FILE_MODE = 0o600
DEFAULT_PREFIX = "slot"


def slot_lock_path(run_dir: str | os.PathLike, index: int, *, prefix: str = DEFAULT_PREFIX) -> Path:
    return Path(run_dir) / f"{prefix}-{index}.lock"


def claim_slot(run_dir: str | os.PathLike, slot_count: int, *,
               prefix: str = DEFAULT_PREFIX) -> tuple[int, int]:
    """Claim a free slot; returns (index, fd). Release with release_slot(fd) or by exiting."""
    if slot_count <= 0:
        raise BadInputError("slot_count", f"must be > 0, got {slot_count}")
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    start = os.getpid() % slot_count
    for step in range(slot_count):
        index = (start + step) % slot_count
        fd = hold_if_free(run_dir, index, prefix=prefix)
        if fd is not None:
            return index, fd
    raise SlotsExhaustedError(f"all {slot_count} {prefix} slots are in use by live processes",
                              slot_count=slot_count, path=str(run_dir),
                              hint="close idle clients or configure more slots")


def release_slot(fd: int) -> None:
    """Give the slot back (unlock and close the fd)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def hold_if_free(run_dir: str | os.PathLike, index: int, *, prefix: str = DEFAULT_PREFIX) -> int | None:
    """Hold slot `index` if no live process does (the fd; release with release_slot), else None:
    its owner's reclaim, done while holding it so no claimant can take the slot meanwhile (one
    that tries then takes another slot)."""
    fd = _open_lock_file(slot_lock_path(run_dir, index, prefix=prefix))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def is_slot_owner_alive(run_dir: str | os.PathLike, index: int, *,
                        prefix: str = DEFAULT_PREFIX) -> bool:
    """True while some live process holds slot `index` (the supervisor's check)."""
    path = slot_lock_path(run_dir, index, prefix=prefix)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's own lock at once
    return False


def _open_lock_file(path: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, LOCK_FILE_MODE)
    except PermissionError:
        raise StorePermissionError(f"cannot open slot lock file {path}", path=str(path),
                                   hint="run the client as the user that started the store"
                                   ) from None
