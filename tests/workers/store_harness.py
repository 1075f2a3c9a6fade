"""Helpers for the process tests: a real `mqstore start` (tools.store_process.StoreProcess) on a
small store, with 30 s deadlines and its stderr beside the store directory; the CLI and Python
code in child processes. Imported as `tests.workers.store_harness`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.check.fsck import check
from ipc.shm import NAME_PREFIX, SHM_DIR, token_path
from tools.store_process import StoreProcess, wait_until, write_store_config
from workers.child_env import REPO_ROOT, child_env

DEADLINE_S = 30.0
POLL_S = 0.02

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


def write_config(path: Path, store: dict | None = None, supervisor: dict | None = None) -> Path:
    """A config for `mqstore start`: SMALL_STORE updated with `store`, and a [supervisor] table."""
    return write_store_config(path, {**SMALL_STORE, **(store or {})}, supervisor)


def wait_for(predicate: Callable[[], object], what: str, timeout_s: float = DEADLINE_S):
    return wait_until(predicate, what, timeout_s, POLL_S)


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


def start_store(root: Path, *, store: dict | None = None, supervisor: dict | None = None,
                env: dict | None = None, preexec_fn: Callable[[], None] | None = None) -> StoreProcess:
    """`mqstore start --store ROOT` with write_config's <root>.toml, its stderr appended to
    <root>.stderr; returns once it is READY (its shared-memory token remembered)."""
    root = Path(root)
    config = write_config(root.parent / f"{root.name}.toml", store, supervisor)
    running = StoreProcess(root, config, root.parent / f"{root.name}.stderr", env,
                           timeout_s=DEADLINE_S, poll_s=POLL_S, preexec_fn=preexec_fn,
                           on_ready=lambda started: store_shm_names(started.root))
    running.start()
    running.wait_ready()
    return running


def assert_check_clean(root: Path) -> None:
    findings = check(Path(root))
    assert findings == [], "\n".join(map(str, findings))


@contextmanager
def checked_store(root: Path, **start_kwargs) -> Iterator[StoreProcess]:
    """A test's store: started, yielded; it must stop cleanly even when the test failed, and
    check clean when it passed."""
    running = start_store(root, **start_kwargs)
    try:
        yield running
    finally:
        assert running.stop() == 0
    assert_check_clean(running.root)


def module_store(root: Path, **start_kwargs) -> Iterator[StoreProcess]:
    """A module fixture's store: started, yielded, then it must stop cleanly and check clean."""
    running = start_store(root, **start_kwargs)
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
