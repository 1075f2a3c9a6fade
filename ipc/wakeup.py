"""Named POSIX semaphores that wake sleepers, and the consumers' long-poll waiter table.

Semaphores (all mode 0o600, names from shm.region_name, file /dev/shm/sem.<name>):

    sem-sup              producers post after publishing a request; the supervisor waits
    sem-slot-<i>         the supervisor posts after answering mailbox slot i; its producer waits
    sem-wait-<i>-<pid>   waiter-table entry i's consumer waits; the dispatcher posts

The waiter table is its own small region (kind 'wait'), created by the supervisor:

    offset        size  field
    0             8     magic b'MQSTWAIT'
    8             4     layout_version u32 (1)
    12            4     entry_count u32
    16            48    reserved
    64 + 128*i    8     seq u64                 seqlock over the identity below
    +8            4     pid i32                 0 = free      (written by the entry's consumer)
    +12           4     pad
    +16           64    sem_name 64s            NUL-padded semaphore name
    +80           4     waiting u32             set by the consumer, cleared by either side
    +84           44    reserved

A consumer claims entry i with slot_claim (prefix 'waiter'), so a dead consumer frees it. The
flock is what tells a live consumer's semaphore from a dead one's (never the pid in the name,
which another process may have by now): whoever holds entry i owns the names sem-wait-<i>-*. A
consumer that claims an entry removes the names earlier holders left in it; the supervisor
(`WaiterTable.reclaim_dead`, periodically) holds each free entry while it clears its identity
and removes its names; at stop it removes every semaphore of its token (`unlink_all`).
Wait protocol: consumer drains its semaphore, sets waiting, full fence, re-checks its condition,
then sleeps. The notifier publishes its position, full fence, then posts every entry whose
waiting flag is set, clearing the flag first. The fences make the handshake lose no wakeup;
clearing the flag means an idle consumer's semaphore never accumulates posts (at most one
stale post can remain after a wait, and the next wait drains it).
"""

from __future__ import annotations

import _signal
import os
import signal
import struct
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import posix_ipc

from engine.errors import ServiceNotAvailableError, StoreError, StorePermissionError
from ipc import seqlock, slot_claim
from ipc.shm import SHM_DIR, SharedRegion, name_taken_error, region_name, store_prefix, token_path

SEM_MODE = 0o600
WAITER_MAGIC = b"MQSTWAIT"
WAITER_LAYOUT_VERSION = 1
WAITER_REGION_KIND = "wait"
WAITER_LOCK_PREFIX = "waiter"
WAITER_WAKEUP_KIND = "sem-wait"
DEFAULT_WAITER_COUNT = 64
WAITER_HEADER = struct.Struct("<8sII")
WAITER_HEADER_SIZE = 64
WAITER_IDENTITY = struct.Struct("<i4x64s")
WAITER_ENTRY_SIZE = 128
WAITING_OFFSET = seqlock.SEQ_SIZE + WAITER_IDENTITY.size
assert WAITING_OFFSET == 80 and WAITING_OFFSET + 4 <= WAITER_ENTRY_SIZE


def supervisor_wakeup_name(store_dir: str | os.PathLike) -> str:
    return region_name(store_dir, "sem-sup")


def slot_wakeup_name(store_dir: str | os.PathLike, index: int) -> str:
    return region_name(store_dir, f"sem-slot-{index}")


def waiter_wakeup_name(store_dir: str | os.PathLike, index: int, pid: int) -> str:
    return region_name(store_dir, f"{WAITER_WAKEUP_KIND}-{index}-{pid}")


def waiter_wakeup_names(store_dir: str | os.PathLike) -> dict[int, list[str]]:
    """The consumers' semaphores of the store now in /dev/shm, by waiter-table entry."""
    if not token_path(store_dir).exists():
        return {}
    prefix = "sem." + store_prefix(store_dir)[1:] + WAITER_WAKEUP_KIND + "-"
    found: dict[int, list[str]] = defaultdict(list)
    for entry in sorted(os.listdir(SHM_DIR)):
        if not entry.startswith(prefix):
            continue
        index, _, pid = entry[len(prefix):].partition("-")
        if index.isdigit() and pid.isdigit():
            found[int(index)].append("/" + entry[len("sem."):])
    return found


