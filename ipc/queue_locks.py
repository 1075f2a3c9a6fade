"""Who owns a queue of a consumer group: `config/groups/<group>/<topic>/queues/<queue id>.lock`,
flock'd LOCK_EX by its one owner.

A member takes a queue's lock without waiting and reads the queue only while it holds it. It
lets a queue go only after it committed what it handed out, and the kernel lets go of a dead
owner's locks at its death: so a queue changes owner only after its old owner committed or
died, and two members never read one queue at the same time. A stopped or hung owner keeps
its locks, hence its queues, and nothing is handled twice.
"""

from __future__ import annotations

import fcntl
import os
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.files.filesystem import ensure_dir
from ipc.group_roster import QUEUES_DIR, topic_dir

LOCK_SUFFIX = ".lock"


class QueueLocks:
    """The queue locks one member holds on one topic of its group."""

    def __init__(self, store_dir: str | os.PathLike, group: str, topic: str):
        self.directory: Path = topic_dir(store_dir, group, topic) / QUEUES_DIR
        ensure_dir(self.directory)
        self._fds: dict[int, int] = {}  # queue id -> descriptor holding its lock
        self._finalizer = weakref.finalize(self, _close_all, self._fds)
        _LOCKS.add(self)

    @property
    def held(self) -> list[int]:
        return sorted(self._fds)

    def try_take(self, queue_id: int) -> bool:
        """Take the queue's lock if no one holds it; True if this member holds it now."""
        if queue_id in self._fds:
            return True
        fd = os.open(self.directory / f"{queue_id}{LOCK_SUFFIX}", os.O_RDONLY | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fds[queue_id] = fd
        return True

    def release(self, queue_id: int) -> None:
        """Let the queue go; its owner must have committed what it handed out."""
        fd = self._fds.pop(queue_id, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        self._finalizer()
        _LOCKS.discard(self)


@contextmanager
def borrow_free_queue_locks(store_dir: str | os.PathLike, group: str, topic: str,
                            queue_ids: list[int]) -> Iterator[list[int]]:
    """For a consumer that is not a member on `topic`: hold, for the block, the locks of the
    `queue_ids` no member holds, and yield the ids a live member holds (their offsets are its
    to commit). Held through the write, so no member takes the queue and reads its offset
    between the look and the write."""
    directory = topic_dir(store_dir, group, topic) / QUEUES_DIR
    borrowed: list[int] = []
    owned_elsewhere: list[int] = []
    try:
        for queue_id in queue_ids if directory.is_dir() else ():  # no directory: no member ever
            try:
                fd = os.open(directory / f"{queue_id}{LOCK_SUFFIX}", os.O_RDONLY | os.O_CREAT, 0o600)
            except FileNotFoundError:
                continue  # the topic's group directory went (a topic delete): no owner
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                owned_elsewhere.append(queue_id)
                continue
            borrowed.append(fd)
        yield owned_elsewhere
    finally:
        for fd in borrowed:
            os.close(fd)


def _close_all(fds: dict[int, int]) -> None:
    for fd in fds.values():
        os.close(fd)
    fds.clear()


def _drop_inherited_locks() -> None:
    """In a forked child, close the inherited queue locks: the parent keeps them."""
    for locks in list(_LOCKS):
        locks.close()


_LOCKS: weakref.WeakSet[QueueLocks] = weakref.WeakSet()
os.register_at_fork(after_in_child=_drop_inherited_locks)
