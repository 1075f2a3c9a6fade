"""The retention part of `mqstore status`: the line, what the passes removed, the oldest
message still retained and the disk each part of the store allocates and uses (engine.files.disk_use:
blocks, and the bytes of them holding data); the oldest retained time is the STORETIMESTAMP of
the first record at the line.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

from engine.errors import StoreError
from engine.files.disk_use import human_bytes, store_disk_use
from engine.files.mapped_file import Access
from engine.files.store_dir import read_meta
from engine.formats.record import V4_HEADER_SIZE, store_ts_at
from engine.log.commitlog import CommitLog
from ipc.control_block import ControlBlock
from ipc.retention_block import RetentionBlock


def describe_retention(root: Path, ctl: ControlBlock) -> dict:
    """JSON-ready retention facts of a running store."""
    block = RetentionBlock(ctl)
    line, cleans = block.line(), block.cleans()
    oldest_ms = oldest_store_ts_ms(root, line.min_commit_pos, ctl.written_pos)
    disk = store_disk_use(root)
    return {
        "min_commit_pos": line.min_commit_pos,
        "oldest_retained_ms": oldest_ms,
        "oldest_retained": None if oldest_ms is None else
        datetime.fromtimestamp(oldest_ms / 1000, UTC).isoformat(timespec="milliseconds"),
        "bytes_allocated": {part: use.allocated_bytes for part, use in disk.items()},
        "bytes_used": {part: use.used_bytes for part, use in disk.items()},
        "passes": line.passes,
        "segments_removed": line.segments_removed,
        "bytes_removed": line.bytes_removed,
        "last_pass_ms": line.last_pass_ms or None,
        "last_reason": line.last_reason.value,
        "cleaned_to": {part: clean.clean_pos for part, clean in cleans.items()},
        "files_removed": {part: clean.files_removed for part, clean in cleans.items()},
    }


def oldest_store_ts_ms(root: Path, min_commit_pos: int, written_pos: int) -> int | None:
    """Store time of the record at the line (a segment starts with a record); None when the
    store holds no record, or the segment went meanwhile."""
    if min_commit_pos >= written_pos:
        return None
    try:
        commitlog = CommitLog.open(root, read_meta(root).commitlog_file_size, Access.READ_ONLY)
    except (StoreError, OSError):
        return None
    try:
        return store_ts_at(commitlog.read_bytes(commitlog.min_pos, V4_HEADER_SIZE), 0)
    except (StoreError, ValueError):
        return None
    finally:
        commitlog.close()


def render_retention(retention: dict) -> list[str]:
    """The status lines of describe_retention()."""
    allocated, used = retention["bytes_allocated"], retention["bytes_used"]
    oldest = retention["oldest_retained"] or "-"
    if retention["oldest_retained_ms"] is not None:
        age_s = max(time.time() - retention["oldest_retained_ms"] / 1000, 0.0)
        oldest += f" ({age_s:.0f} s ago)"
    return ["", f"retention  oldest retained {oldest}, from commit_pos {retention['min_commit_pos']}",
            "           disk allocated (used): " + ", ".join(
                f"{label} {human_bytes(allocated[part])} ({human_bytes(used[part])})"
                for part, label in (("commitlog", "commitlog"), ("consumequeue", "consume queues"),
                                    ("index", "index"))),
            f"           {retention['passes']} pass(es), {retention['segments_removed']} segment(s) "
            f"removed ({retention['bytes_removed'] / 2**20:.1f} MiB), last: {retention['last_reason']}"]
