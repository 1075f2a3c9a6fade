"""Helpers for the process tests: a real `mqstore start` in a subprocess, polled with deadlines.

Imported by tests/workers, tests/ipc/test_producer.py, tests/ipc/test_consumer.py and
tests/tools/test_cli.py (the latter add this directory to sys.path).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.check import check
from ipc.control_block import ControlBlock, Role, StoreState, process_slot_index
from ipc.shm import NAME_PREFIX, SHM_DIR, token_path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 30.0

SMALL_STORE = {
    "commitlog_file_size": 64 * 1024,
    "consume_queue_entries": 500,
    "index_slot_count": 64,
    "index_entry_count": 256,
    "index_shards": 2,
    "queue_count": 4,
    "cq_flush_interval_ms": 100,
    "index_flush_interval_ms": 100,
    "max_body_bytes": 8192,
}


def child_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def write_config(path: Path, store: dict | None = None, supervisor: dict | None = None) -> Path:
    lines = ["[store]"] + [f"{k} = {_toml_value(v)}" for k, v in {**SMALL_STORE, **(store or {})}.items()]
    if supervisor:
        lines += ["", "[supervisor]"] + [f"{k} = {_toml_value(v)}" for k, v in supervisor.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def wait_for(predicate: Callable[[], object], what: str, timeout_s: float = DEADLINE_S):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def cli(*args: str, cwd: Path | None = None, env: dict | None = None, input: bytes | None = None,
        timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.cli", *args], cwd=cwd or REPO_ROOT,
                          env=child_env(env), input=input, capture_output=True, timeout=timeout)


def run_python(code: str, *args: str, env: dict | None = None, timeout: float = 120.0,
               **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=child_env(env),
                          capture_output=True, timeout=timeout, **kwargs)


def spawn_python(code: str, *args: str, env: dict | None = None, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args],
                            env=child_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            **kwargs)


_tokens_seen: dict[str, str] = {}


def store_shm_names(root: Path) -> list[str]:
    """The store's names in /dev/shm, under its current token or (once a stop removed the token
    file) the last one this test saw, so a leak after a stop is still found."""
    key = os.path.realpath(root)
    try:
        _tokens_seen[key] = token_path(root).read_text().strip()
    except FileNotFoundError:
        pass
    if key not in _tokens_seen:
        return []
    prefix = f"{NAME_PREFIX}{_tokens_seen[key]}-"
    return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix) or n.startswith("sem." + prefix))


class RunningStore:
    """`python -m tools.cli start --store ROOT --config CFG` in the foreground, as a child."""

    def __init__(self, root: Path, proc: subprocess.Popen, stderr_path: Path):
        self.root = root
        self.proc = proc
        self.stderr_path = stderr_path

    @classmethod
    def start(cls, root: Path, *, store: dict | None = None, supervisor: dict | None = None,
              env: dict | None = None, wait_ready: bool = True,
              preexec_fn: Callable[[], None] | None = None) -> RunningStore:
        root = Path(root)
        config = write_config(root.parent / f"{root.name}.toml", store, supervisor)
        stderr_path = root.parent / f"{root.name}.stderr"
        with open(stderr_path, "ab") as err:
            proc = subprocess.Popen([sys.executable, "-m", "tools.cli", "start", "--store", str(root),
                                     "--config", str(config)], cwd=REPO_ROOT, env=child_env(env),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    preexec_fn=preexec_fn)
        running = cls(root, proc, stderr_path)
        if wait_ready:
            running.wait_ready()
        return running

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = DEADLINE_S) -> None:
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"supervisor exited with {self.proc.returncode}:\n{self.stderr}")
            try:
                with ControlBlock.attach(self.root) as ctl:
                    return ctl.supervisor_pid == self.proc.pid and ctl.store_state is StoreState.READY
            except Exception:
                return False

        wait_for(ready, "the supervisor to be ready", timeout_s)
        store_shm_names(self.root)  # remembers the token for the checks after a stop

    def ctl(self) -> ControlBlock:
        return ControlBlock.attach(self.root)

    def positions(self):
        with self.ctl() as ctl:
            return ctl.snapshot()

    def child_pid(self, role: Role, shard: int = 0) -> int:
        with self.ctl() as ctl:
            return ctl.process_slot(process_slot_index(role, shard)).pid

    def wait_child_restarted(self, role: Role, old_pid: int, shard: int = 0) -> int:
        from ipc.control_block import ProcState

        def restarted():
            with self.ctl() as ctl:
                slot = ctl.process_slot(process_slot_index(role, shard))
                return slot.pid if slot.pid != old_pid and slot.state is ProcState.RUNNING else None

        return wait_for(restarted, f"{role.name} to be restarted")

    def wait_caught_up(self, timeout_s: float = DEADLINE_S) -> None:
        def caught_up():
            with self.ctl() as ctl:
                p = ctl.snapshot()
            return (p.written_pos == p.flushed_pos == p.dispatched_pos == p.cq_durable_pos
                    and all(x == p.flushed_pos for x in p.shard_processed_pos + p.shard_durable_pos))

        wait_for(caught_up, "dispatch and index to catch up", timeout_s)

    def stop(self, timeout_s: float = DEADLINE_S) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(DEADLINE_S)


def assert_check_clean(root: Path) -> None:
    findings = check(Path(root))
    assert findings == [], "\n".join(map(str, findings))


@contextmanager
def checked_store(root: Path, **start_kwargs) -> Iterator[RunningStore]:
    """A test's store: started, yielded; it must stop cleanly even when the test failed, and
    check clean when it passed."""
    running = RunningStore.start(root, **start_kwargs)
    try:
        yield running
    finally:
        assert running.stop() == 0
    assert_check_clean(running.root)


def module_store(root: Path, **start_kwargs) -> Iterator[RunningStore]:
    """A module fixture's store: started, yielded, then it must stop cleanly and check clean."""
    running = RunningStore.start(root, **start_kwargs)
    yield running
    assert running.stop() == 0
    assert_check_clean(running.root)


PRODUCER_SCRIPT = """
import json, sys
from engine.message import Message
from ipc.producer import Producer
store, tag, count, batch, topic = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
acks = []
with Producer(store, reattach_timeout_s=0) as producer:  # exits once its store is gone
    i = 0
    while i < count:
        n = min(batch, count - i)
        if n == 1:
            results = [producer.send(topic, f"{tag}-{i}".encode(), keys=(f"{tag}-{i}",))]
        else:
            results = producer.send_batch([Message(topic, f"{tag}-{j}".encode(), keys=(f"{tag}-{j}",))
                                           for j in range(i, i + n)])
        for j, r in enumerate(results):
            acks.append([f"{tag}-{i + j}", r.status.name, r.queue_id, r.queue_offset, r.commit_pos,
                         r.msg_id])
            print(json.dumps(acks[-1]), flush=True)
        if any(r.status.name == "SERVICE_NOT_AVAILABLE" for r in results):
            break
        i += n
"""


def claimed_producer_slots(root: Path) -> int:
    from ipc.mailbox import Mailbox, SlotState

    mailbox = Mailbox.attach(root)
    try:
        return int((mailbox.state == SlotState.CLAIMED).sum())
    finally:
        mailbox.close()


def read_acks(stdout: bytes) -> list[list]:
    return [json.loads(line) for line in stdout.decode().splitlines() if line.strip()]
