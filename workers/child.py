"""The child-process base: boot, heartbeat, orphan check, signal handling, exit codes.

A child (the dispatcher, an index builder) is started by the supervisor as
`python -m workers.<role> --store DIR --supervisor-pid PID --config-json {...} [--shard N]`
in its own session, so a Ctrl-C on the terminal reaches the supervisor only and the supervisor
decides the order of the stop. Its life:

1. boot: attach the control block, open and recover its own files (any failure: exit
   BOOT_FAILED, which the supervisor does not restart). Every way out of a child leaves its
   cause in mqstore.log: an exception in the first line of its log record (the supervisor
   quotes it in its exit line), a fatal signal through faulthandler (workers.fatal_log);
2. loop: stamp the heartbeat in its process slot, check that the supervisor is still its parent
   (else exit ORPHANED within HEARTBEAT_INTERVAL_S), do a bounded step of work, flush on its
   interval, and sleep on its wakeup semaphore (posted by the supervisor after each flush)
   when there was nothing to do (`_sleep_until_woken`; the dispatcher sleeps out a hold no
   consumer waits for instead);
3. SIGTERM: finish (flush, publish what is durable) and exit OK.

A full disk (DiskFullError from a step: nothing of that step's batch was written) is waited
out, not a crash: the child logs it once, keeps heartbeating and flushing, and retries the
step with a growing pause (DISK_FULL_FIRST_RETRY_S doubling up to DISK_FULL_MAX_RETRY_S) until
space returns, then logs that it resumed.

Signal handlers only enqueue (gunicorn): the loop handles what they queued. Corruption found
while running exits STORE_CORRUPT (a restart would find it again); anything else unexpected
exits CRASHED and the supervisor restarts the child from its durable position.
"""

from __future__ import annotations

import argparse
import json
import logging
import logging.handlers
import os
import queue
import signal
import sys
import time
from pathlib import Path

from engine.config import StoreConfig
from engine.errors import CorruptConsumeQueueError, CorruptIndexError, CorruptRecordError, DiskFullError
from engine.files.naming import LOG_FILE
from engine.files.open_files import raise_open_file_limit
from ipc import seqlock
from ipc.control_block import ControlBlock, ProcState, Role, process_slot_index
from ipc.shm import region_name
from ipc.wakeup import Wakeup
from workers.exit_codes import ExitCode
from workers.fatal_log import log_fatal_signals
from workers.log_level import env_log_level

HEARTBEAT_INTERVAL_S = 0.1
DISK_FULL_FIRST_RETRY_S = 0.05
DISK_FULL_MAX_RETRY_S = 1.0
CORRUPTION = (CorruptRecordError, CorruptConsumeQueueError, CorruptIndexError)

log = logging.getLogger(__name__)


def read_own_group(ctl: ControlBlock, offset: int, layout) -> tuple:
    """This child's own seqlock group, read without the sequence check: the previous holder of
    the group may have died mid-write (odd sequence), which a consistent read would wait out in
    vain; the first write of the restarted writer repairs it."""
    return seqlock.read_unlocked(ctl.region.buf, offset, layout)


def child_wakeup_name(store_dir: str | os.PathLike, slot_index: int) -> str:
    """The semaphore the supervisor posts to wake the child of process slot `slot_index`."""
    return region_name(store_dir, f"sem-child-{slot_index}")


def encode_config(config: StoreConfig) -> str:
    from dataclasses import asdict

    return json.dumps(asdict(config))


def parse_child_args(argv: list[str] | None, role: Role) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"mqstore-{role.name.lower()}")
    parser.add_argument("--store", required=True, type=Path)
    parser.add_argument("--supervisor-pid", required=True, type=int)
    parser.add_argument("--config-json", required=True)
    parser.add_argument("--shard", type=int, default=0)
    return parser.parse_args(argv)


