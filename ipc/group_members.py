"""Live consumers of a group: each Consumer holds a shared flock on `config/groups/<group>.lock`.

The kernel drops a flock when the last descriptor of its open file closes, at exit or SIGKILL
alike, so "the group has live consumers" is an OS fact, not a heartbeat that may be stale. A
Consumer dropped without close leaves when it is collected; a forked child closes its inherited
copy at fork and joins on its own only when it uses the Consumer. `mqstore groups --reset`
takes the lock exclusively without waiting: refused while any consumer holds it (its next
commit would overwrite the reset), and held while it writes, so no consumer starts meanwhile.
The refusal names the holders' pids, read from /proc/locks.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.errors import GroupInUseError
from engine.files.filesystem import ensure_dir
from engine.files.naming import CONFIG_DIR

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
    """A consumer's membership of its group: the shared lock, held until `close`, until the
    membership is garbage-collected (a Consumer dropped without close), or in a forked child
    until it takes its own (`rejoin`): the child's inherited copy is closed at fork."""

    def __init__(self, store_dir: str | os.PathLike, group: str):
        self._path = group_lock_path(store_dir, group)
        self._finalizer = weakref.finalize(self, _close_fd, None)
        self._finalizer.detach()
        self.rejoin()

    def rejoin(self) -> None:
        """Take the shared lock on a descriptor of this process's own (again, in a fork child)."""
        self.close()
        fd = _open_lock_file(self._path)
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while a reset writes (milliseconds)
        except BaseException:
            os.close(fd)
            raise
        self._finalizer = weakref.finalize(self, _close_fd, fd)
        _MEMBERSHIPS.add(self)

    @property
    def held(self) -> bool:
        return self._finalizer.alive

    def close(self) -> None:
        self._finalizer()  # closes the descriptor once; later calls do nothing
        _MEMBERSHIPS.discard(self)


def _close_fd(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _open_lock_file(path: Path) -> int | None:
    """The lock file opened read-only (flock needs no write access), created when missing; None
    when it is missing and cannot be created (a store whose config/ this user may not write):
    such a consumer is invisible to `groups --reset`, which cannot write that store either."""
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        pass
    try:
        ensure_dir(path.parent)
        return os.open(path, os.O_RDONLY | os.O_CREAT, 0o600)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        return None


def _drop_inherited_memberships() -> None:
    """In a forked child, close the inherited lock descriptors: a child that never uses its
    parent's Consumer must not keep the group live after the parent is gone. The parent keeps
    its lock: a flock belongs to the open file description, which the parent's descriptor holds."""
    for membership in list(_MEMBERSHIPS):
        membership.close()


_MEMBERSHIPS: weakref.WeakSet[GroupMembership] = weakref.WeakSet()
os.register_at_fork(after_in_child=_drop_inherited_memberships)


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
