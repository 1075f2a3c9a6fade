"""Shared helpers for the store, recovery, crash and property tests.

Crash models (style anchors F.4):
- *process death*: `die(store)` releases the lock and unmaps without flushing, checkpointing or
  removing `abort`. Dirty mmap pages survive a killed process (the kernel holds them), so the
  files are exactly what the dead process had written.
- *power loss*: on top of that, bytes that were never msync'd may be lost; tests revert them to
  their last synced content (zeros for append-only files), see tests/crash.

Damage is always placed with the codec's constants (engine.formats.*), never magic offsets.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

from engine.check.fsck import check
from engine.config import StoreConfig
from engine.errors import StoreCorruptError
from engine.files.naming import (
    LOCK_FILE,
    commitlog_dir,
    consume_queue_dir,
    index_shard_dir,
    is_segment_name,
    offset_to_name,
)
from engine.formats.checkpoint import Checkpoint
from engine.formats.cq_entry import CQ_ENTRY_SIZE
from engine.formats.index_file import INDEX_ENTRY, decode_index_header, entry_pos
from engine.formats.record import encode_record
from engine.log.commitlog import CommitLog
from engine.recovery.recover import RecoveryMode
from engine.status import GetStatus
from engine.store import MessageStore
from engine.store_open import close_parts

SEGMENT_BYTES = 4096
TOPIC = "T"

# Small files so rolls, fillers and multi-file recovery happen in milliseconds. Checkpoints
# happen only at open, close and explicit `store.checkpoint()` (never on a wall-clock tick),
# so which positions are durable is decided by the test, not by timing.
SMALL_CONFIG = StoreConfig(commitlog_file_size=SEGMENT_BYTES, consume_queue_entries=10,
                           index_slot_count=64, index_entry_count=256, index_shards=2,
                           queue_count=4, cq_flush_interval_ms=10**9)


class FakeClock:
    """A millisecond clock that moves only when told (or by `step_ms` per reading)."""

    def __init__(self, start_ms: int = 1_700_000_000_000, step_ms: int = 0):
        self.now_ms = start_ms
        self.step_ms = step_ms

    def __call__(self) -> int:
        now = self.now_ms
        self.now_ms += self.step_ms
        return now

    def advance(self, ms: int) -> None:
        self.now_ms += ms


# ------------------------------------------------------------------------------ crashes


def die(store: MessageStore) -> None:
    """Process death: the lock goes with the process, `abort` and the last checkpoint stay,
    nothing is flushed, dispatched further or checkpointed on the way out."""
    store._lock.release()
    close_parts(store._parts)
    store._closed = True


def reopen(root: Path, config: StoreConfig = SMALL_CONFIG) -> MessageStore:
    return MessageStore.open(root, config)


def open_refused(root: Path, config: StoreConfig = SMALL_CONFIG) -> StoreCorruptError:
    """Open must refuse with StoreCorruptError and leave every file byte-identical (the lock
    file apart: taking the lock writes the holder's pid into it)."""
    before = {k: v for k, v in snapshot(root).items() if k != LOCK_FILE}
    try:
        MessageStore.open(root, config).close()
    except StoreCorruptError as exc:
        assert {k: v for k, v in snapshot(root).items() if k != LOCK_FILE} == before
        return exc
    raise AssertionError(f"opening {root} was not refused")


def rebuild(root: Path, config: StoreConfig = SMALL_CONFIG) -> MessageStore:
    """The operator's choice after a refusal (`mqstore recover --rebuild`)."""
    return MessageStore.open(root, config, recovery=RecoveryMode.REBUILD)


def close_and_check(store: MessageStore) -> list:
    """Close cleanly, then fsck the store (an empty list means consistent)."""
    store.close()
    return check(store.root)


# ------------------------------------------------------------------------------ files


def segment_of(root: Path, commit_pos: int, segment_bytes: int = SEGMENT_BYTES) -> tuple[Path, int]:
    """The commitlog segment file holding `commit_pos`, and the file position in it."""
    base = commit_pos - commit_pos % segment_bytes
    return commitlog_dir(root) / offset_to_name(base), commit_pos - base


def cq_entry_of(root: Path, queue_id: int, queue_offset: int, *, topic: str = TOPIC,
                entries_per_file: int = SMALL_CONFIG.consume_queue_entries) -> tuple[Path, int]:
    """The consume-queue file holding an entry, and the entry's file position."""
    lpos = queue_offset * CQ_ENTRY_SIZE
    file_bytes = entries_per_file * CQ_ENTRY_SIZE
    return (consume_queue_dir(root, topic, queue_id) / offset_to_name(lpos - lpos % file_bytes),
            lpos % file_bytes)


def patch(path: Path, file_pos: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(file_pos)
        fh.write(data)


def read(path: Path, file_pos: int, size: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(file_pos)
        return fh.read(size)


def log_bytes(root: Path) -> bytes:
    """The whole commitlog as one byte string indexed by commit position (segments contiguous,
    the first starting at 0)."""
    directory = commitlog_dir(root)
    names = sorted(n for n in os.listdir(directory) if is_segment_name(n))
    assert not names or names[0] == offset_to_name(0), names
    return b"".join((directory / n).read_bytes() for n in names)


def zero_log_from(root: Path, pos: int) -> None:
    """Zero every commitlog byte at or past commit position `pos` (a torn tail)."""
    directory = commitlog_dir(root)
    for name in sorted(n for n in os.listdir(directory) if is_segment_name(n)):
        path = directory / name
        base, size = int(name), path.stat().st_size
        if base + size > pos:
            start = max(pos - base, 0)
            patch(path, start, bytes(size - start))


def quarantined(root: Path) -> list[bytes]:
    """Contents of every quarantined tail, oldest name first."""
    directory = Path(root) / "quarantine"
    if not directory.is_dir():
        return []
    return [p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()]


def snapshot(root: Path) -> dict[str, str]:
    """Every file's and directory's relative path -> sha256 of its bytes ("dir" for directories)."""
    root = Path(root)
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            out[os.path.relpath(Path(dirpath) / name, root) + "/"] = "dir"
        for name in filenames:
            path = Path(dirpath) / name
            out[os.path.relpath(path, root)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def copy_store(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


# ------------------------------------------------------------------------------ reading


def queue_bodies(store: MessageStore, queue_id: int, topic: str = TOPIC) -> list[bytes]:
    """Every body of a queue from its min to its max offset, read through get_messages."""
    out: list[bytes] = []
    offset = store.min_offset(topic, queue_id)
    while offset < store.max_offset(topic, queue_id):
        result = store.get_messages(topic, queue_id, offset, 32)
        assert result.status is GetStatus.FOUND, (offset, result.status)
        out += [m.body for m in result.messages]
        offset = result.next_offset
    return out


def bodies_by_queue(messages: Iterable[tuple[int, bytes]]) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {}
    for queue_id, body in messages:
        out.setdefault(queue_id, []).append(body)
    return out


def local_time_ms(days_ahead: int, hour: int) -> int:
    """Epoch ms of `hour`:30 local time, `days_ahead` days from now (for retention's delete hour)."""
    t = time.localtime(time.time() + days_ahead * 86400)
    return int(time.mktime((t.tm_year, t.tm_mon, t.tm_mday, hour, 30, 0, 0, 0, -1)) * 1000)


def scan_start_after_index_trim(root: Path, cp: Checkpoint, config: StoreConfig = SMALL_CONFIG) -> int:
    """Routine recovery's scan start from checkpoint `cp`: its consume-queue position, or lower:
    a shard whose trim takes entries past its durable position re-indexes from its newest record
    below it (ShardIndex.trim_for_recovery). Read from the index files before the open."""
    starts = [cp.cq_durable_pos]
    for shard, durable_pos in enumerate(cp.index_durable_pos):
        positions = []
        for path in sorted(index_shard_dir(root, shard).iterdir()):
            data = path.read_bytes()
            positions += [INDEX_ENTRY.unpack_from(data, entry_pos(config.index_slot_count, n))[1]
                          for n in range(1, decode_index_header(data).index_count)]
        if any(pos >= durable_pos for pos in positions):
            starts.append(max((pos for pos in positions if pos < durable_pos), default=0))
    return min(starts)


def append_records(log: CommitLog, count: int, topic: str, body_bytes: int) -> None:
    """Append `count` records of `body_bytes` to `log` at queue offsets 0.., stored at ms 1."""
    for i in range(count):
        raw = encode_record(topic, b"r" * body_bytes, queue_id=0, properties={}, born_ts_ms=1,
                            born_host=("127.0.0.1", 1), store_host=("127.0.0.1", 2),
                            max_body_bytes=max(body_bytes, 1024))
        log.append(raw, queue_offset=i, store_ts_ms=1)
