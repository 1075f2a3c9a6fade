"""Faults beyond a kill: simulated power loss, and single-byte flips placed by the codecs.

Power loss (style anchors F.4). SIGKILL keeps dirty pages (the kernel still holds them), so a
killed store's files are exactly what it wrote. A power loss also loses what the page cache had
not written back. `simulate_power_loss` runs on the files of a store whose processes are all
dead, given the positions each structure was durable up to at the moment of the loss (read from
the frozen control block), and for every file computes two versions:

- *new*: the file as the processes left it;
- *old*: the file as it was at its last sync -- commitlog bytes at or past the flushed
  position zeroed; consume-queue entries pointing at or past the consume queues' durable
  position zeroed; the last index file of each shard trimmed back to its shard's durable
  position (what IndexFile.trim_from computes from the entries and their chains: the entries,
  slot heads and header as they were when that position was synced), or, if the file was
  created after that position, the header it was created with (seeded with the previous file's
  end, synced by IndexFile.create) and nothing else. An index file that is not its shard's last
  was synced whole when the shard rolled past it (ShardIndex._roll), so it loses nothing.

Then every page where the two differ is, at random, kept new (written back before the loss) or
reverted to old (never written back: a page of zeros past the end of an append-only file).
With `Tear.SECTOR` a page may also be torn: each 512-byte sector taken from old or new
independently (a disk without atomic 4 KiB writes writes sectors, not pages, atomically), which
tears the 20-byte consume-queue and index entries that straddle a sector boundary.
The checkpoint is replaced atomically by the store (temp, fsync, rename),
so a power loss leaves the new one, or the old one (our `.bak` copy of it), and possibly a torn
temp file next to it; all three are modelled.

Flips: positions are taken from the codecs' constants and the files' own structure (the start of
each record, consume-queue entry, index entry, the checkpoint's used bytes), never literals.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import numpy as np

from engine.config import StoreConfig
from engine.errors import CorruptIndexError, CorruptRecordError
from engine.files.filesystem import PAGE_BYTES
from engine.files.mapped_file import Access
from engine.files.naming import (
    BACKUP_SUFFIX,
    CHECKPOINT_FILE,
    CONSUMEQUEUE_DIR,
    INDEX_DIR,
    TEMP_SUFFIX,
    commitlog_dir,
    is_segment_name,
    segment_files,
)
from engine.formats.cq_entry import CQ_DTYPE, CQ_ENTRY_SIZE
from engine.formats.index_file import (
    INDEX_HEADER,
    INDEX_HEADER_SIZE,
    decode_index_header,
    entry_pos,
)
from engine.index.file import IndexFile
from ipc.control_block import Positions

SECTOR_BYTES = 512


class PageFate(Enum):
    KEEP = "kept"  # written back before the loss
    REVERT = "reverted"  # never written back
    TEAR = "torn"  # some sectors written back


class Tear(Enum):
    """The unit a power loss can split: whole pages only, or 512-byte sectors of a page."""

    PAGE = "page"
    SECTOR = "sector"


class CheckpointFate(Enum):
    NEW = "new"
    OLD = "old"
    NEW_WITH_TORN_TEMP = "new + torn temp file"
    OLD_WITH_TORN_TEMP = "old + torn temp file"


@dataclass(frozen=True)
class DurablePositions:
    """Where each structure was synced up to when the power went."""

    commitlog_flushed_pos: int
    cq_durable_pos: int
    shard_durable_pos: tuple[int, ...]

    @classmethod
    def from_positions(cls, positions: Positions) -> DurablePositions:
        return cls(positions.flushed_pos, positions.cq_durable_pos, tuple(positions.shard_durable_pos))


@dataclass
class PowerLossReport:
    """What the simulated power loss did, page by page."""

    pages: Counter = field(default_factory=Counter)  # PageFate.value -> count
    files_touched: int = 0
    checkpoint: str = CheckpointFate.NEW.value

    def summary(self) -> str:
        pages = ", ".join(f"{n} {fate}" for fate, n in sorted(self.pages.items())) or "no pages"
        return f"{self.files_touched} files changed ({pages}); checkpoint: {self.checkpoint}"


def simulate_power_loss(root: Path, durable: DurablePositions, config: StoreConfig,
                        rng: random.Random, tear: Tear = Tear.PAGE, *,
                        checkpoint_fate: CheckpointFate | None = None) -> PowerLossReport:
    """Lose, at random, what was not durable in every file of the (dead) store at `root`
    (the checkpoint's fate is random too, unless `checkpoint_fate` is given)."""
    root = Path(root)
    report = PowerLossReport()
    fates = list(PageFate) if tear is Tear.SECTOR else [PageFate.KEEP, PageFate.REVERT]
    for path, old in _old_versions(root, durable, config):
        _lose_pages(path, old, rng, report, fates)
    report.checkpoint = _lose_checkpoint(root, rng, checkpoint_fate).value
    return report


def _old_versions(root: Path, durable: DurablePositions, config: StoreConfig):
    """(path, bytes of the file at its last sync) for every data file of the store."""
    segment_bytes = config.commitlog_file_size
    for base_pos, path in segment_files(commitlog_dir(root)):
        yield path, _old_segment(path, base_pos, segment_bytes, durable.commitlog_flushed_pos)
    for path in sorted((root / CONSUMEQUEUE_DIR).glob("*/*/*")):
        if is_segment_name(path.name):
            yield path, _old_queue_file(path, durable.cq_durable_pos)
    for shard, durable_pos in enumerate(durable.shard_durable_pos):
        shard_dir = root / INDEX_DIR / str(shard)
        paths = sorted(shard_dir.iterdir()) if shard_dir.is_dir() else []
        if paths:  # the others were synced whole at the roll that followed them
            previous = paths[-2] if len(paths) > 1 else None
            yield paths[-1], _old_index_file(paths[-1], previous, config, durable_pos)


def _old_segment(path: Path, base_pos: int, segment_bytes: int, flushed_pos: int) -> bytes:
    data = bytearray(path.read_bytes())
    keep = min(max(flushed_pos - base_pos, 0), segment_bytes)
    data[keep:] = bytes(len(data) - keep)
    return bytes(data)


def _old_queue_file(path: Path, cq_durable_pos: int) -> bytes:
    data = bytearray(path.read_bytes())
    entries = np.frombuffer(bytes(data), dtype=CQ_DTYPE)
    late = np.flatnonzero(entries["commit_pos"] >= cq_durable_pos)
    if late.size:
        first = int(late[0]) * CQ_ENTRY_SIZE
        data[first:] = bytes(len(data) - first)
    return bytes(data)


def _old_index_file(path: Path, previous: Path | None, config: StoreConfig,
                    durable_pos: int) -> bytes:
    """The shard's last file trimmed back to `durable_pos` (trim_from restores entries, slots and
    header); a file with nothing durable goes back to its header as created."""
    with open(path, "rb") as fh:
        head = fh.read(INDEX_HEADER_SIZE)
    try:
        header = decode_index_header(head)
    except CorruptIndexError:  # shorter than a header: a crash inside create(), nothing older
        return path.read_bytes()
    if header.index_count <= 1:
        return path.read_bytes()  # nothing in it since it was created (and synced)
    if header.begin_commit_pos >= durable_pos:
        return _created_index_file(path, previous)
    with tempfile.TemporaryDirectory(prefix="mqstore-powerloss-") as tmp:
        copy = Path(tmp) / path.name
        shutil.copyfile(path, copy)
        try:
            index_file = IndexFile.open(copy, config.index_slot_count, config.index_entry_count,
                                        Access.READ_WRITE)
        except CorruptIndexError:  # blank: a crash inside create(); nothing older to go back to
            return path.read_bytes()
        try:
            index_file.trim_from(durable_pos)
        finally:
            index_file.close()
        return copy.read_bytes()


def _created_index_file(path: Path, previous: Path | None) -> bytes:
    """What IndexFile.create synced: a header seeded with the previous file's end, zeros."""
    seed_ts_ms = seed_pos = 0
    if previous is not None:
        with open(previous, "rb") as fh:
            prev = decode_index_header(fh.read(INDEX_HEADER_SIZE))
        seed_ts_ms, seed_pos = prev.end_ts_ms, prev.end_commit_pos
    data = bytearray(path.stat().st_size)
    INDEX_HEADER.pack_into(data, 0, seed_ts_ms, seed_ts_ms, seed_pos, seed_pos, 0, 1)
    return bytes(data)


def _lose_pages(path: Path, old: bytes, rng: random.Random, report: PowerLossReport,
                fates: list[PageFate]) -> None:
    new = path.read_bytes()
    if len(new) != len(old) or new == old:
        return
    a = np.frombuffer(new, dtype=np.uint8)
    b = np.frombuffer(old, dtype=np.uint8)
    pages = a.size // PAGE_BYTES
    differing = np.flatnonzero((a[:pages * PAGE_BYTES] != b[:pages * PAGE_BYTES])
                               .reshape(pages, PAGE_BYTES).any(axis=1))
    out = bytearray(new)
    changed = False
    for page in differing.tolist():
        fate = rng.choice(fates)
        report.pages[fate.value] += 1
        lo = page * PAGE_BYTES
        if fate is PageFate.REVERT:
            out[lo:lo + PAGE_BYTES] = old[lo:lo + PAGE_BYTES]
            changed = True
        elif fate is PageFate.TEAR:
            for sector in range(lo, lo + PAGE_BYTES, SECTOR_BYTES):
                if rng.random() < 0.5:
                    out[sector:sector + SECTOR_BYTES] = old[sector:sector + SECTOR_BYTES]
                    changed = True
    if changed:
        _rewrite(path, bytes(out))
        report.files_touched += 1


def _lose_checkpoint(root: Path, rng: random.Random, fate: CheckpointFate | None) -> CheckpointFate:
    """Leave the new checkpoint or the old one (its `.bak`), perhaps with a torn temp file."""
    fate = rng.choice(list(CheckpointFate)) if fate is None else fate
    path = root / CHECKPOINT_FILE
    backup = root / (CHECKPOINT_FILE + BACKUP_SUFFIX)
    if fate in (CheckpointFate.OLD, CheckpointFate.OLD_WITH_TORN_TEMP) and backup.exists():
        _rewrite(path, backup.read_bytes())
    if fate in (CheckpointFate.NEW_WITH_TORN_TEMP, CheckpointFate.OLD_WITH_TORN_TEMP) \
            and path.exists():
        data = path.read_bytes()
        cut = rng.randrange(len(data) + 1)
        torn = data[:cut] if rng.random() < 0.5 else data[:cut] + bytes(len(data) - cut)
        _rewrite(path.with_name(path.name + TEMP_SUFFIX), torn)
    return fate


def _rewrite(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------ byte flips


def flip_byte(path: Path, file_pos: int, mask: int = 0xFF) -> int:
    """XOR one byte of a file with `mask` (applying it twice restores it); returns the old byte."""
    fd = os.open(path, os.O_RDWR)
    try:
        old = os.pread(fd, 1, file_pos)[0]
        os.pwrite(fd, bytes([old ^ mask]), file_pos)
    finally:
        os.close(fd)
    return old


def record_spans(root: Path, config: StoreConfig) -> list[tuple[Path, int, int, int]]:
    """(segment path, file_pos, size, commit_pos) of every record in the commitlog, in order
    (past damage an operator's salvage accepted, as recovery goes)."""
    from engine.log.commitlog import CommitLog
    from engine.recovery.accepted_damage import ScanPastAccepted, ScanUnit, load_accepted

    log = CommitLog.open(root, config.commitlog_file_size, Access.READ_ONLY)
    spans = []
    try:
        for record in ScanPastAccepted(log, log.min_pos, load_accepted(root), unit=ScanUnit.RECORDS):
            base = record.commit_pos - record.commit_pos % config.commitlog_file_size
            spans.append((commitlog_dir(root) / f"{base:020d}", record.commit_pos - base,
                          record.total_size, record.commit_pos))
    except CorruptRecordError:
        pass  # the end of written data
    finally:
        log.close()
    return spans


def queue_entry_spans(root: Path) -> list[tuple[Path, int]]:
    """(file, file_pos) of every written consume-queue entry of every queue."""
    spans = []
    for path in sorted((Path(root) / CONSUMEQUEUE_DIR).glob("*/*/*")):
        if not is_segment_name(path.name):
            continue
        entries = np.frombuffer(path.read_bytes(), dtype=CQ_DTYPE)
        written = np.flatnonzero(entries["size"] > 0)
        spans += [(path, int(i) * CQ_ENTRY_SIZE) for i in written]
    return spans


def index_entry_spans(root: Path, config: StoreConfig) -> list[tuple[Path, int]]:
    """(file, file_pos) of every used index entry of every shard."""
    spans = []
    for path in sorted((Path(root) / INDEX_DIR).glob("*/*")):
        with open(path, "rb") as fh:
            count = decode_index_header(fh.read(INDEX_HEADER_SIZE)).index_count
        spans += [(path, entry_pos(config.index_slot_count, n)) for n in range(1, count)]
    return spans

