"""The ledger: what producers were told, kept apart from the store and fsynced per batch.

Each load producer (tools.torture.load) owns one ledger file and appends one line per message
the store answered as stored, right after the answer and before it sends the next batch; the
lines of a batch are made durable with one fsync. The ledger is the torture's outside truth: a
message in it with status `ok` was acknowledged (PUT_OK) and must be in the store exactly once
after any crash under sync flush; `timeout` (FLUSH_DISK_TIMEOUT) was stored but not confirmed
durable, so it may be lost but never duplicated.

Line format (JSON array, one per line, newline-terminated):

    [identity, topic, queue_id, queue_offset, commit_pos, record_bytes, body_digest,
     [keys...], tags or null, status, ack_ms]

A producer killed mid-write leaves at most one line without its newline: the reader ignores it
(that message counts as never acknowledged, as if the answer had come after the kill).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from engine.files.filesystem import fsync_dir

LEDGER_SUFFIX = ".ledger"
IDENTITY_PROPERTY = "TORTURE_ID"
STATUS_OK = "ok"
STATUS_TIMEOUT = "timeout"
DIGEST_BYTES = 12


def body_digest(body: bytes) -> str:
    """A short, collision-safe digest of a body (BLAKE2b, 96 bits, hex)."""
    return hashlib.blake2b(body, digest_size=DIGEST_BYTES).hexdigest()


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One acknowledged (or timed-out) message, as the producer was told."""

    identity: str
    topic: str
    queue_id: int
    queue_offset: int
    commit_pos: int
    record_bytes: int
    body_digest: str
    keys: tuple[str, ...]
    tags: str | None
    status: str
    ack_ms: int

    @property
    def end_pos(self) -> int:
        return self.commit_pos + self.record_bytes

    @property
    def acknowledged(self) -> bool:
        return self.status == STATUS_OK

    def to_line(self) -> str:
        return json.dumps([self.identity, self.topic, self.queue_id, self.queue_offset,
                           self.commit_pos, self.record_bytes, self.body_digest, list(self.keys),
                           self.tags, self.status, self.ack_ms], separators=(",", ":")) + "\n"

    @classmethod
    def from_line(cls, line: str) -> LedgerEntry:
        (identity, topic, queue_id, queue_offset, commit_pos, record_bytes, digest, keys, tags,
         status, ack_ms) = json.loads(line)
        return cls(identity, topic, queue_id, queue_offset, commit_pos, record_bytes, digest,
                   tuple(keys), tags, status, ack_ms)


class LedgerWriter:
    """Appends entries to one ledger file; `append_batch` returns once they are on disk."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.entry_count = 0
        fsync_dir(self.path.parent)

    def append_batch(self, entries: Iterable[LedgerEntry]) -> int:
        """Write the lines of a batch and fsync once; returns how many were written."""
        data = "".join(entry.to_line() for entry in entries).encode()
        if not data:
            return 0
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        os.fsync(self._fd)
        written = data.count(b"\n")
        self.entry_count += written
        return written

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> LedgerWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def ledger_paths(directory: Path) -> list[Path]:
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.endswith(LEDGER_SUFFIX))


def count_lines(directory: Path) -> int:
    """How many complete entries the ledgers of `directory` hold (cheap: counts newlines)."""
    total = 0
    for path in ledger_paths(directory):
        with open(path, "rb") as fh:
            total += fh.read().count(b"\n")
    return total


class LedgerReader:
    """Reads the ledgers of a directory incrementally: each call parses only what was appended."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self._offsets: dict[Path, int] = {}
        self.entries: list[LedgerEntry] = []

    def read_all(self) -> list[LedgerEntry]:
        """Every complete entry so far, oldest file first (files are never rewritten)."""
        for path in ledger_paths(self.directory):
            offset = self._offsets.get(path, 0)
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
            end = data.rfind(b"\n") + 1
            self.entries += [LedgerEntry.from_line(line)
                             for line in data[:end].decode().splitlines() if line]
            self._offsets[path] = offset + end
        return self.entries

    def count_lines(self, tags: list[str]) -> int:
        """Complete entries in the ledgers of the producers `tags` (cheap: counts newlines)."""
        total = 0
        for tag in tags:
            path = self.directory / f"{tag}{LEDGER_SUFFIX}"
            if path.exists():
                with open(path, "rb") as fh:
                    total += fh.read().count(b"\n")
        return total
