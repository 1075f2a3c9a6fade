"""Real processes for the torture: the store (`mqstore start` in the foreground) and producers.

Everything waits by polling a condition against a deadline (`wait_until`); nothing sleeps in
place of synchronisation. Each process's stderr goes to a file in the run's work directory so a
failure can quote it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from engine.errors import StoreError
from ipc.control_block import ControlBlock, ProcState, Role, StoreState, pid_alive, process_slot_index

REPO_ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.005
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 120.0


class TortureError(AssertionError):
    """A process did not do what the torture needs (start, stop, restart) in time."""


def wait_until(predicate: Callable[[], object], what: str, timeout_s: float):
    """Poll `predicate` until it returns a true value (returned) or raise at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TortureError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(POLL_S)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def write_store_config(path: Path, store: dict, supervisor: dict | None = None) -> Path:
    """A TOML file with a [store] and an optional [supervisor] table (`mqstore start --config`)."""

    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        return json.dumps(v) if isinstance(v, str) else repr(v)

    lines = ["[store]"] + [f"{k} = {value(v)}" for k, v in store.items()]
    if supervisor:
        lines += ["", "[supervisor]"] + [f"{k} = {value(v)}" for k, v in supervisor.items()]
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
    """One `mqstore start` supervisor in the foreground, as our child."""

    def __init__(self, root: Path, config_path: Path, log_path: Path, env: dict | None = None):
        self.root = Path(root)
        self.config_path = config_path
        self.log_path = log_path
        self.env = env or {}
        self.proc: subprocess.Popen | None = None
        self._log_offset = 0

    def start(self) -> None:
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tools.cli", "start", "--store", str(self.root),
                 "--config", str(self.config_path)], cwd=REPO_ROOT, env=child_env(self.env),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)

    def log_text(self) -> str:
        """What this run of the supervisor (and its children) wrote to stderr so far."""
        with open(self.log_path, "rb") as fh:
            fh.seek(self._log_offset)
            return fh.read().decode(errors="replace")

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> float:
        """Wait until this supervisor is READY (raises if it exits first)."""
        def ready():
            if self.proc.poll() is not None:
                raise TortureError(f"the supervisor exited with {self.proc.returncode} before it "
                                   f"was ready:\n{self.log_text()[-4000:]}")
            try:
                with ControlBlock.attach(self.root) as ctl:
                    return ctl.supervisor_pid == self.proc.pid and ctl.store_state is StoreState.READY
            except (StoreError, OSError, ValueError):
                return False

        return wait_until(ready, "the supervisor to be ready", timeout_s)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ctl(self) -> ControlBlock:
        return ControlBlock.attach(self.root)

    def child_pid(self, role: Role, shard: int = 0) -> int:
        with self.ctl() as ctl:
            return ctl.process_slot(process_slot_index(role, shard)).pid

    def child_pids(self) -> list[int]:
        with self.ctl() as ctl:
            return [s.pid for s in ctl.process_slots() if s.role is not Role.SUPERVISOR and s.pid]

    def wait_child_replaced(self, role: Role, old_pid: int, shard: int = 0,
                            timeout_s: float = START_TIMEOUT_S) -> int:
        """Wait until another process runs in the child's slot; return its pid."""
        def replaced():
            if self.proc.poll() is not None:
                raise TortureError(f"the supervisor exited with {self.proc.returncode} while "
                                   f"restarting {role.name}:\n{self.log_text()[-4000:]}")
            with self.ctl() as ctl:
                slot = ctl.process_slot(process_slot_index(role, shard))
            return slot.pid if slot.pid != old_pid and slot.state is ProcState.RUNNING else None

        return wait_until(replaced, f"{role.name.lower()} {shard} to be restarted", timeout_s)

    def kill(self) -> None:
        """SIGKILL the supervisor and reap it (its children notice and exit by themselves)."""
        self.proc.kill()
        self.proc.wait(STOP_TIMEOUT_S)

    def wait_orphans_gone(self, pids: list[int], timeout_s: float = 30.0) -> None:
        wait_until(lambda: not any(pid_alive(p) for p in pids), "orphaned children to exit", timeout_s)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM and wait; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)


class ProducerFleet:
    """Load producer processes (tools.torture.load), each with its own ledger file."""

    def __init__(self, root: Path, ledger_dir: Path, work_dir: Path, *, max_batch: int,
                 max_body_bytes: int):
        self.root = Path(root)
        self.ledger_dir = Path(ledger_dir)
        self.work_dir = Path(work_dir)
        self.max_batch = max_batch
        self.max_body_bytes = max_body_bytes
        self.procs: dict[str, subprocess.Popen] = {}
        self.counts: Counter[str] = Counter()

    def spawn(self, tag: str, seed: int) -> subprocess.Popen:
        out = open(self.work_dir / f"{tag}.out", "wb")  # noqa: SIM115 -- closed in _collect
        err = open(self.work_dir / f"{tag}.err", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "tools.torture.load", "--store", str(self.root),
             "--ledger-dir", str(self.ledger_dir), "--tag", tag, "--seed", str(seed),
             "--max-batch", str(self.max_batch), "--max-body-bytes", str(self.max_body_bytes)],
            cwd=REPO_ROOT, env=child_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        proc._torture_files = (out, err)  # type: ignore[attr-defined]
        self.procs[tag] = proc
        return proc

    def kill(self, tag: str) -> None:
        proc = self.procs[tag]
        proc.kill()
        proc.wait(STOP_TIMEOUT_S)
        self._collect(tag)

    def stop_all(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM every producer (each finishes its batch in flight) and reap them."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for tag in list(self.procs):
            proc = self.procs[tag]
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise TortureError(f"producer {tag} did not stop within {timeout_s:g} s: "
                                   f"{self.stderr_of(tag)[-2000:]}") from None
            self._collect(tag)

    def wait_all_exited(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Wait for producers that end by themselves (their store is gone)."""
        for tag in list(self.procs):
            self.procs[tag].wait(timeout_s)
            self._collect(tag)

    def stderr_of(self, tag: str) -> str:
        return (self.work_dir / f"{tag}.err").read_text(errors="replace")

    def _collect(self, tag: str) -> None:
        proc = self.procs.pop(tag)
        for fh in proc._torture_files:  # type: ignore[attr-defined]
            fh.close()
        lines = (self.work_dir / f"{tag}.out").read_text(errors="replace").splitlines()
        if proc.returncode not in (0, -signal.SIGKILL, -signal.SIGTERM, 3):
            raise TortureError(f"producer {tag} exited with {proc.returncode}: "
                               f"{self.stderr_of(tag)[-2000:]}")
        if lines:
            try:
                self.counts.update(json.loads(lines[-1]).get("counts", {}))
            except json.JSONDecodeError:
                pass

    @property
    def tags(self) -> list[str]:
        return list(self.procs)
