"""The torture's load: producer processes, each with its own ledger (the store process is
tools.store_process.StoreProcess).

Each producer's stdout and stderr go to files in the run's work directory so a failure can
quote them.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from tools.store_process import StoreProcessError
from workers.child_env import REPO_ROOT, child_env

STOP_TIMEOUT_S = 120.0


class TortureError(StoreProcessError):
    """A process did not do what the torture needs (start, stop, restart) in time."""


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