def _unlink_names(names: list[str]) -> list[str]:
    """Unlink these semaphores; the names that existed."""
    removed = []
    for name in names:
        try:
            posix_ipc.unlink_semaphore(name)
        except posix_ipc.ExistentialError:
            continue
        removed.append(name)
    return removed


def unlink_all(store_dir: str | os.PathLike) -> list[str]:
    """Remove every semaphore of the store (stale ones at start, all at stop); names removed."""
    if not token_path(store_dir).exists():
        return []  # no token, no semaphores: nothing of this store can be in /dev/shm
    prefix = "sem." + store_prefix(store_dir)[1:]
    return _unlink_names(["/" + entry[len("sem."):] for entry in sorted(os.listdir(SHM_DIR))
                          if entry.startswith(prefix)])


WAIT_SLICE_S = 0.1  # the longest a signal (Ctrl-C) waits for its handler during a Wakeup.wait
_BLOCKABLE_SIGNALS = frozenset(map(int, signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}))


class Wakeup:
    """One named semaphore used as a wakeup: post() to wake, wait() to sleep."""

    def __init__(self, sem: posix_ipc.Semaphore, owner_pid: int | None):
        self._sem = sem
        self.name: str = sem.name
        self.owner_pid = owner_pid

    @classmethod
    def create(cls, name: str) -> Wakeup:
        """Create the semaphore (value 0, mode 0o600); fails if it exists."""
        try:
            sem = posix_ipc.Semaphore(name, posix_ipc.O_CREX, mode=SEM_MODE, initial_value=0)
        except posix_ipc.ExistentialError:
            raise name_taken_error(f"semaphore {name}", SHM_DIR / f"sem.{name.lstrip('/')}",
                                   "a crashed process left it; unlink_all() at supervisor start"
                                   ) from None
        return cls(sem, os.getpid())

    @classmethod
    def open(cls, name: str) -> Wakeup:
        try:
            sem = posix_ipc.Semaphore(name)
        except posix_ipc.ExistentialError:
            raise ServiceNotAvailableError(f"semaphore {name} does not exist",
                                           hint="start the store with `mqstore start`") from None
        except posix_ipc.PermissionsError:
            raise StorePermissionError(f"semaphore {name} belongs to another user",
                                       hint="run the client as the user that started the store"
                                       ) from None
        return cls(sem, None)

    def post(self) -> None:
        self._sem.release()

    def wait(self, timeout_s: float) -> bool:
        """Sleep until posted or `timeout_s` passes; True if a post was taken.

        Signals are held off while asleep and let in between sleeps of at most WAIT_SLICE_S,
        where their Python handlers run: a handler's exception (Ctrl-C's KeyboardInterrupt, a
        SIGTERM handler's SystemExit) is raised from here within a slice. Left to posix_ipc, an
        interrupted sleep turns every exception but KeyboardInterrupt into SignalError (lost),
        and a signal that lands just before the sleep goes unseen until the timeout."""
        if timeout_s <= 0:
            try:
                self._sem.acquire(0)
            except posix_ipc.BusyError:
                return False
            return True
        deadline = time.monotonic() + timeout_s
        remaining_s = timeout_s  # the first slice without a second clock read
        while True:
            slice_s = remaining_s if remaining_s < WAIT_SLICE_S else WAIT_SLICE_S
            # _signal's, not signal's: that wrapper makes an enum member of every signal in the
            # returned mask, ~100 us for a full one, and this is the producer's per-batch path.
            held = _signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKABLE_SIGNALS)
            try:
                self._sem.acquire(slice_s)
                return True
            except (posix_ipc.BusyError, posix_ipc.SignalError):  # SignalError: a stop signal
                pass
            finally:
                _signal.pthread_sigmask(signal.SIG_SETMASK, held)  # pending handlers run here
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                return False

    def drain(self) -> int:
        """Take every pending post without sleeping; how many there were."""
        taken = 0
        while self.wait(0):
            taken += 1
        return taken

    @property
    def pending_posts(self) -> int:
        return self._sem.value

    def close(self) -> None:
        self._sem.close()

    def unlink(self) -> None:
        """Remove the name (creator only); processes that opened it keep working."""
        if self.owner_pid != os.getpid():
            raise StoreError(f"process {os.getpid()} may not unlink semaphore {self.name}: "
                             f"it was created by pid {self.owner_pid}")
        try:
            posix_ipc.unlink_semaphore(self.name)  # by name: works after close() too
        except posix_ipc.ExistentialError:
            pass


