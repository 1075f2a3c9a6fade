"""Committed consumer offsets: <store>/config/consumerOffset.json in RocketMQ's layout.

    {"offsetTable": {"<topic>@<group>": {"<queueId>": <next queue offset>, ...}, ...},
     "commitTimeTable": {"<topic>@<group>": {"<queueId>": <last commit, ms since epoch>, ...}, ...}}

`commitTimeTable` is mqstore's (operators read a group's last commit time from it); RocketMQ's
reader ignores keys it does not know, and a RocketMQ-written file without it reads as "never".
RocketMQ's fastjson writes the queue ids as bare integers ({0:250}), which is not JSON; the
reader accepts both, the writer writes strict JSON. A commit is a read-modify-write under an
flock on `consumerOffset.json.lock`, so consumers in several processes never lose each other's
commits, and the file is replaced atomically with the previous version kept as `.bak` (a torn
or garbled primary falls back to the backup).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from engine.errors import BadInputError, StoreError
from engine.filesystem import ensure_dir, write_file_atomically
from engine.naming import BACKUP_SUFFIX, CONFIG_DIR, CONSUMER_OFFSET_FILE, validate_topic

OffsetTable = dict[str, dict[int, int]]
CommitTimes = dict[str, dict[int, int]]  # same keys as OffsetTable; values are ms since epoch
GROUP_MAX_BYTES = 255
_GROUP_RE = re.compile(r"^[A-Za-z0-9_%|-]+$")
LOCK_SUFFIX = ".lock"


def validate_group(group: object) -> str:
    """A consumer group name: RocketMQ's characters, 1..255 bytes."""
    if not isinstance(group, str) or not group:
        raise BadInputError("group", "must be a non-empty str")
    if len(group.encode()) > GROUP_MAX_BYTES or not _GROUP_RE.match(group):
        raise BadInputError("group", f"{group!r} may only hold letters, digits, '%', '|', '-', '_' "
                            f"(at most {GROUP_MAX_BYTES} bytes)")
    return group


def table_key(topic: str, group: str) -> str:
    return f"{validate_topic(topic)}@{validate_group(group)}"


def _quote_bare_integer_keys(text: str) -> str:
    """Turn fastjson's `{0:250,1:250}` into `{"0":250,"1":250}`, leaving string literals alone."""
    out: list[str] = []
    i, n = 0, len(text)
    last_structural = ""
    while i < n:
        ch = text[i]
        if ch == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
            last_structural = '"'
            continue
        if (ch.isdigit() or ch == "-") and last_structural in ("{", ","):
            j = i + 1
            while j < n and text[j].isdigit():
                j += 1
            k = j
            while k < n and text[k].isspace():
                k += 1
            if k < n and text[k] == ":":
                out.append(f'"{text[i:j]}"')
                i = j
                last_structural = '"'
                continue
        if not ch.isspace():
            last_structural = ch
        out.append(ch)
        i += 1
    return "".join(out)


def parse_offset_table(text: str) -> OffsetTable:
    """Decode the file's text leniently (bare integer keys allowed); raise ValueError if garbled."""
    return parse_offset_document(text)[0]


def parse_offset_document(text: str) -> tuple[OffsetTable, CommitTimes]:
    """The offsets and the commit times of the file's text; raise ValueError if garbled."""
    data = json.loads(_quote_bare_integer_keys(text))
    if not isinstance(data, dict):
        raise ValueError("top level is not an object")
    return _int_table(data, "offsetTable"), _int_table(data, "commitTimeTable")


def _int_table(data: dict, name: str) -> dict[str, dict[int, int]]:
    raw = data.get(name, {})
    if not isinstance(raw, dict):
        raise ValueError(f"{name} is not an object")
    table: dict[str, dict[int, int]] = {}
    for key, queues in raw.items():
        if not isinstance(queues, dict):
            raise ValueError(f"{name} entry {key!r} is not an object")
        table[key] = {int(qid): int(value) for qid, value in queues.items()}
    return table


def encode_offset_table(table: Mapping[str, Mapping[int, int]],
                        commit_times: Mapping[str, Mapping[int, int]] | None = None) -> bytes:
    """Strict JSON, keys sorted, queue ids as strings (what RocketMQ's reader also accepts)."""
    def body(rows: Mapping[str, Mapping[int, int]]) -> dict:
        return {key: {str(qid): int(v) for qid, v in sorted(queues.items())}
                for key, queues in sorted(rows.items())}

    document = {"offsetTable": body(table)}
    if commit_times:
        document["commitTimeTable"] = body(commit_times)
    return (json.dumps(document, indent=2) + "\n").encode()


class ConsumerOffsets:
    """Read and commit the offsets of one store's consumer groups."""

    def __init__(self, store_dir: str | os.PathLike):
        self.path = Path(store_dir) / CONFIG_DIR / CONSUMER_OFFSET_FILE

    def load(self) -> OffsetTable:
        """The whole table ({} when no file exists); falls back to `.bak` if the primary is bad."""
        return self.load_with_times()[0]

    def load_with_times(self) -> tuple[OffsetTable, CommitTimes]:
        """The table and when each queue was last committed ({} for a queue never committed
        by mqstore); falls back to `.bak` as `load` does."""
        problems = []
        for path in (self.path, self.path.with_name(self.path.name + BACKUP_SUFFIX)):
            try:
                return parse_offset_document(path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                continue
            except (ValueError, UnicodeDecodeError) as exc:
                problems.append(f"{path.name}: {exc}")
        if problems:
            raise StoreError("consumer offsets unreadable: " + "; ".join(problems),
                             path=str(self.path), hint="fix or remove the file to start over")
        return {}, {}

    def get(self, topic: str, group: str, queue_id: int) -> int | None:
        """The committed next offset of one queue, or None when the group never committed it."""
        return self.load().get(table_key(topic, group), {}).get(queue_id)

    def commit(self, topic: str, group: str, queue_id: int, offset: int) -> None:
        self.commit_many(group, {(topic, queue_id): offset})

    def commit_many(self, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        """Persist several (topic, queue_id) -> offset commits in one atomic replace."""
        checked = {}
        for (topic, queue_id), offset in offsets.items():
            if not isinstance(queue_id, int) or isinstance(queue_id, bool) or queue_id < 0:
                raise BadInputError("queue_id", f"{queue_id!r} is not a non-negative int")
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise BadInputError("offset", f"{offset!r} is not a non-negative int")
            checked[(table_key(topic, group), queue_id)] = offset
        with self._locked():
            table, times = self.load_with_times()
            now_ms = time.time_ns() // 1_000_000
            for (key, queue_id), offset in checked.items():
                table.setdefault(key, {})[queue_id] = offset
                times.setdefault(key, {})[queue_id] = now_ms
            write_file_atomically(self.path, encode_offset_table(table, times),
                                  backup_suffix=BACKUP_SUFFIX)
            backup = self.path.with_name(self.path.name + BACKUP_SUFFIX)
            if backup.exists():  # the backup copy is made with the process umask: owner-only
                os.chmod(backup, 0o600)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        ensure_dir(self.path.parent)
        fd = os.open(self.path.with_name(self.path.name + LOCK_SUFFIX), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
