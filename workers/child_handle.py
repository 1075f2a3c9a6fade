"""The supervisor's handle on one child process: spawn, liveness, stop, restart scheduling.

A child runs `python -m workers.dispatcher` or `python -m workers.index_builder --shard N` in
its own session (Ctrl-C on the terminal reaches only the supervisor). It is alive while its
process runs and its heartbeat in the control block is fresh; a child whose heartbeat is older
than `child_timeout_s` (or that is still booting after `boot_timeout_s`) is hung and gets
SIGKILL, after which it is reaped and handled like any other exit. What happens after an exit
is the RestartPolicy's decision.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from engine.config import StoreConfig
from ipc.control_block import ControlBlock, ProcState, Role, process_slot_index
from ipc.wakeup import Wakeup
from workers.child import child_wakeup_name, encode_config
from workers.child_env import child_env
from workers.exit_codes import describe_exit
from workers.restart_policy import RestartPolicy, RestartSettings

MODULES = {Role.DISPATCHER: "workers.dispatcher", Role.INDEX_BUILDER: "workers.index_builder"}


def child_name(role: Role, shard: int) -> str:
    """A child's name in the supervisor's and the children's log lines."""
    return "dispatcher" if role is Role.DISPATCHER else f"index builder {shard}"


log = logging.getLogger(__name__)


class ChildHandle:
    """One supervised child (a role and a shard) across its restarts."""

    def __init__(self, role: Role, shard: int, store_dir: Path, config: StoreConfig,
                 ctl: ControlBlock, restart: RestartSettings):
        self.role = role
        self.shard = shard
        self.store_dir = Path(store_dir)
        self.config = config
        self.ctl = ctl
        self.slot_index = process_slot_index(role, shard)
        self.policy = RestartPolicy(restart)
        self.process: subprocess.Popen | None = None
        self.started_at = 0.0
        self.restart_at: float | None = None
        self.killed_for: str | None = None  # why the supervisor SIGKILLed the running process
        self.wakeup = Wakeup.create(child_wakeup_name(store_dir, self.slot_index))

    @property
    def name(self) -> str:
        return child_name(self.role, self.shard)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def spawn(self) -> None:
        """Start the child process and claim its slot in the control block."""
        argv = [sys.executable, "-m", MODULES[self.role], "--store", str(self.store_dir),
                "--supervisor-pid", str(os.getpid()), "--config-json", encode_config(self.config),
                "--shard", str(self.shard)]
        self.wakeup.drain()
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=child_env(),
                                        start_new_session=True, close_fds=True)
        self.started_at = time.monotonic()
        self.restart_at = None
        self.killed_for = None
        self.ctl.claim_process_slot(self.slot_index, self.role, self.shard, self.process.pid)
        log.info("%s started (pid %d)", self.name, self.process.pid)

    def poll(self) -> int | None:
        """The return code if the child exited (it is reaped), else None."""
        if self.process is None:
            return None
        code = self.process.poll()
        if code is not None:
            self.ctl.set_process_state(self.slot_index, ProcState.EXITED)
        return code

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    def state(self) -> ProcState | None:
        slot = self.ctl.process_slot(self.slot_index)
        return slot.state if slot is not None else None

    def is_hung(self, child_timeout_s: float, boot_timeout_s: float) -> str | None:
        """Why the running child counts as hung, or None."""
        slot = self.ctl.process_slot(self.slot_index)
        if slot is None or not self.running:
            return None
        age_s = (time.monotonic_ns() - slot.heartbeat_ns) / 1e9
        if slot.state is ProcState.BOOTING:
            if time.monotonic() - self.started_at > boot_timeout_s:
                return f"still booting after {boot_timeout_s:g} s"
            return None
        if age_s > child_timeout_s:
            return f"no heartbeat for {age_s:.1f} s"
        return None

    def ran_for_s(self) -> float:
        return time.monotonic() - self.started_at

    def signal(self, signum: int) -> None:
        if self.running:
            try:
                self.process.send_signal(signum)
            except ProcessLookupError:
                pass

    def kill(self, reason: str) -> None:
        """SIGKILL the running child and reap it, remembering `reason` for the exit's words
        (describe_exit): a kill of the supervisor's own is not an out-of-memory kill."""
        if not self.running:
            return
        self.killed_for = reason
        self.signal(signal.SIGKILL)
        self.process.wait()

    def describe(self, returncode: int) -> str:
        """The words for this child's exit with `returncode` (workers.exit_codes.describe_exit)."""
        return describe_exit(returncode, self.killed_for)

    def stop(self, timeout_s: float) -> int | None:
        """SIGTERM, wait up to `timeout_s`, then SIGKILL; returns the exit code."""
        if self.process is None:
            return None
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %g s: SIGKILL", self.name, timeout_s)
            self.kill(f"did not stop within {timeout_s:g} s of SIGTERM")
        return self.poll()

    def close(self) -> None:
        self.wakeup.close()

    def unlink(self) -> None:
        self.wakeup.unlink()