@dataclass(frozen=True)
class WaiterEntry:
    index: int
    pid: int
    sem_name: str
    waiting: bool


class WaiterTable:
    """The long-poll waiter table; the supervisor creates it, everyone else attaches."""

    def __init__(self, region: SharedRegion, store_dir: str | os.PathLike):
        self.region = region
        self.store_dir = store_dir
        self._buf = region.buf
        magic, version, self.entry_count = WAITER_HEADER.unpack_from(self._buf, 0)
        if magic != WAITER_MAGIC or version != WAITER_LAYOUT_VERSION:
            region.close()
            if magic == b"\0" * 8:
                raise ServiceNotAvailableError(f"waiter table {region.name} is being created")
            raise StoreError(f"{region.name} is not a waiter table of layout "
                             f"{WAITER_LAYOUT_VERSION} (magic {magic!r}, version {version})")
        seqlock.order_fence()
        self.waiting = np.ndarray((self.entry_count,), "<u4", self._buf,
                                  WAITER_HEADER_SIZE + WAITING_OFFSET, (WAITER_ENTRY_SIZE,))
        self._notify_cache: dict[int, Wakeup] = {}

    @classmethod
    def create(cls, store_dir: str | os.PathLike, *,
               entry_count: int = DEFAULT_WAITER_COUNT) -> WaiterTable:
        size_bytes = WAITER_HEADER_SIZE + entry_count * WAITER_ENTRY_SIZE
        region = SharedRegion.create(region_name(store_dir, WAITER_REGION_KIND), size_bytes)
        WAITER_HEADER.pack_into(region.buf, 0, b"\0" * 8, WAITER_LAYOUT_VERSION, entry_count)
        seqlock.order_fence()
        region.buf[0:8] = WAITER_MAGIC
        return cls(region, store_dir)

    @classmethod
    def attach(cls, store_dir: str | os.PathLike) -> WaiterTable:
        return cls(SharedRegion.attach(region_name(store_dir, WAITER_REGION_KIND)), store_dir)

    def entry_offset(self, index: int) -> int:
        return WAITER_HEADER_SIZE + index * WAITER_ENTRY_SIZE

    def entry(self, index: int) -> WaiterEntry:
        pid, raw_name = seqlock.read_consistent(self._buf, self.entry_offset(index),
                                                WAITER_IDENTITY)
        name = raw_name.rstrip(b"\0").decode()
        return WaiterEntry(index, pid, name, bool(self.waiting[index]))

    def registered(self) -> list[WaiterEntry]:
        entries = (self.entry(i) for i in range(self.entry_count))
        return [entry for entry in entries if entry.pid]

    def anyone_waiting(self) -> bool:
        """Whether a consumer sleeps on a position to come (a hint: it may start any moment)."""
        seqlock.fence()
        return bool(self.waiting.any())

    def notify_waiters(self) -> int:
        """Post every waiting consumer (call after publishing a new position); how many."""
        seqlock.fence()
        posted = 0
        for index in np.flatnonzero(self.waiting).tolist():
            self.waiting[index] = 0
            wakeup = self._wakeup_for(index)
            if wakeup is not None:
                wakeup.post()
                posted += 1
        return posted

    def _wakeup_for(self, index: int) -> Wakeup | None:
        entry = self.entry(index)
        cached = self._notify_cache.get(index)
        if cached is not None and cached.name == entry.sem_name:
            return cached
        if cached is not None:
            cached.close()
            del self._notify_cache[index]
        if not entry.pid:
            return None
        try:
            wakeup = Wakeup.open(entry.sem_name)
        except ServiceNotAvailableError:
            return None  # the consumer is gone and took its semaphore with it
        self._notify_cache[index] = wakeup
        return wakeup

    def reclaim_dead(self, run_dir: str | os.PathLike) -> list[str]:
        """Clear every entry no live consumer holds that a dead one left a semaphore in (the
        semaphores, the entry's identity), holding the entry's flock meanwhile; returns the
        names removed. A held entry is left alone: its consumer removed older names when it
        claimed it. Only entries with names are looked at: a listing, not 64 seqlock reads."""
        names = waiter_wakeup_names(self.store_dir)
        removed: list[str] = []
        for index in sorted(i for i in names if i < self.entry_count):
            fd = slot_claim.hold_if_free(run_dir, index, prefix=WAITER_LOCK_PREFIX)
            if fd is None:
                continue
            try:
                self.waiting[index] = 0
                seqlock.write_locked(self._buf, self.entry_offset(index), WAITER_IDENTITY, (0, b""))
                removed += _unlink_names(names.get(index, []))
            finally:
                slot_claim.release_slot(fd)
        return removed

    def close(self) -> None:
        for wakeup in self._notify_cache.values():
            wakeup.close()
        self._notify_cache.clear()
        self.waiting = None
        self._buf = None
        self.region.close()

    def unlink(self) -> None:
        self.region.unlink()


