"""A supervisor store (`mqstore start` in the foreground) run as a child process, for the tests,
the torture, the bench and the retention soak: start it, wait until it is READY, stop it
(SIGTERM) or kill it (SIGKILL).

Every wait polls a condition against a deadline (`wait_until`); nothing sleeps in place of
synchronisation. The supervisor's stderr (its log lines and its children's) is appended to a
file the caller names, so a failure can quote it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from engine.errors import StoreError
from ipc.control_block import (
    ControlBlock,
    Positions,
    ProcState,
    Role,
    StoreState,
    pid_alive,
    process_slot_index,
)
from workers.child_env import REPO_ROOT, child_env

POLL_S = 0.005
TIMEOUT_S = 120.0
ORPHANS_TIMEOUT_S = 30.0
LOG_QUOTE_CHARS = 4000  # how much of the log a failure quotes


class StoreProcessError(AssertionError):
    """A process did not do what its caller waits for (be ready, restart, stop) in time."""


def wait_until(predicate: Callable[[], object], what: str, timeout_s: float, poll_s: float = POLL_S):
    """Poll `predicate` until it returns a true value (returned) or raise at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise StoreProcessError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(poll_s)


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str) else repr(value)


def write_store_config(path: Path, store: Mapping, supervisor: Mapping | None = None) -> Path:
    """A TOML file with a [store] and an optional [supervisor] table (`mqstore start --config`)."""
    lines = ["[store]"] + [f"{k} = {toml_value(v)}" for k, v in store.items()]
    if supervisor:
        lines += ["", "[supervisor]"] + [f"{k} = {toml_value(v)}" for k, v in supervisor.items()]
    Path(path).write_text("\n".join(lines) + "\n")
    return Path(path)


def is_stopped(pid: int) -> bool:
    """True once `pid` is in the stopped state (after SIGSTOP) or gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    return state in ("T", "t", "Z", "X")


class StoreProcess:
    """One `mqstore start` supervisor in the foreground, as this process's child.

    `timeout_s` bounds every wait a caller does not bound itself, `poll_s` is the waits' poll
    interval; `on_ready` runs after each successful `wait_ready`; `preexec_fn` runs in the child
    before it executes the supervisor (a test lowering a limit, say).
    """

    def __init__(self, root: Path, config_path: Path, log_path: Path,
                 env: Mapping[str, str] | None = None, *, timeout_s: float = TIMEOUT_S,
                 poll_s: float = POLL_S, on_ready: Callable[[StoreProcess], None] | None = None,
                 preexec_fn: Callable[[], None] | None = None):
        self.root = Path(root)
        self.config_path = Path(config_path)
        self.log_path = Path(log_path)
        self.env = dict(env or {})
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.on_ready = on_ready
        self.preexec_fn = preexec_fn
        self.proc: subprocess.Popen | None = None
        self._log_offset = 0

    def start(self) -> None:
        """Spawn the supervisor (returns at once; `wait_ready` waits for it)."""
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tools.cli", "start", "--store", str(self.root),
                 "--config", str(self.config_path)], cwd=REPO_ROOT, env=child_env(self.env),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                preexec_fn=self.preexec_fn)

    def log_text(self) -> str:
        """What this run of the supervisor (and its children) wrote to stderr so far."""
        with open(self.log_path, "rb") as fh:
            fh.seek(self._log_offset)
            return fh.read().decode(errors="replace")

    @property
    def stderr(self) -> str:
        """The whole log file: every run's stderr."""
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float | None = None) -> object:
        """Wait until this supervisor is READY (raises StoreProcessError if it exits first)."""
        def ready():
            if self.proc.poll() is not None:
                raise StoreProcessError(f"the supervisor exited with {self.proc.returncode} before "
                                        f"it was ready:\n{self.log_text()[-LOG_QUOTE_CHARS:]}")
            try:
                with ControlBlock.attach(self.root) as ctl:
                    return ctl.supervisor_pid == self.proc.pid and ctl.store_state is StoreState.READY
            except (StoreError, OSError, ValueError):
                return False

        value = self._wait(ready, "the supervisor to be ready", timeout_s)
        if self.on_ready is not None:
            self.on_ready(self)
        return value

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ctl(self) -> ControlBlock:
        return ControlBlock.attach(self.root)

    def positions(self) -> Positions:
        with self.ctl() as ctl:
            return ctl.snapshot()

    def child_pid(self, role: Role, shard: int = 0) -> int:
        with self.ctl() as ctl:
            return ctl.process_slot(process_slot_index(role, shard)).pid

    def child_pids(self) -> list[int]:
        with self.ctl() as ctl:
            return [s.pid for s in ctl.process_slots() if s.role is not Role.SUPERVISOR and s.pid]

    def wait_child_replaced(self, role: Role, old_pid: int, shard: int = 0,
                            timeout_s: float | None = None) -> int:
        """Wait until another process runs in the child's slot; return its pid."""
        def replaced():
            if self.proc.poll() is not None:
                raise StoreProcessError(f"the supervisor exited with {self.proc.returncode} while "
                                        f"restarting {role.name}:\n{self.log_text()[-LOG_QUOTE_CHARS:]}")
            with self.ctl() as ctl:
                slot = ctl.process_slot(process_slot_index(role, shard))
            return slot.pid if slot.pid != old_pid and slot.state is ProcState.RUNNING else None

        return self._wait(replaced, f"{role.name.lower()} {shard} to be restarted", timeout_s)

    def wait_caught_up(self, timeout_s: float | None = None) -> None:
        """Wait until dispatch and every index shard are durable up to the flushed position."""
        def caught_up():
            p = self.positions()
            return (p.written_pos == p.flushed_pos == p.dispatched_pos == p.cq_durable_pos
                    and all(x == p.flushed_pos for x in p.shard_processed_pos + p.shard_durable_pos))

        self._wait(caught_up, "dispatch and index to catch up", timeout_s)

    def wait_orphans_gone(self, pids: list[int], timeout_s: float = ORPHANS_TIMEOUT_S) -> None:
        """Wait until the children a killed supervisor left have exited (they watch its pid)."""
        self._wait(lambda: not any(pid_alive(p) for p in pids), "orphaned children to exit", timeout_s)

    def stop(self, timeout_s: float | None = None) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(self.timeout_s if timeout_s is None else timeout_s)

    def kill(self) -> None:
        """SIGKILL the supervisor and reap it (its children notice and exit by themselves)."""
        self.proc.kill()
        self.proc.wait(self.timeout_s)

    def _wait(self, predicate: Callable[[], object], what: str, timeout_s: float | None):
        return wait_until(predicate, what, self.timeout_s if timeout_s is None else timeout_s,
                          self.poll_s)