class ChildProcess:
    """Subclasses set `role` and implement boot(), step(), flush() and close()."""

    role: Role = Role.DISPATCHER

    def __init__(self, store_dir: Path, config: StoreConfig, supervisor_pid: int, shard: int = 0):
        self.store_dir = Path(store_dir)
        self.config = config
        self.supervisor_pid = supervisor_pid
        self.shard = shard
        self.slot_index = process_slot_index(self.role, shard)
        self.ctl: ControlBlock | None = None
        self.wakeup: Wakeup | None = None
        self._signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._stopping = False
        self._flush_interval_s = self.flush_interval_s(config)
        self._last_flush = time.monotonic()
        self._disk_full_since: float | None = None  # monotonic time of the first DiskFullError
        self._disk_full_retries = 0
        self._retry_pause_s = DISK_FULL_FIRST_RETRY_S
        self._retry_at = 0.0

    # -- to implement --------------------------------------------------------------------------
    def boot(self) -> None:
        """Open and recover this child's files from its durable position."""
        raise NotImplementedError

    def step(self) -> bool:
        """Do one bounded piece of work; True if there was any."""
        raise NotImplementedError

    def flush(self) -> None:
        """Make what was processed durable and publish it."""
        raise NotImplementedError

    def flush_interval_s(self, config: StoreConfig) -> float:
        """How often the loop calls flush_step: every cq_flush_interval_ms unless a child paces it."""
        return config.cq_flush_interval_ms / 1000.0

    def flush_step(self) -> None:
        """The loop's flush, every `_flush_interval_s`: all of `flush` unless a child paces it."""
        self.flush()

    def close(self) -> None:
        """Release files (after the final flush)."""

    # -- the loop ------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.role.name.lower() + (f"[{self.shard}]" if self.role is Role.INDEX_BUILDER else "")

    def run(self) -> ExitCode:
        self._install_signal_handlers()
        try:
            if os.getppid() != self.supervisor_pid:
                log.error("%s: parent is not supervisor %d; exiting", self.name, self.supervisor_pid)
                return ExitCode.ORPHANED
            self.ctl = ControlBlock.attach(self.store_dir)
            self.ctl.heartbeat(self.slot_index)
            self.wakeup = Wakeup.open(child_wakeup_name(self.store_dir, self.slot_index))
            self.boot()
        except Exception as exc:
            log.exception("%s failed to boot: %s", self.name, _cause(exc))
            return ExitCode.BOOT_FAILED
        self.ctl.set_process_state(self.slot_index, ProcState.RUNNING)
        log.info("%s running (pid %d)", self.name, os.getpid())
        try:
            code = self._loop()
        except CORRUPTION as exc:
            log.exception("%s found corruption it cannot repair: %s", self.name, _cause(exc))
            return ExitCode.STORE_CORRUPT
        if code is ExitCode.OK:
            self.ctl.set_process_state(self.slot_index, ProcState.STOPPING)
            self.flush()
            self.ctl.set_process_state(self.slot_index, ProcState.EXITED)
            log.info("%s stopped", self.name)
        self.close()
        return code

    def _loop(self) -> ExitCode:
        while True:
            self._drain_signals()
            if self._stopping:
                self._catch_up()
                return ExitCode.OK
            if os.getppid() != self.supervisor_pid:
                log.warning("%s: supervisor %d is gone; exiting", self.name, self.supervisor_pid)
                return ExitCode.ORPHANED
            self.ctl.heartbeat(self.slot_index)
            did_work = self._step_unless_disk_full()
            now = time.monotonic()
            if now - self._last_flush >= self._flush_interval_s:
                self.flush_step()
                self._last_flush = now
            if not did_work:
                self._sleep_until_woken(now)

    def _sleep_until_woken(self, now: float) -> None:
        """Sleep until posted or the idle wait (`_idle_wait_s`) is over."""
        if self.wakeup.wait(self._idle_wait_s(now)):
            self.wakeup.drain()  # one look at the published position serves every post

    def _step_unless_disk_full(self) -> bool:
        """step(), except while waiting out a full disk (until the next retry time); a
        DiskFullError starts or continues that wait. True if the step did work."""
        if self._disk_full_since is None:
            try:
                return self.step()
            except DiskFullError as exc:
                self._start_disk_full_wait(exc)
                return False
        if time.monotonic() < self._retry_at:
            return False
        try:
            did_work = self.step()
        except DiskFullError:
            self._disk_full_retries += 1
            self._retry_pause_s = min(self._retry_pause_s * 2, DISK_FULL_MAX_RETRY_S)
            self._retry_at = time.monotonic() + self._retry_pause_s
            return False
        log.info("%s: disk space is back; resuming after %.1f s (%d retries)", self.name,
                 time.monotonic() - self._disk_full_since, self._disk_full_retries)
        self._disk_full_since = None
        return did_work

    def _start_disk_full_wait(self, exc: DiskFullError) -> None:
        now = time.monotonic()
        log.warning("%s: disk full, waiting for space (retrying every %.2f s up to every %.1f s): %s",
                    self.name, DISK_FULL_FIRST_RETRY_S, DISK_FULL_MAX_RETRY_S, exc)
        self._disk_full_since = now
        self._disk_full_retries = 0
        self._retry_pause_s = DISK_FULL_FIRST_RETRY_S
        self._retry_at = now + self._retry_pause_s

    def _idle_wait_s(self, now: float) -> float:
        """How long to sleep when idle: a heartbeat interval, or until the next disk-full retry."""
        if self._disk_full_since is None:
            return HEARTBEAT_INTERVAL_S
        return min(HEARTBEAT_INTERVAL_S, max(self._retry_at - now, 0.0))

    def _catch_up(self) -> None:
        """On stop, process what is already published (the supervisor stopped appending); a full
        disk ends the catch-up (what was not written is re-dispatched by the next start)."""
        deadline = time.monotonic() + 10.0
        try:
            while time.monotonic() < deadline and self.step():
                self.ctl.heartbeat(self.slot_index)
        except DiskFullError as exc:
            log.warning("%s: disk full while catching up before the stop: %s", self.name, exc)

    def _drain_signals(self) -> None:
        while True:
            try:
                signum = self._signals.get_nowait()
            except queue.Empty:
                return
            if signum in (signal.SIGTERM, signal.SIGHUP):
                self._stopping = True

    def _install_signal_handlers(self) -> None:
        def enqueue(signum, _frame):  # NO LOGGING: only enqueue
            self._signals.put_nowait(signum)

        signal.signal(signal.SIGTERM, enqueue)
        signal.signal(signal.SIGHUP, enqueue)
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def setup_child_logging(role: str, store_dir: Path) -> None:
    """stderr (the supervisor's) plus the store's log file, which the supervisor rotates: a
    WatchedFileHandler reopens it after a rotation. Same line format as tools.logging_setup."""
    root = logging.getLogger()
    root.setLevel(env_log_level(logging.INFO))  # `mqstore start --log-level` reaches children
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)-7s {role}[%(process)d] "
                                          "%(message)s", "%H:%M:%S"))
    root.addHandler(stderr)
    path = Path(store_dir) / LOG_FILE
    if path.parent.is_dir():
        handler = logging.handlers.WatchedFileHandler(path)
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)-7s {role}[%(process)d] "
                                               "%(name)s: %(message)s"))
        root.addHandler(handler)


def _cause(exc: BaseException) -> str:
    """An exception in one line: its type and message (the log line names the cause; the
    traceback follows it)."""
    return f"{type(exc).__name__}: {exc}"


def child_main(cls: type[ChildProcess], argv: list[str] | None = None) -> None:
    """Entry point of `python -m workers.<role>`: exits with an ExitCode."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        args = parse_child_args(argv, cls.role)
    except SystemExit:
        sys.exit(ExitCode.USAGE)
    role = cls.role.name.lower() + (f"-{args.shard}" if cls.role is Role.INDEX_BUILDER else "")
    setup_child_logging(role, args.store)
    log_fatal_signals(args.store)
    raise_open_file_limit()
    try:
        config = StoreConfig(**json.loads(args.config_json))
        child = cls(args.store, config, args.supervisor_pid, args.shard)
    except Exception:
        log.exception("bad child arguments")
        sys.exit(ExitCode.USAGE)
    try:
        code = child.run()
    except Exception as exc:
        log.exception("%s crashed: %s", child.name, _cause(exc))
        code = ExitCode.CRASHED
    logging.shutdown()
    sys.exit(int(code))
