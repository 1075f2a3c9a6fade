"""`mqstore topic create|update|delete` handed to the running supervisor, and its answer.

The supervisor is the only writer of config/topics.json while it runs, and a delete must be
applied between two of its sweeps (the tombstone is the written end; the topic's queue offsets
restart), so the command does not edit the file itself: it writes its change as
`run/topic-requests/<ns>-<pid>.json` (atomically) and waits for `<same>.answer`, which the
supervisor writes (atomically) after applying or refusing the change, looking every
SUPERVISE_INTERVAL_S. A command that gives up withdraws its request; an answer no command
waits for any more is removed by the next command once it is STALE_S old.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ServiceNotAvailableError, StoreError
from engine.files.filesystem import ensure_dir, remove_file, write_file_atomically
from engine.files.naming import TEMP_SUFFIX
from ipc.run_info import run_dir

REQUESTS_DIR = "topic-requests"
REQUEST_SUFFIX = ".json"
ANSWER_SUFFIX = ".answer"
POLL_S = 0.02
STALE_S = 600.0  # a request or answer this old belongs to a command that gave up


@dataclass(frozen=True, slots=True)
class TopicRequest:
    """One request file: its path and the change it asks for (a dict, as written)."""

    path: Path
    change: dict

    def answer(self, result: dict) -> None:
        """Write the answer, then remove the request (a crash in between answers it again)."""
        write_file_atomically(_answer_path(self.path), json.dumps(result).encode("utf-8"))
        remove_file(self.path)


def requests_dir(store_dir: str | os.PathLike) -> Path:
    return run_dir(store_dir) / REQUESTS_DIR


def post_request(store_dir: str | os.PathLike, change: dict) -> Path:
    """Write a request for the supervisor; returns its path (for `wait_for_answer`)."""
    directory = ensure_dir(requests_dir(store_dir))
    _remove_stale(directory)
    path = directory / f"{time.time_ns()}-{os.getpid()}{REQUEST_SUFFIX}"
    write_file_atomically(path, json.dumps(change).encode("utf-8"))
    return path


def pending_requests(store_dir: str | os.PathLike) -> list[TopicRequest]:
    """The requests not answered yet, oldest first; an unreadable one is answered with why."""
    directory = requests_dir(store_dir)
    try:
        names = sorted(name for name in os.listdir(directory) if name.endswith(REQUEST_SUFFIX))
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        path = directory / name
        try:
            change = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:
            TopicRequest(path, {}).answer({"error": f"unreadable request: {exc}"})
            continue
        found.append(TopicRequest(path, change if isinstance(change, dict) else {}))
    return found


def wait_for_answer(path: Path, timeout_s: float, supervisor_alive: Callable[[], bool]) -> dict:
    """The supervisor's answer to the request at `path` (its files removed); StoreError when it
    does not come within `timeout_s`, ServiceNotAvailableError when the supervisor exits."""
    answer_path = _answer_path(path)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = json.loads(answer_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            result = None
        if result is not None:
            remove_file(answer_path)
            return result
        if not supervisor_alive():
            remove_file(path)
            raise ServiceNotAvailableError("the supervisor exited before it answered the topic change")
        if time.monotonic() > deadline:
            remove_file(path)
            raise StoreError(f"the supervisor did not answer the topic change within {timeout_s:g} s",
                             hint="see mqstore.log; the change was withdrawn unless it was applied")
        time.sleep(POLL_S)


def _answer_path(path: Path) -> Path:
    return path.with_name(path.name[:-len(REQUEST_SUFFIX)] + ANSWER_SUFFIX)


def _remove_stale(directory: Path) -> None:
    now = time.time()
    for entry in os.scandir(directory):
        if entry.name.endswith((ANSWER_SUFFIX, TEMP_SUFFIX)) and now - entry.stat().st_mtime > STALE_S:
            remove_file(Path(entry.path))
