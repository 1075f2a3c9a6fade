"""The record of consumer-offset fallbacks: `<store>/config/consumerOffset.json.fallbacks`.

    {"count": 2, "last_at_ms": 1764620000000, "last_reason": "consumerOffset.json: Expecting ...",
     "last_kept_as": "consumerOffset.json.torn-1764620000000"}

A torn or garbled consumerOffset.json is replaced by its `.bak`, one commit older, by the first
consumer that reads it (ipc.consumer_offsets); every group then reads again what it consumed
since that commit. Each such fallback is counted here, in a file beside the offsets, so that
`mqstore status` and the exporter show it for a live or a stopped store alike and the count
survives restarts (it only grows, unless the record itself is garbled past reading its
count: then it starts over). It is written under the offsets file's lock, atomically.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.errors import StoreError
from engine.files.filesystem import write_file_atomically
from engine.files.naming import CONFIG_DIR, CONSUMER_OFFSET_FILE

FALLBACKS_SUFFIX = ".fallbacks"


@dataclass(frozen=True)
class OffsetFallbacks:
    """How often the offsets file was replaced by its backup, and the last time why."""

    count: int = 0
    last_at_ms: int | None = None
    last_reason: str | None = None
    last_kept_as: str | None = None  # the bad file's new name in config/

    def as_dict(self) -> dict:
        return asdict(self)


def fallbacks_path(store_dir: str | os.PathLike) -> Path:
    return Path(store_dir) / CONFIG_DIR / (CONSUMER_OFFSET_FILE + FALLBACKS_SUFFIX)


def read_fallbacks(store_dir: str | os.PathLike) -> OffsetFallbacks:
    """The record (count 0 when no fallback ever happened); StoreError if it is garbled."""
    path = fallbacks_path(store_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        record = OffsetFallbacks(**data)
    except FileNotFoundError:
        return OffsetFallbacks()
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        raise StoreError(f"offset fallback record unreadable: {exc}", path=str(path),
                         hint="remove it: only the count of past fallbacks is lost") from None
    if not isinstance(record.count, int) or record.count < 0:
        raise StoreError(f"offset fallback record unreadable: count {record.count!r}", path=str(path),
                         hint="remove it: only the count of past fallbacks is lost")
    return record


def count_fallback(store_dir: str | os.PathLike, at_ms: int, reason: str, kept_as: str | None) -> int:
    """Add one fallback to the record (the caller holds the offsets lock); the new count. A
    garbled record keeps the count it still holds, else starts over at 1, rather than block
    the fallback it would count."""
    try:
        before = read_fallbacks(store_dir).count
    except StoreError:
        before = _readable_count(store_dir)
    record = OffsetFallbacks(before + 1, at_ms, reason, kept_as)
    write_file_atomically(fallbacks_path(store_dir), (json.dumps(record.as_dict()) + "\n").encode())
    return record.count


def _readable_count(store_dir: str | os.PathLike) -> int:
    """The count a garbled record still holds (its other fields bad), else 0."""
    try:
        count = json.loads(fallbacks_path(store_dir).read_text(encoding="utf-8")).get("count")
    except (OSError, ValueError, AttributeError):
        return 0
    return count if type(count) is int and count > 0 else 0