class ConsumerWaiter:
    """A consumer's registration in the waiter table, with its own semaphore."""

    def __init__(self, table: WaiterTable, index: int, lock_fd: int, wakeup: Wakeup):
        self.table = table
        self.index = index
        self._lock_fd = lock_fd
        self.wakeup = wakeup

    @classmethod
    def register(cls, table: WaiterTable, run_dir: str | os.PathLike) -> ConsumerWaiter:
        """Claim a free entry (flock under `run_dir`) and publish this process's semaphore."""
        index, fd = slot_claim.claim_slot(run_dir, table.entry_count, prefix=WAITER_LOCK_PREFIX)
        try:
            name = waiter_wakeup_name(table.store_dir, index, os.getpid())
            _unlink_names(waiter_wakeup_names(table.store_dir).get(index, []))  # our flock: all stale
            wakeup = Wakeup.create(name)
        except BaseException:
            slot_claim.release_slot(fd)
            raise
        table.waiting[index] = 0
        seqlock.write_locked(table.region.buf, table.entry_offset(index), WAITER_IDENTITY,
                             (os.getpid(), name.encode()))
        return cls(table, index, fd, wakeup)

    def wait(self, ready: Callable[[], bool], timeout_s: float) -> bool:
        """Sleep until `ready()` or `timeout_s` passes; returns ready()."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.wakeup.drain()
            self.table.waiting[self.index] = 1
            seqlock.fence()
            if ready():
                self.table.waiting[self.index] = 0
                return True
            self.wakeup.wait(deadline - time.monotonic())
            self.table.waiting[self.index] = 0
            if ready():
                return True
            if time.monotonic() >= deadline:
                return False

    def close(self) -> None:
        """Leave the table: clear the entry, remove the semaphore, give the entry back."""
        if self._lock_fd < 0:
            return
        self.table.waiting[self.index] = 0
        seqlock.write_locked(self.table.region.buf, self.table.entry_offset(self.index),
                             WAITER_IDENTITY, (0, b""))
        self.wakeup.unlink()
        self.wakeup.close()
        slot_claim.release_slot(self._lock_fd)
        self._lock_fd = -1

    def forget(self) -> None:
        """In a forked child: close this process's handles to an inherited entry. The entry,
        its semaphore and the flock (shared with the parent's open file) stay the parent's."""
        if self._lock_fd < 0:
            return
        self.wakeup.close()
        os.close(self._lock_fd)
        self._lock_fd = -1

    def __enter__(self) -> ConsumerWaiter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
