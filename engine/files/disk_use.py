"""What each part of a store allocates on disk beside the bytes its data fills (DiskUse), for
`mqstore status`, `mqstore topics` and the exporter.

Allocated bytes are the files' blocks (st_blocks, what `du` counts): files are sparse at
RocketMQ's sizes, and blocks are reserved ahead of the writers
(docs/DECISIONS.md#reserve-blocks-ahead). Used bytes hold data: the commitlog from its first
segment's start to the end of its last written page (an estimate: a page of zeros inside a body
ends it early), a consume queue from its first file's start to its last entry (fillers
included), an index file's header, set slots and entries. Files are read with pread only (no
mapping, no lock), so a live store is measured as it is written: a figure may trail the writer.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.errors import CorruptIndexError
from engine.files.naming import COMMITLOG_DIR, CONSUMEQUEUE_DIR, INDEX_DIR, segment_files
from engine.formats.cq_entry import CQ_ENTRY_SIZE
from engine.formats.index_file import INDEX_ENTRY_SIZE, INDEX_HEADER_SIZE, SLOT_SIZE, decode_index_header

PARTS = {"commitlog": COMMITLOG_DIR, "consumequeue": CONSUMEQUEUE_DIR, "index": INDEX_DIR}
_COMMITLOG_UNIT_BYTES = 4096  # the commitlog's used end is found to the page


@dataclass(frozen=True)
class DiskUse:
    """Blocks allocated to some files, and the bytes of them that hold data."""

    allocated_bytes: int = 0
    used_bytes: int = 0

    def __add__(self, other: DiskUse) -> DiskUse:
        return DiskUse(self.allocated_bytes + other.allocated_bytes, self.used_bytes + other.used_bytes)


def store_disk_use(root: Path) -> dict[str, DiskUse]:
    """DiskUse of each part of the store at `root` (PARTS); a missing part uses nothing."""
    root = Path(root)
    queues = DiskUse()
    for queue_dir in _queue_dirs(root / CONSUMEQUEUE_DIR):
        queues += queue_disk_use(queue_dir)
    return {"commitlog": commitlog_disk_use(root / COMMITLOG_DIR), "consumequeue": queues,
            "index": index_disk_use(root / INDEX_DIR)}


def allocated_bytes(directory: Path) -> int:
    """Allocated bytes of every file under `directory` (0 when it is missing); a file deleted
    while walking is skipped."""
    total = 0
    for dirpath, _, names in os.walk(directory):
        for name in names:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


def commitlog_disk_use(directory: Path) -> DiskUse:
    """The segments' blocks, and the bytes from the first segment to the last written page."""
    return _segments_disk_use(directory, _COMMITLOG_UNIT_BYTES)


def queue_disk_use(queue_dir: Path) -> DiskUse:
    """One consume queue's blocks, and its bytes from its first file's start to its last entry
    (a queue's entries are a prefix of its files: the first zero entry ends it)."""
    return _segments_disk_use(queue_dir, CQ_ENTRY_SIZE)


def index_disk_use(directory: Path) -> DiskUse:
    """The index files' blocks, and of each its header, set slots and entries (from its header)."""
    use = DiskUse()
    for dirpath, _, names in os.walk(directory):
        for name in names:
            try:
                with open(os.path.join(dirpath, name), "rb") as file:
                    allocated = os.fstat(file.fileno()).st_blocks * 512
                    header = decode_index_header(file.read(INDEX_HEADER_SIZE))
            except FileNotFoundError:  # retention removed it meanwhile
                continue
            except CorruptIndexError:  # shorter than a header: a crash's leftover, no data
                use += DiskUse(allocated, 0)
                continue
            use += DiskUse(allocated, INDEX_HEADER_SIZE + max(header.hash_slot_count, 0) * SLOT_SIZE
                           + max(header.index_count - 1, 0) * INDEX_ENTRY_SIZE)
    return use


def _queue_dirs(consumequeue_dir: Path) -> list[Path]:
    if not consumequeue_dir.is_dir():
        return []
    return [queue_dir for topic_dir in sorted(consumequeue_dir.iterdir()) if topic_dir.is_dir()
            for queue_dir in sorted(topic_dir.iterdir()) if queue_dir.is_dir()]


def _segments_disk_use(directory: Path, unit_bytes: int) -> DiskUse:
    """Blocks of the segments of `directory`, and the bytes from the first one's start to the
    end of the last non-zero `unit_bytes` unit of the last segment that holds any."""
    files = segment_files(directory)
    allocated, data_end = 0, None
    for file in reversed(files):
        try:
            fd = os.open(file.path, os.O_RDONLY)
        except FileNotFoundError:  # retention removed it meanwhile
            continue
        try:
            stat = os.fstat(fd)
            allocated += stat.st_blocks * 512
            if data_end is None:
                written = _written_units(fd, stat.st_size // unit_bytes, unit_bytes)
                data_end = file.base_pos + written * unit_bytes if written else None
        finally:
            os.close(fd)
    used = 0 if data_end is None else data_end - files[0].base_pos
    return DiskUse(allocated, used)


def _written_units(fd: int, unit_count: int, unit_bytes: int) -> int:
    """How many units the written prefix of the file holds, by bisection: unit i is written when
    it holds a non-zero byte (0 when the first unit is zeros)."""
    if unit_count == 0 or not any(os.pread(fd, unit_bytes, 0)):
        return 0
    low, high = 0, unit_count  # unit `low` is written, `high` is past the end
    while high - low > 1:
        middle = (low + high) // 2
        if any(os.pread(fd, unit_bytes, middle * unit_bytes)):
            low = middle
        else:
            high = middle
    return low + 1


def human_bytes(size_bytes: int) -> str:
    """Bytes in B below 1 KiB, else in the largest binary unit up to GiB, one decimal."""
    if size_bytes < 1024:
        return f"{size_bytes} B"
    exponent = min(3, (size_bytes.bit_length() - 1) // 10)
    return f"{size_bytes / 1024 ** exponent:.1f} {('KiB', 'MiB', 'GiB')[exponent - 1]}"
