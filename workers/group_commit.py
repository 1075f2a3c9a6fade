"""The supervisor's flush thread: group commit under sync flush, timed flushes under async.

Sync (RocketMQ GroupCommitService): the appender appends a sweep of requests, publishes the
written position and flushes it itself when no flush runs (`flush_if_idle`: waking the flush
thread costs more than a small group's flush; see docs/DECISIONS.md#group-commit), else calls
`request(pos)`. The flush thread wakes, makes everything written so far durable with one sync
(CommitLog.flush), publishes the flushed position and answers the producers it made durable and
wakes the children (`on_flushed`). Appends that arrive while a flush runs join the next one,
so the batch grows with the load and there is one sync per group, not per message. While idle
the flush thread calls `on_idle` every IDLE_POLL_S: the appender serves new requests from it
while its own flush is stuck on the disk (Appender.sweep_if_stuck), so they still get their
deadline.

Async (FlushRealTimeService): every `async_flush_interval_ms`, flush when at least
`async_flush_least_pages` pages are dirty, and everything every `async_flush_thorough_interval_ms`.

Only positions the appender has published are published as flushed: CommitLog.flush may cover
bytes of an append still in progress, and flushed_pos may never pass written_pos in the control
block. Both threads write the supervisor's seqlock group, so they do it under `publish_lock`.

Fault injection (off by default, for the fault suite; both read once by the supervisor at start,
so an unset hook costs nothing per flush):
- MQSTORE_FAULT_FSYNC_DELAY_MS sleeps that long before every flush, standing in for a slow disk;
  producers waiting past sync_flush_timeout_ms then get FLUSH_DISK_TIMEOUT.
- MQSTORE_FAULT_FSYNC_STALL_FILE=<path>: while that file exists, every flush (and the
  supervisor's checkpoint write) waits before its sync, polling the file every
  STALL_POLL_S; a disk stall that ends when the file is removed, without fsfreeze.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from engine.config import FlushPolicy, StoreConfig
from engine.errors import ServiceNotAvailableError, StoreError
from engine.files.filesystem import PAGE_BYTES
from engine.log.commitlog import CommitLog
from ipc.control_block import ControlBlock

FAULT_FSYNC_DELAY_ENV = "MQSTORE_FAULT_FSYNC_DELAY_MS"
FAULT_FSYNC_STALL_ENV = "MQSTORE_FAULT_FSYNC_STALL_FILE"
IDLE_POLL_S = 0.02  # how often an idle flush thread calls on_idle
STALL_POLL_S = 0.005

log = logging.getLogger(__name__)
T = TypeVar("T")


def fault_fsync_delay_s(environ=os.environ) -> float:
    """The injected flush delay in seconds (0 unless MQSTORE_FAULT_FSYNC_DELAY_MS is set)."""
    raw = environ.get(FAULT_FSYNC_DELAY_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{FAULT_FSYNC_DELAY_ENV}={raw!r} is not a number of milliseconds") from None
    return max(value, 0.0) / 1000.0


def fault_fsync_stall_path(environ=os.environ) -> Path | None:
    """The stall file of MQSTORE_FAULT_FSYNC_STALL_FILE (None unless set)."""
    raw = environ.get(FAULT_FSYNC_STALL_ENV, "").strip()
    return Path(raw) if raw else None


def wait_while_stalled(stall_path: Path) -> None:
    """Block while the fault-injection stall file exists (a disk stall that ends)."""
    while stall_path.exists():
        time.sleep(STALL_POLL_S)


class GroupCommit:
    """Owns commitlog flushing and the published written/flushed positions."""

    def __init__(self, commitlog: CommitLog, ctl: ControlBlock, config: StoreConfig, *,
                 on_flushed: Callable[[], None], fault_delay_s: float = 0.0,
                 fault_stall_path: Path | None = None):
        self.commitlog = commitlog
        self.ctl = ctl
        self.config = config
        self.sync = config.flush is FlushPolicy.SYNC
        self._on_flushed = on_flushed
        self.on_idle: Callable[[], None] = lambda: None  # the appender's, set once it exists
        self._fault_delay_s = fault_delay_s
        self._fault_stall_path = fault_stall_path
        self.publish_lock = threading.Lock()
        self._flush_lock = threading.Lock()  # one flush at a time: the flush thread's or the appender's
        self._cond = threading.Condition()
        self._requested = 0
        self._stopping = False
        self.published_written = commitlog.written_pos
        self.published_flushed = commitlog.flushed_pos
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="group-commit", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # -- the appender's side ------------------------------------------------------------------
    def publish_written(self, msg_count: int) -> int:
        """Publish the commitlog's written position (after an append sweep); returns it."""
        with self.publish_lock:
            pos = self.commitlog.written_pos
            if pos > self.published_written or msg_count:
                self.ctl.publish_written(pos, msg_count=msg_count)
                self.published_written = pos
        return pos

    def flush_if_idle(self, pos: int) -> bool:
        """The appender's own flush up to `pos` when no flush runs (True), which saves waking
        the flush thread; False when one runs (then `request` it)."""
        if pos <= self.published_flushed:
            return True
        if not self._flush_lock.acquire(blocking=False):
            return False
        try:
            self._flush_locked()
        except (OSError, StoreError) as exc:  # as in the flush thread: the loop stops the store
            self.error = exc
            self._on_flushed()
        finally:
            self._flush_lock.release()
        return True

    def request(self, pos: int) -> None:
        """Ask for everything below `pos` to be made durable (sync flush)."""
        with self._cond:
            if pos > self._requested:
                self._requested = pos
                self._cond.notify()

    # -- the flush thread ---------------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self.sync:
                self._run_sync()
            else:
                self._run_async()
        except (OSError, StoreError) as exc:  # the disk failed: the supervisor loop says so and stops
            self.error = exc
            self._on_flushed()
        except BaseException as exc:  # a bug: its traceback, then the same stop
            log.exception("flush thread failed")
            self.error = exc
            self._on_flushed()

    def _run_sync(self) -> None:
        while True:
            with self._cond:
                if not self._stopping and (self._requested <= self.published_flushed
                                           or self._flush_lock.locked()):
                    self._cond.wait(IDLE_POLL_S)
                due = self._requested > self.published_flushed
                if self._stopping and not due:
                    return
            if self.error is not None:  # a failed sync is never retried: the loop stops the store
                return
            if due and self._flush_lock.acquire(blocking=False):
                try:
                    self._flush_locked()
                finally:
                    self._flush_lock.release()
            else:  # idle, or the appender's own flush holds the disk (it covers this request)
                self.on_idle()

    def _run_async(self) -> None:
        cfg = self.config
        interval = cfg.async_flush_interval_ms / 1000.0
        least_bytes = cfg.async_flush_least_pages * PAGE_BYTES
        last_thorough = time.monotonic()
        while True:
            with self._cond:
                if not self._stopping:
                    self._cond.wait(interval)
                stopping = self._stopping
            now = time.monotonic()
            thorough = now - last_thorough >= cfg.async_flush_thorough_interval_ms / 1000.0
            dirty = self.published_written - self.published_flushed
            if stopping or thorough or dirty >= least_bytes:
                self.flush_now()
                if thorough:
                    last_thorough = now
            if stopping:
                return

    def run_between_flushes(self, action: Callable[[], T], wait_s: float) -> T | None:
        """`action()` while no flush runs (retention removes segments from the list a flush
        walks); None when a flush held the disk for `wait_s` (try again later)."""
        if not self._flush_lock.acquire(timeout=wait_s):
            return None
        try:
            return action()
        finally:
            self._flush_lock.release()

    def flush_now(self) -> int:
        """One flush of everything written; publishes and returns the new flushed position."""
        with self._flush_lock:
            return self._flush_locked()

    def flush_written(self) -> int:
        """Flush everything written, for a caller outside the flush thread that needs it durable
        (a topic's tombstone); returns the flushed end. A failed sync is recorded as the thread's
        own (the loop stops the store: it is never retried) and raised as ServiceNotAvailableError."""
        try:
            self.flush_now()
        except (OSError, StoreError) as exc:
            self.error = exc
            self._on_flushed()
        if self.error is not None:
            raise ServiceNotAvailableError(f"flushing the commitlog failed: {self.error}")
        return self.commitlog.flushed_pos

    def _flush_locked(self) -> int:
        if self.error is not None:  # after a failed sync nothing more is published as durable:
            return self.published_flushed  # Linux reports a lost write-back once, not twice
        if self._fault_delay_s:
            time.sleep(self._fault_delay_s)
        if self._fault_stall_path is not None:
            wait_while_stalled(self._fault_stall_path)
        before = self.published_flushed
        started = time.monotonic_ns()
        pos = self.commitlog.flush()
        latency_ns = time.monotonic_ns() - started
        with self.publish_lock:
            target = min(pos, self.published_written)
            if target > self.published_flushed:
                self.ctl.publish_flushed(target, latency_ns=latency_ns, flushed_bytes=target - before)
                self.published_flushed = target
        self._on_flushed()
        return self.published_flushed

    def stop(self) -> None:
        """Flush what is outstanding and end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()
        if self.error is None and self.published_flushed < self.published_written:
            try:
                self.flush_now()
            except (OSError, StoreError) as exc:  # the stop goes on; the store is left unclean
                log.error("the last flush failed: %s", exc)
                self.error = exc
