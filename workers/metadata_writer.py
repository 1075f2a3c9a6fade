"""The supervisor's metadata thread: the checkpoint every cq_flush_interval_ms and
run/supervisor.json when it changed, written off the thread that answers producers.

A disk stall blocks this thread, never the one that sends FLUSH_DISK_TIMEOUT at the deadline.
A full disk (DiskFullError) keeps the previous files (both are replaced atomically): it is
logged once, the write is retried every interval, and the return of space is logged. The
checkpoint only speeds recovery up; the durable positions in shared memory stay right.
Any other error (EIO from an fsync) is kept in `error` for the supervisor loop, which stops
the store like a failed commitlog flush. The shutdown's last checkpoint is written by the
caller with `write_checkpoint` after `stop`.

RocketMQ's three timestamps in the checkpoint are the store times of what its positions hold
(engine.recovery.durable_times), read through this thread's own read-only view of the commitlog, so the
appender's segment list is never walked from here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from engine.errors import DiskFullError, StoreError
from engine.files.mapped_file import Access
from engine.formats.checkpoint import Checkpoint
from engine.log.commitlog import CommitLog
from engine.recovery.checkpoint import write_checkpoint
from engine.recovery.durable_times import CheckpointTimes
from ipc.control_block import ControlBlock
from ipc.run_info import RunInfo, write_run_info
from workers.group_commit import GroupCommit, wait_while_stalled

log = logging.getLogger(__name__)


class MetadataWriter:
    """Writes the checkpoint and the run info on its own thread."""

    def __init__(self, root: Path, ctl: ControlBlock, group_commit: GroupCommit, interval_s: float,
                 *, segment_bytes: int, shard_count: int, on_error: Callable[[], None],
                 fault_stall_path: Path | None = None):
        self.root = Path(root)
        self._commitlog = CommitLog.open(self.root, segment_bytes, Access.READ_ONLY)
        self._times = CheckpointTimes(self._commitlog, self.root, shard_count)
        self.ctl = ctl
        self.group_commit = group_commit
        self.interval_s = interval_s
        self._on_error = on_error
        self._fault_stall_path = fault_stall_path
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._stopping = False
        self._pending_run_info: RunInfo | None = None
        self._disk_full_since: float | None = None
        self.error: BaseException | None = None
        self.failed_file: str | None = None  # what `error` happened to: "the checkpoint", ...
        self._thread = threading.Thread(target=self._run, name="metadata-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def post_run_info(self, info: RunInfo) -> None:
        """Have `info` written to run/supervisor.json (the newest posted wins)."""
        with self._lock:
            self._pending_run_info = info
        self._wake.set()

    def stop(self) -> None:
        """End the thread (after the write in progress, if any)."""
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()

    def close(self) -> None:
        """Unmap the commitlog view (after `stop` and the last `write_checkpoint`)."""
        self._commitlog.close()

    def write_checkpoint(self) -> Checkpoint | None:
        """Write the checkpoint from the published positions now; None if a child's publication
        was torn (its restart repairs it). DiskFullError or OSError when the write fails."""
        try:
            snap = self.ctl.snapshot()
        except StoreError as exc:  # a child died mid-publish; its restart repairs the group
            log.warning("checkpoint skipped: %s", exc)
            return None
        flushed = self.group_commit.published_flushed
        self._commitlog.refresh()  # adopt new segments; let go of those retention removed
        cp = self._times.checkpoint(flushed, snap.cq_durable_pos, tuple(snap.shard_durable_pos))
        if self._fault_stall_path is not None:
            wait_while_stalled(self._fault_stall_path)
        write_checkpoint(self.root, cp)
        return cp

    # -- the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        next_checkpoint = time.monotonic()
        while not self._stopping:
            self._wake.wait(max(0.0, next_checkpoint - time.monotonic()))
            self._wake.clear()
            if self._stopping:
                return
            try:
                self._write_run_info()
                if time.monotonic() >= next_checkpoint:
                    next_checkpoint = time.monotonic() + self.interval_s
                    self._attempt("the checkpoint", self.write_checkpoint)
            except (OSError, StoreError) as exc:  # EIO: the supervisor loop says so and stops
                self.error = exc
                self._on_error()
                return
            except BaseException as exc:  # a bug: its traceback, then the same stop
                log.exception("writing %s failed", self.failed_file)
                self.error = exc
                self._on_error()
                return

    def _write_run_info(self) -> None:
        with self._lock:
            info = self._pending_run_info
        if info is None:
            return
        if self._attempt("run/supervisor.json", lambda: write_run_info(self.root, info)):
            with self._lock:
                if self._pending_run_info is info:
                    self._pending_run_info = None

    def _attempt(self, what: str, write: Callable[[], object]) -> bool:
        """Run `write`; a full disk is logged once and retried next interval (False)."""
        self.failed_file = what
        try:
            write()
        except DiskFullError as exc:
            if self._disk_full_since is None:
                self._disk_full_since = time.monotonic()
                log.warning("disk full: %s not written, the previous one stays; retrying every "
                            "%g s: %s", what, self.interval_s, exc)
            return False
        if self._disk_full_since is not None:
            log.info("disk space is back: %s written after %.1f s", what,
                     time.monotonic() - self._disk_full_since)
            self._disk_full_since = None
        return True
