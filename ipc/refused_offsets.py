"""Refused committed offsets: `<store>/config/consumerOffset.refused.json` (mqstore's own file).

    {"refused": [{"group": "g", "topic": "T", "queue_id": 0, "offset": 10, "queue_end_seen": 6,
                  "detected_ms": 1764620000000, "where": "supervisor start"}, ...]}

A committed offset past its queue's end or below zero is refused when read; the refusal must not
lift by itself once producers refill the queue past the offset (the messages below it would be
skipped in silence). So each one found is written here, by a consumer that reads it or by the
supervisor at start (queue ends are exact right after recovery), each with a WARNING its writer
gives (refusal_message), and a consumer
refuses a committed offset with an entry of the same value whatever the queue's end is now.
`mqstore groups --reset` clears the entries of what it resets; a commit of another value by the
group clears its queue's entry (the offset moved on by a deliberate act). Written atomically
under the offsets file's lock.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from engine.errors import StoreError, offset_outside_words
from engine.files.filesystem import ensure_dir, write_file_atomically
from engine.files.naming import CONFIG_DIR, CONSUMER_OFFSET_FILE
from ipc.offset_table_codec import parse_offset_document

log = logging.getLogger(__name__)
REFUSED_FILE = "consumerOffset.refused.json"
_LOCK_NAME = CONSUMER_OFFSET_FILE + ".lock"  # the offsets file's lock: one writer at a time


@dataclass(frozen=True)
class RefusedOffset:
    """A committed offset found outside its queue: who, where, the end it was tested against."""

    group: str
    topic: str
    queue_id: int
    offset: int
    queue_end_seen: int
    detected_ms: int
    where: str  # "consumer pid N" or "supervisor start"

    def same_queue(self, group: str, topic: str, queue_id: int) -> bool:
        return (self.group, self.topic, self.queue_id) == (group, topic, queue_id)


_INT_FIELDS = ("queue_id", "offset", "queue_end_seen", "detected_ms")


def decode_refused(text: str) -> list[RefusedOffset]:
    """The entries of the file's text; ValueError if it is not exactly the documented shape."""
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("refused"), list):
        raise ValueError("top level is not an object with a 'refused' list")
    names = {f.name for f in fields(RefusedOffset)}
    entries = []
    for raw in data["refused"]:
        if not isinstance(raw, dict) or set(raw) != names:
            raise ValueError(f"entry {raw!r} does not hold exactly {sorted(names)}")
        for name in names:
            wanted = int if name in _INT_FIELDS else str
            if type(raw[name]) is not wanted:
                raise ValueError(f"entry field {name} is {json.dumps(raw[name])}, not {wanted.__name__}")
        entries.append(RefusedOffset(**raw))
    return entries


def encode_refused(entries: Iterable[RefusedOffset]) -> bytes:
    rows = sorted((asdict(e) for e in entries), key=lambda r: (r["group"], r["topic"], r["queue_id"]))
    return (json.dumps({"refused": rows}, indent=2) + "\n").encode()


def refused_path(store_dir: str | os.PathLike) -> Path:
    return Path(store_dir) / CONFIG_DIR / REFUSED_FILE


def read_refused(store_dir: str | os.PathLike) -> list[RefusedOffset]:
    """Every entry ([] when the file does not exist); StoreError when it is garbled."""
    path = refused_path(store_dir)
    try:
        return decode_refused(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (ValueError, UnicodeDecodeError) as exc:
        raise StoreError(f"refused offsets unreadable: {exc}", path=str(path),
                         hint="reset the groups it names (`mqstore groups --reset`), then remove it"
                         ) from None


def find_refused(entries: Iterable[RefusedOffset], group: str, topic: str, queue_id: int,
                 offset: int) -> RefusedOffset | None:
    """The entry refusing this committed offset, if any."""
    for entry in entries:
        if entry.same_queue(group, topic, queue_id) and entry.offset == offset:
            return entry
    return None


def refusal_message(entry: RefusedOffset) -> str:
    """The WARNING that says an offset was found outside its queue, and how to go on."""
    where = offset_outside_words(entry.offset, entry.queue_end_seen)
    return (f"group {entry.group} committed offset {entry.offset} on {entry.topic}/{entry.queue_id}, "
            f"{where} (found by {entry.where}); refused until `mqstore groups --reset --group "
            f"{entry.group} --topic {entry.topic}`")


def record_refused(store_dir: str | os.PathLike, found: Iterable[RefusedOffset]) -> None:
    """Add the entries, each replacing one of the same queue; the caller warns (refusal_message)."""
    found = list(found)
    if not found:
        return
    with offsets_lock(store_dir):
        kept = [e for e in read_refused(store_dir)
                if not any(e.same_queue(n.group, n.topic, n.queue_id) for n in found)]
        write_file_atomically(refused_path(store_dir), encode_refused(kept + found))


def clear_refused(store_dir: str | os.PathLike, group: str, topic: str, queue_ids: Iterable[int], *,
                  except_offset: int | None = None) -> list[RefusedOffset]:
    """Drop the entries of these queues of `group` on `topic` (but one refusing `except_offset`,
    the value being committed again); the entries dropped."""
    queue_ids = set(queue_ids)
    if not refused_path(store_dir).exists():
        return []
    with offsets_lock(store_dir):
        entries = read_refused(store_dir)
        dropped = [e for e in entries if e.group == group and e.topic == topic and e.queue_id in queue_ids
                   and e.offset != except_offset]
        if dropped:
            write_file_atomically(refused_path(store_dir),
                                  encode_refused(e for e in entries if e not in dropped))
        return dropped


def refuse_offsets_past_their_queues(store_dir: str | os.PathLike,
                                     queue_ends: Mapping[tuple[str, int], int]) -> list[RefusedOffset]:
    """At a supervisor's start, right after recovery (every queue's end is exact then, as the
    whole log was re-dispatched): record every committed offset past its queue's end or below
    zero (a queue not in `queue_ends` ends at 0) before any consumer reads it; the new entries.
    A bad offsets file is left to the first consumer, which falls back to its backup."""
    path = Path(store_dir) / CONFIG_DIR / CONSUMER_OFFSET_FILE
    try:
        table = parse_offset_document(path.read_text(encoding="utf-8"))[0]
    except FileNotFoundError:
        return []
    except (ValueError, UnicodeDecodeError) as exc:
        log.warning("committed offsets not checked at start: %s unreadable: %s", path.name, exc)
        return []
    try:
        known = read_refused(store_dir)
    except StoreError as exc:  # the consumers refuse to read until it is fixed; the store serves
        log.warning("committed offsets not checked at start: %s", exc)
        return []
    now_ms = time.time_ns() // 1_000_000
    found = []
    for key, queues in sorted(table.items()):
        topic, _, group = key.partition("@")
        for queue_id, offset in sorted(queues.items()):
            end = queue_ends.get((topic, queue_id), 0)
            if not 0 <= offset <= end and find_refused(known, group, topic, queue_id, offset) is None:
                found.append(RefusedOffset(group, topic, queue_id, offset, end, now_ms, "supervisor start"))
    record_refused(store_dir, found)
    return found


@contextmanager
def offsets_lock(store_dir: str | os.PathLike) -> Iterator[None]:
    """The offsets file's lock (exclusive): one writer at a time of the offsets and refused files."""
    directory = ensure_dir(Path(store_dir) / CONFIG_DIR)
    fd = os.open(directory / _LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
