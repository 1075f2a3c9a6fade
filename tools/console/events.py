"""Recent events of a store for the console: starts, recoveries, restarts, retention passes,
stops, warnings and errors, read from the tail of `<store>/mqstore.log`.

Every mqstore process logs to that one file (tools.logging_setup), and the supervisor logs each
of these events there: the file is the store's event record, as it survives a crash and a
restart, unlike run/supervisor.json, which holds the current run's restarts only.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

from engine.files.naming import LOG_FILE

TAIL_BYTES = 1 << 20  # the last MiB of the log: hundreds of events, read in a few ms
MAX_EVENTS = 200

_LINE = re.compile(r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (?P<level>[A-Z]+)\s+"
                   r"(?P<who>\S+) (?P<logger>\S+): (?P<message>.*)$")


class EventKind(StrEnum):
    START = "start"
    RECOVERY = "recovery"
    RESTART = "restart"
    RETENTION = "retention"
    STOP = "stop"
    WARNING = "warning"
    ERROR = "error"


# The first pattern a message matches names its kind; INFO lines matching none are not events.
_KINDS = (
    (EventKind.RECOVERY, re.compile(r"^(recovering store|recovery[: ]|new store .*created)")),
    (EventKind.START, re.compile(r"^mqstore ready")),
    (EventKind.RESTART, re.compile(r"restarting in |restart budget|: not restarting|is hung")),
    (EventKind.RETENTION, re.compile(r"^retention \(|below the retention line")),
    (EventKind.STOP, re.compile(r"^(stopping \(|stopped cleanly|stopped with)")),
)


@dataclass(frozen=True)
class Event:
    at: str  # the log's local time, as written
    kind: EventKind
    level: str
    process: str  # role[pid]
    message: str

    def as_dict(self) -> dict:
        """The fields, and `at_ms`: `at` as epoch ms (None if unreadable), so the page shows it
        in its one date format."""
        return {**asdict(self), "at_ms": at_ms(self.at)}


def at_ms(at: str) -> int | None:
    """A log line's local time (`2026-12-01 21:39:05,711`) as epoch ms."""
    try:
        seconds = time.mktime(time.strptime(at[:19], "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return None
    return int(seconds) * 1000 + int(at[20:23] or 0)


def classify(level: str, message: str) -> EventKind | None:
    """The event kind of one log line, or None when it is not an event."""
    for kind, pattern in _KINDS:
        if pattern.search(message):
            return kind
    if level in ("ERROR", "CRITICAL"):
        return EventKind.ERROR
    if level == "WARNING":
        return EventKind.WARNING
    return None


def read_tail(path: Path, tail_bytes: int = TAIL_BYTES) -> list[str]:
    """The whole lines in the last `tail_bytes` of `path` (none when it does not exist)."""
    try:
        with open(path, "rb") as file:
            size = file.seek(0, 2)
            start = max(size - tail_bytes, 0)
            file.seek(start)
            data = file.read()
    except FileNotFoundError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[1:] if start > 0 and lines else lines  # the first one may be cut


def recent_events(store_dir: Path, max_events: int = MAX_EVENTS) -> list[Event]:
    """The last `max_events` events of the store's log, newest first."""
    events = []
    for line in read_tail(Path(store_dir) / LOG_FILE):
        match = _LINE.match(line)
        if match is None:  # a traceback's continuation lines belong to the line before
            continue
        kind = classify(match["level"], match["message"])
        if kind is not None:
            events.append(Event(match["at"], kind, match["level"], match["who"], match["message"]))
    return events[::-1][:max_events]
