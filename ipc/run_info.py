"""The running supervisor's description for its clients: <store>/run/supervisor.json.

The control block carries positions and process slots in fixed-size structs; what clients also
need but what is not fixed-size lives in this small JSON file, written atomically by the
supervisor before it declares the store READY:

    {"supervisor_pid": 4242, "generation": 3, "store_host": "127.0.0.1:10911",
     "queue_count": 8, "max_body_bytes": 4194304, "flush": "sync",
     "sync_flush_timeout_ms": 5000, "index_shards": 2, "started_at": 1700000000.0,
     "ready_at": 1700000000.4, "restart_history": [{"at": ..., "role": "dispatcher",
     "shard": 0, "pid": 4250, "what": "killed by SIGKILL ..."}, ...]}

`<store>/run/` also holds the flock files clients claim mailbox slots and waiter entries with.
A client trusts the file only when its supervisor_pid is the control block's. Writing it on a
full disk raises DiskFullError and leaves the previous file in place.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import DiskFullError, ServiceNotAvailableError
from engine.files.filesystem import DISK_FULL_ERRNOS, ensure_dir, remove_file, write_file_atomically

RUN_DIR = "run"
RUN_INFO_FILE = "supervisor.json"


def run_dir(store_dir: str | os.PathLike) -> Path:
    return Path(store_dir) / RUN_DIR


def run_info_path(store_dir: str | os.PathLike) -> Path:
    return run_dir(store_dir) / RUN_INFO_FILE


@dataclass(frozen=True)
class RunInfo:
    supervisor_pid: int
    generation: int
    store_host: str
    queue_count: int
    max_body_bytes: int
    flush: str
    sync_flush_timeout_ms: int
    index_shards: int
    started_at: float
    ready_at: float = 0.0
    delay_level_count: int = 18  # levels 1..count of message_delay_level (absent: RocketMQ's 18)
    timer_max_delay_s: int = 259200  # how far ahead a timed message may be due (3 days)
    restart_history: list[dict] = field(default_factory=list)

    @property
    def store_ip_port(self) -> tuple[str, int]:
        host, _, port = self.store_host.rpartition(":")
        return host, int(port)

    def replace(self, **changes) -> RunInfo:
        return dataclasses.replace(self, **changes)


def write_run_info(store_dir: str | os.PathLike, info: RunInfo) -> None:
    ensure_dir(run_dir(store_dir))
    data = json.dumps(dataclasses.asdict(info), indent=2, sort_keys=True) + "\n"
    path = run_info_path(store_dir)
    try:
        write_file_atomically(path, data.encode())
    except OSError as exc:
        if exc.errno not in DISK_FULL_ERRNOS:
            raise
        raise DiskFullError(f"no space left to write {path.name}: {exc.strerror}",
                            path=str(path)) from exc


def read_run_info(store_dir: str | os.PathLike, supervisor_pid: int | None = None) -> RunInfo:
    """The supervisor's description; ServiceNotAvailableError if absent or someone else's."""
    path = run_info_path(store_dir)
    try:
        data = json.loads(path.read_text())
        known = {f.name for f in dataclasses.fields(RunInfo)}
        info = RunInfo(**{k: v for k, v in data.items() if k in known})
    except FileNotFoundError:
        if supervisor_pid is not None:
            raise ServiceNotAvailableError("the store's supervisor is starting or stopping",
                                           path=str(store_dir), hint="retry in a moment") from None
        raise ServiceNotAvailableError("no supervisor runs on this store", path=str(store_dir),
                                       hint="start it with `mqstore start`") from None
    except (ValueError, TypeError) as exc:
        raise ServiceNotAvailableError(f"{path.name} is unreadable: {exc}", path=str(path)) from None
    if supervisor_pid is not None and info.supervisor_pid != supervisor_pid:
        raise ServiceNotAvailableError("the store's supervisor is starting or restarting",
                                       path=str(store_dir), hint="retry in a moment")
    return info


def remove_run_info(store_dir: str | os.PathLike) -> None:
    remove_file(run_info_path(store_dir))
