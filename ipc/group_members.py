"""Live consumers of a group: each Consumer holds a shared flock on `config/groups/<group>.lock`.

The kernel drops a flock when the last descriptor of its open file closes, at exit or SIGKILL
alike, so "the group has live consumers" is an OS fact, not a heartbeat that may be stale. A
forked child shares its parent's descriptor and so its membership. `mqstore groups --reset`
takes the lock exclusively without waiting: refused while any consumer holds it (its next
commit would overwrite the reset), and held while it writes, so no consumer starts meanwhile.
The refusal names the holders' pids, read from /proc/locks.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.errors import GroupInUseError
from engine.filesystem import ensure_dir
from engine.naming import CONFIG_DIR

GROUPS_DIR = "groups"
LOCK_SUFFIX = ".lock"
_NAME_MAX_BYTES = 255


def group_lock_path(store_dir: str | os.PathLike, group: str) -> Path:
    """The group's lock file; a name too long for the filesystem is shortened with a digest."""
    name = group + LOCK_SUFFIX
    if len(name.encode()) > _NAME_MAX_BYTES:
        name = f"{group[:150]}~{hashlib.sha256(group.encode()).hexdigest()[:16]}{LOCK_SUFFIX}"
    return Path(store_dir) / CONFIG_DIR / GROUPS_DIR / name


class GroupMembership:
    """A consumer's membership of its group: the shared lock, held until `close`."""

    def __init__(self, store_dir: str | os.PathLike, group: str):
        path = group_lock_path(store_dir, group)
        ensure_dir(path.parent)
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_SH)  # waits only while a reset writes (milliseconds)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@contextmanager
def group_held_alone(store_dir: str | os.PathLike, group: str) -> Iterator[None]:
    """Hold the group's lock exclusively for the block; GroupInUseError at once when a
    consumer of the group is alive (naming the pids the kernel lists for the lock)."""
    path = group_lock_path(store_dir, group)
    ensure_dir(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise GroupInUseError(group, lock_holders(fd), path=str(path)) from None
        yield
    finally:
        os.close(fd)


def lock_holders(fd: int) -> list[int]:
    """The pids /proc/locks lists for flocks on the file of `fd` (the process that took each
    lock; a forked child sharing it is not listed), sorted; [] if /proc/locks is unreadable."""
    st = os.fstat(fd)
    ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pids = set()
    try:
        with open("/proc/locks") as table:
            for line in table:
                fields = line.split()
                # "1: FLOCK  ADVISORY  READ  1234 08:01:5678 0 EOF" ("->" marks a waiter)
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[-3] == ident:
                    pids.add(int(fields[-4]))
    except (OSError, ValueError):
        return []
    return sorted(pids)
