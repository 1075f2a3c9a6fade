"""`mqstore topic create|update|delete` handed to the running supervisor, and its answer.

The supervisor is the only writer of config/topics.json while it runs, and a delete must be
applied between two of its sweeps (the tombstone is the written end; the topic's queue offsets
restart), so the command does not edit the file itself: it writes its change as
`run/topic-requests/<ns>-<pid>.json` (atomically) and waits for `<same>.answer`, which the
supervisor writes (atomically) after applying or refusing the change, looking every
SUPERVISE_INTERVAL_S. A command that gives up withdraws its request; an answer no command
waits for any more is removed once it is STALE_S old (by the next command, and by the
supervisor every PRUNE_INTERVAL_S).

Anyone who can write run/ can put anything there, and the supervisor must survive it: a request
is opened without following a link and without blocking (a FIFO), must be a regular file of at
most MAX_REQUEST_BYTES, and anything that cannot be read as a change is answered with why and
renamed `<same>.bad` (kept for inspection, never read again). At most MAX_REQUESTS_PER_TICK are
taken per look, so a flood delays topic changes, not the supervisor's other work.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.errors import BadInputError, ServiceNotAvailableError, StoreError
from engine.files.filesystem import ensure_dir, move_aside, remove_file, write_file_atomically
from engine.files.naming import TEMP_SUFFIX
from ipc.run_info import run_dir

REQUESTS_DIR = "topic-requests"
REQUEST_SUFFIX = ".json"
ANSWER_SUFFIX = ".answer"
BAD_SUFFIX = ".bad"
POLL_S = 0.02
STALE_S = 600.0  # a request or answer this old belongs to a command that gave up
PRUNE_INTERVAL_S = 60.0
MAX_REQUEST_BYTES = 64 * 1024  # a change is a few dozen bytes
MAX_REQUESTS_PER_TICK = 16

log = logging.getLogger(__name__)


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


def pending_requests(store_dir: str | os.PathLike, *,
                     max_count: int = MAX_REQUESTS_PER_TICK) -> list[TopicRequest]:
    """Up to `max_count` requests not answered yet, oldest first; one that cannot be read is
    answered with why and moved aside as `.bad` (it counts towards `max_count`)."""
    directory = requests_dir(store_dir)
    try:
        names = sorted(name for name in os.listdir(directory) if name.endswith(REQUEST_SUFFIX))
    except FileNotFoundError:
        return []
    found, looked = [], 0
    for name in names:
        if looked >= max_count:
            break
        looked += 1
        path = directory / name
        try:
            change = json.loads(read_request_bytes(path).decode("utf-8"))
        except FileNotFoundError:  # withdrawn by its command
            continue
        # OSError: not openable; ValueError: not UTF-8 JSON, or not a regular small file;
        # RecursionError: JSON nested past the parser's depth
        except (OSError, ValueError, RecursionError) as exc:
            _refuse_unreadable(path, f"unreadable request: {exc}")
            continue
        if not isinstance(change, dict):
            _refuse_unreadable(path, f"a request is a JSON object, not {type(change).__name__}")
            continue
        found.append(TopicRequest(path, change))
    return found


def read_request_bytes(path: Path) -> bytes:
    """A request file's bytes: opened without following a link or blocking (a FIFO returns at
    once), BadInputError unless it is a regular file of at most MAX_REQUEST_BYTES."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadInputError("request", f"{path.name} is not a regular file")
        if info.st_size > MAX_REQUEST_BYTES:
            raise BadInputError("request", f"{path.name} holds {info.st_size} bytes, more than "
                                f"{MAX_REQUEST_BYTES}")
        data = os.read(fd, MAX_REQUEST_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_REQUEST_BYTES:  # grew since the fstat
        raise BadInputError("request", f"{path.name} holds more than {MAX_REQUEST_BYTES} bytes")
    return data


def _refuse_unreadable(path: Path, reason: str) -> None:
    """Answer a bad request and rename it `.bad`: a command waiting learns why, and it is never
    read again (a directory or FIFO cannot be unlinked as a file)."""
    log.warning("topic request %s refused: %s", path.name, reason)
    try:
        write_file_atomically(_answer_path(path), json.dumps({"error": reason}).encode("utf-8"))
        move_aside(path, path.parent, path.name[:-len(REQUEST_SUFFIX)] + BAD_SUFFIX)
    except OSError as exc:  # e.g. a `.bad` directory in the way: it is looked at again next time
        log.error("topic request %s not moved aside: %s", path.name, exc)


def remove_stale_answers(store_dir: str | os.PathLike) -> None:
    """Remove answers (and temporary files) older than STALE_S, whose command gave up."""
    try:
        _remove_stale(requests_dir(store_dir))
    except FileNotFoundError:
        pass


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
        if entry.name.endswith((ANSWER_SUFFIX, TEMP_SUFFIX)) and entry.is_file(follow_symlinks=False) \
                and now - entry.stat(follow_symlinks=False).st_mtime > STALE_S:
            remove_file(Path(entry.path))
