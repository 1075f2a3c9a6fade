"""Bounding the files a process holds open, whatever the number of consume queues.

A mapped file costs file descriptors: the writer's own (pwrite, fallocate, fdatasync) and the
dup that Python's mmap keeps. A process holding every queue's file open ran out of them at
about 250 topics of 4 queues under the common soft limit of 1,024. So:

- `raise_open_file_limit` lifts the soft RLIMIT_NOFILE to the hard limit at start (an
  unprivileged process may);
- an `OpenFileBudget` keeps at most `max_files` files of a consume-queue table mapped: opening
  one more closes the least recently used (a writer's file is synced first, so closing never
  loses durability) and a closed file is reopened, and sees the same bytes, on its next access;
- `queue_file_budget` sizes that bound from the setting and the soft limit in force.
"""

from __future__ import annotations

import logging
import resource
from collections import OrderedDict
from typing import Protocol

from engine.errors import BadInputError

DEFAULT_MAX_QUEUE_FILES = 4096  # consume-queue files one table keeps mapped (2 fds each when written)
MIN_QUEUE_FILES = 16  # below this every step of a dispatch over a few queues would reopen files
LIMIT_SHARE = 4  # queue files take at most 1/4 of the soft limit (x2 fds): half stays for the rest

log = logging.getLogger(__name__)


class Parkable(Protocol):
    """A file the budget can close and its owner reopen on next access (engine.files.mapped_file.MappedFile);
    a protocol, so the budget does not import the mapped file that holds it."""

    def park(self) -> None: ...


class OpenFileBudget:
    """The mapped files of one table, least recently used first; at most `max_files` of them."""

    def __init__(self, max_files: int):
        if isinstance(max_files, bool) or not isinstance(max_files, int) or max_files < 1:
            raise BadInputError("max_files", f"{max_files!r} must be an int >= 1")
        self.max_files = max_files
        self.closed_count = 0  # files closed to stay within the budget (reopened on access)
        self._open: OrderedDict[Parkable, None] = OrderedDict()

    def opened(self, mapped: Parkable) -> None:
        """`mapped` was just mapped: count it, closing the least recently used past the bound.
        A file that fails to close (its sync failed) is closed all the same and the error raised."""
        self._open[mapped] = None
        self._open.move_to_end(mapped)
        while len(self._open) > self.max_files:
            victim, _ = self._open.popitem(last=False)
            self.closed_count += 1
            victim.park()

    def touch(self, mapped: Parkable) -> None:
        """`mapped` was used: it is now the most recently used."""
        self._open.move_to_end(mapped)

    def forget(self, mapped: Parkable) -> None:
        """`mapped` was closed for good (or parked): it no longer counts."""
        self._open.pop(mapped, None)

    def __len__(self) -> int:
        return len(self._open)


def open_file_limit() -> tuple[int, int]:
    """(soft, hard) RLIMIT_NOFILE of this process."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def raise_open_file_limit() -> int:
    """Lift the soft RLIMIT_NOFILE to the hard limit (no privilege needed) and return the soft
    limit now in force; a refusal leaves the limit as it was."""
    soft, hard = open_file_limit()
    if hard == resource.RLIM_INFINITY or soft == hard:
        log.debug("open-file limit: soft %d, hard %d (unchanged)", soft, hard)
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.debug("open-file limit: soft %d, hard %d (cannot raise: %s)", soft, hard, exc)
        return soft
    log.debug("open-file limit: soft %d raised to the hard limit %d", soft, hard)
    return hard


def queue_file_budget(max_files: int = DEFAULT_MAX_QUEUE_FILES) -> int:
    """How many consume-queue files a table may keep mapped: `max_files`, but no more than a
    LIMIT_SHARE-th of the soft limit in force (at least MIN_QUEUE_FILES)."""
    soft, _ = open_file_limit()
    if soft == resource.RLIM_INFINITY:
        return max_files
    return max(MIN_QUEUE_FILES, min(max_files, soft // LIMIT_SHARE))
