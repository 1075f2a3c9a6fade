"""Offline fsck (DESIGN §5, last line): verify a whole store and return findings; repair nothing.

Read-only by construction: files are mapped with Access.READ_ONLY (or read), the lock is not
taken, nothing is created or written. `check` raises only when `root` is not a store
(NotAStoreError), is newer than this code (FormatVersionError) or cannot be read
(StorePermissionError). Every problem with a store's content is a `Finding`, a value; whether
it is an error is the caller's decision.

What is checked
- commitlog: every record from the log's min position to its end, with every check of the
  codec (framing, field lengths, PHYSICALOFFSET == position, BODYCRC, CRC32C; a RocketMQ-written
  store is verified with Verify.ROCKETMQ). Zeros after the last record are a clean end.
  Invalid bytes with valid records after them are CORRUPT_RECORD (the scan resynchronises at
  the next record, else at the next segment); invalid bytes after the last valid record are a
  TORN_TAIL, what a crash leaves until recovery cuts it.
- consume queues (mqstore stores): every consumable record has exactly one entry, at its queue
  offset, with its commit_pos, size and tagsCode; every entry in [min_offset, max_offset)
  points at such a record; no entry points past the end of the log; offsets are contiguous;
  no two entries share a commit_pos.
- index (mqstore stores): every key of every record is found by `ShardIndex.query`; every
  entry resolves to a record start with a key of that hash in that shard; slot heads and
  chains agree with the entries.
- checkpoint (mqstore stores): readable, and every durable position is a record boundary at
  or before the end of valid data.

Entries below the commitlog's min position are *expired* (retention deletes segments before
the consume-queue and index files that point into them; see engine.retention), never corrupt.
A RocketMQ-written store (no store.json) is checked for its commitlog and checkpoint only; its
segment size is the size of its files (RocketMQ's default is 1 GiB; test stores are smaller).
"""

from __future__ import annotations

import errno
import itertools
import os
from array import array
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import numpy as np

from engine.commitlog import CommitLog
from engine.dispatch import enters_consume_queue, keys_by_shard
from engine.errors import (
    CheckpointError,
    CorruptRecordError,
    NotAStoreError,
    SegmentLayoutError,
    StoreError,
)
from engine.formats.checkpoint import decode_checkpoint, decode_rocketmq_checkpoint, is_rocketmq_checkpoint
from engine.formats.cq_entry import CQ_DTYPE, CQ_ENTRY_SIZE, FILLER_SIZE_MARK
from engine.formats.index_file import (
    INDEX_ENTRY_SIZE,
    decode_index_header,
    entry_pos,
    index_file_size,
    index_key_hash_of,
    slot_pos,
)
from engine.formats.record import MAGIC_OFFSET, MAGIC_V1, MAGIC_V2, Filler, Verify, decode_record
from engine.hash_index import ShardIndex
from engine.mapped_file import Access, MappedFile
from engine.naming import (
    CHECKPOINT_FILE,
    CONSUMEQUEUE_DIR,
    INDEX_DIR,
    commitlog_dir,
    is_segment_name,
    name_to_offset,
    validate_topic,
)
from engine.store_dir import StoreKind, inspect_store_dir, read_meta

Progress = Callable[[int, int], None]

MAX_FINDINGS_PER_FILE = 20  # then one "... and N more" finding of the same kind
ROCKETMQ_DEFAULT_SEGMENT_BYTES = 1 << 30
_MAGICS = (MAGIC_V1.to_bytes(4, "big"), MAGIC_V2.to_bytes(4, "big"))
_INDEX_ENTRY_DTYPE = np.dtype([("key_hash", ">i4"), ("commit_pos", ">i8"), ("time_diff_s", ">i4"),
                               ("prev_index", ">i4")])
assert _INDEX_ENTRY_DTYPE.itemsize == INDEX_ENTRY_SIZE
_INDEX_NAME_DIGITS = 17
_INT32_MAX = 2**31 - 1


class FindingKind(Enum):
    LAYOUT = "layout"  # a file of the wrong size, a foreign file, a gap in names
    CORRUPT_RECORD = "corrupt_record"  # an invalid record with valid data after it
    TORN_TAIL = "torn_tail"  # invalid bytes after the last valid record
    CQ_ENTRY_MISMATCH = "cq_entry_mismatch"  # an entry that does not point at its record
    CQ_GAP = "cq_gap"  # unwritten entries inside [min_offset, max_offset)
    CQ_DUPLICATE = "cq_duplicate"  # two entries with the same commit_pos
    CQ_MISSING_ENTRY = "cq_missing_entry"  # a consumable record without its entry
    CQ_PAST_END = "cq_past_end"  # an entry pointing past the end of valid data
    INDEX_FILE_CORRUPT = "index_file_corrupt"  # bad size or header, slot heads or chains
    INDEX_ENTRY_UNRESOLVED = "index_entry_unresolved"  # an entry that resolves to no record key
    INDEX_KEY_MISSING = "index_key_missing"  # a record key that the index does not find
    CHECKPOINT_UNREADABLE = "checkpoint_unreadable"
    CHECKPOINT_INCONSISTENT = "checkpoint_inconsistent"  # a position past the data or mid-record


@dataclass(frozen=True)
class Finding:
    """One problem found: what, in which file, and the commit position (or None)."""

    kind: FindingKind
    path: str
    detail: str
    pos: int | None = None

    def __str__(self) -> str:
        where = f" at {self.pos}" if self.pos is not None else ""
        return f"{self.kind.value}{where}: {self.detail} [{self.path}]"


@dataclass(frozen=True)
class CheckSummary:
    """What a check looked at, and what it found."""

    store_kind: str
    records: int
    bytes_scanned: int
    min_pos: int
    end_pos: int
    findings: tuple[Finding, ...]


def check(root: Path | str, *, progress: Progress | None = None) -> list[Finding]:
    """Verify the store at `root` read-only; an empty list means it is consistent."""
    return list(check_summary(root, progress=progress).findings)


def findings_to_json(findings: list[Finding]) -> list[dict]:
    """Plain dicts for `mqstore check --json`."""
    return [{"kind": f.kind.value, "path": f.path, "detail": f.detail, "pos": f.pos} for f in findings]


def check_summary(root: Path | str, *, progress: Progress | None = None) -> CheckSummary:
    """`check` plus how many records and bytes it verified."""
    root = Path(root)
    kind = inspect_store_dir(root)
    if kind is StoreKind.NEW:
        raise NotAStoreError("no store here (missing or empty directory)", path=str(root))
    out = _Findings()
    if kind is StoreKind.MQSTORE:
        meta = read_meta(root)
        segment_bytes, verify = meta.commitlog_file_size, Verify.MQSTORE
        shard_count = meta.index_shards
    else:
        meta, verify, shard_count = None, Verify.ROCKETMQ, 0
        segment_bytes = _rocketmq_segment_bytes(root)
    try:
        log = CommitLog.open(root, segment_bytes, Access.READ_ONLY)
    except SegmentLayoutError as exc:
        out.add(FindingKind.LAYOUT, exc.path or str(commitlog_dir(root)), exc.message)
        _check_checkpoint(root, kind, None, shard_count, out)
        return CheckSummary(kind.value, 0, 0, 0, 0, tuple(out.items))
    keys = None
    try:
        if meta is not None:
            keys = _KeyProbe(root, meta.index_slot_count, meta.index_entry_count, shard_count)
        scan = _scan_log(log, verify, shard_count, keys, progress, out)
        if meta is not None:
            _check_queues(root, meta.consume_queue_entries, scan, out)
            _check_index(root, meta.index_slot_count, meta.index_entry_count, shard_count, scan, keys, out)
        _check_checkpoint(root, kind, scan, shard_count, out)
    finally:
        if keys is not None:
            keys.close()
        log.close()
    return CheckSummary(kind.value, scan.records, scan.bytes_scanned, scan.min_pos, scan.data_end,
                        tuple(out.items))


class _Findings:
    """Collects findings, at most MAX_FINDINGS_PER_FILE per (kind, path), then one summary."""

    def __init__(self):
        self.items: list[Finding] = []
        self._counts: dict[tuple[FindingKind, str], int] = defaultdict(int)

    def add(self, kind: FindingKind, path: Path | str, detail: str, pos: int | None = None) -> None:
        key = (kind, str(path))
        self._counts[key] += 1
        if self._counts[key] <= MAX_FINDINGS_PER_FILE:
            self.items.append(Finding(kind, str(path), detail, None if pos is None else int(pos)))

    def close_group(self, kind: FindingKind, path: Path | str) -> None:
        extra = self._counts.get((kind, str(path)), 0) - MAX_FINDINGS_PER_FILE
        if extra > 0:
            self.items.append(Finding(kind, str(path), f"... and {extra} more"))


def _rocketmq_segment_bytes(root: Path) -> int:
    """A RocketMQ store records no segment size: take it from its first segment file."""
    directory = commitlog_dir(root)
    names = sorted(n for n in os.listdir(directory) if is_segment_name(n))
    if not names:
        return ROCKETMQ_DEFAULT_SEGMENT_BYTES
    return os.stat(directory / names[0]).st_size or ROCKETMQ_DEFAULT_SEGMENT_BYTES


# ------------------------------------------------------------------------------------ commitlog


_COLUMNS = ("pos", "size", "topic", "queue_id", "queue_offset", "tags_code", "consumable")


@dataclass
class _LogScan:
    """The valid records of the log as parallel columns (compact arrays while scanning, numpy
    after `freeze`), and each record key as (shard, commit_pos, key hash)."""

    min_pos: int
    data_end: int
    records: int = 0
    bytes_scanned: int = 0
    topic_ids: dict[str, int] = field(default_factory=dict)
    columns: dict[str, array] = field(default_factory=lambda: {c: array("q") for c in _COLUMNS})
    keys: dict[str, array] = field(default_factory=lambda: {c: array("q") for c in ("shard", "pos", "hash")})
    filler_ends: list[int] = field(default_factory=list)
    bad_starts: set[int] = field(default_factory=set)  # reported as CORRUPT_RECORD / TORN_TAIL
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def add(self, record, by_shard: dict[int, list[str]]) -> None:
        self.records += 1
        self.bytes_scanned += record.total_size
        values = (record.commit_pos, record.total_size,
                  self.topic_ids.setdefault(record.topic, len(self.topic_ids)), record.queue_id,
                  record.queue_offset, record.tags_code, enters_consume_queue(record.sys_flag))
        for name, value in zip(_COLUMNS, values, strict=True):
            self.columns[name].append(value)
        for shard, keys in by_shard.items():
            for key in keys:
                self.keys["shard"].append(shard)
                self.keys["pos"].append(record.commit_pos)
                self.keys["hash"].append(index_key_hash_of(record.topic, key))

    def freeze(self) -> None:
        for name, column in [*self.columns.items(), *(("key_" + n, c) for n, c in self.keys.items())]:
            self.arrays[name] = np.frombuffer(column, dtype=np.int64) if column else np.zeros(0, np.int64)
        self.arrays["consumable"] = self.arrays["consumable"].astype(bool)
        a = self.arrays
        self.arrays["boundaries"] = np.unique(np.concatenate([
            a["pos"], a["pos"] + a["size"], np.array([self.min_pos, *self.filler_ends], dtype=np.int64)]))

    def is_boundary(self, pos: int) -> bool:
        """A record start or end, a segment start reached through a filler, or the log start."""
        bounds = self.arrays["boundaries"]
        i = int(np.searchsorted(bounds, pos))
        return i < len(bounds) and int(bounds[i]) == pos


class _KeyProbe:
    """Looks every record key up through ShardIndex.query while the log is scanned: first in
    the record's own store time (the tightest query a reader can make), then unbounded."""

    def __init__(self, root: Path, slot_count: int, entry_count: int, shard_count: int):
        self.shards: list[ShardIndex | None] = []
        self.unreadable: dict[int, str] = {}
        self.unchecked: dict[int, int] = defaultdict(int)
        self.missing: list[tuple[int, str, int]] = []  # (shard, detail, commit_pos)
        for shard in range(shard_count):
            try:
                self.shards.append(ShardIndex.load(root, shard, slot_count, entry_count, Access.READ_ONLY))
            except StoreError as exc:
                self.shards.append(None)
                self.unreadable[shard] = exc.message

    def probe(self, record, by_shard: dict[int, list[str]]) -> None:
        pos, ts = record.commit_pos, record.store_ts_ms
        for shard, keys in by_shard.items():
            index = self.shards[shard]
            if index is None:
                self.unchecked[shard] += len(keys)
                continue
            for key in keys:
                if pos in index.query(record.topic, key, ts, ts, _INT32_MAX):
                    continue
                if pos in index.query(record.topic, key, 0, None, _INT32_MAX):
                    continue  # found, only not within its own store time
                self.missing.append((shard, f"key {record.topic}#{key} of the record at {pos} "
                                            "is not found", pos))

    def close(self) -> None:
        for index in self.shards:
            if index is not None:
                index.close()


def _scan_log(log: CommitLog, verify: Verify, shard_count: int, keys: _KeyProbe | None,
              progress: Progress | None, out: _Findings) -> _LogScan:
    """Walk every record; report bad regions; return the valid records' columns."""
    segs = log.segments
    scan = _LogScan(min_pos=segs.min_pos, data_end=segs.min_pos)
    end, pos = segs.end_pos, segs.min_pos
    bad: list[tuple[int, int, str, str]] = []  # (start, resume_pos, reason, path)
    next_report = pos
    while pos < end:
        segment = segs.find(pos)
        base = segs.base_of(segment)
        try:
            item = _decode_checked(segment, pos - base, base, verify)
        except CorruptRecordError as exc:
            if _zero_from(log, pos):
                break  # a clean end: nothing was written past here
            resume = _resync(segment, pos - base, base, exc.size, verify)
            bad.append((pos, resume, exc.reason, str(segment.path)))
            pos = resume
            continue
        if isinstance(item, Filler):
            scan.filler_ends.append(item.end_pos)
        else:
            by_shard = keys_by_shard(item, shard_count) if shard_count else {}
            scan.add(item, by_shard)
            if keys is not None:
                keys.probe(item, by_shard)
        pos = scan.data_end = item.end_pos
        if progress is not None and pos >= next_report:
            progress(pos - segs.min_pos, end - segs.min_pos)
            next_report = pos + (64 << 20)
    _report_bad_regions(bad, scan, out)
    if progress is not None:
        progress(end - segs.min_pos, end - segs.min_pos)
    scan.freeze()
    return scan


def _report_bad_regions(bad: list[tuple[int, int, str, str]], scan: _LogScan, out: _Findings) -> None:
    for start, resume, reason, path in bad:
        scan.bad_starts.add(start)
        if start >= scan.data_end:
            out.add(FindingKind.TORN_TAIL, path, f"bytes after the last valid record are not a "
                    f"record ({reason}); {resume - start} bytes to the next record or segment", start)
        else:
            out.add(FindingKind.CORRUPT_RECORD, path, f"{reason}; the scan resumed at {resume}", start)
    for path in {b[3] for b in bad}:
        out.close_group(FindingKind.CORRUPT_RECORD, path)


def _decode_checked(segment: MappedFile, file_pos: int, base: int, verify: Verify):
    item = decode_record(segment.buf, file_pos, verify=verify, base_pos=base)
    if isinstance(item, Filler) and item.size != segment.size_bytes - file_pos:
        raise CorruptRecordError(f"filler of {item.size} bytes with {segment.size_bytes - file_pos} "
                                 "left in the segment", pos=base + file_pos)
    return item


def _resync(segment: MappedFile, file_pos: int, base: int, size: int, verify: Verify) -> int:
    """Where valid data resumes after a bad record at file_pos: the end its TOTALSIZE claims if a
    record starts there, else the next record found by its magic, else the next segment."""
    candidates = []
    if size > 0 and file_pos + size < segment.size_bytes:
        candidates.append(file_pos + size)
    for candidate in itertools.chain(candidates, _magic_candidates(segment, file_pos + 1)):
        try:
            _decode_checked(segment, candidate, base, verify)
        except CorruptRecordError:
            continue
        return base + candidate
    return base + segment.size_bytes


def _magic_candidates(segment: MappedFile, start: int, chunk_bytes: int = 1 << 20):
    """File positions p >= start whose bytes at p + MAGIC_OFFSET are a record magic."""
    buf, limit = segment.buf, segment.size_bytes
    at = start + MAGIC_OFFSET
    while at < limit:
        chunk = bytes(buf[at:min(limit, at + chunk_bytes + 3)])
        hits = sorted(i for magic in _MAGICS for i in _find_all(chunk, magic))
        yield from (at + i - MAGIC_OFFSET for i in hits)
        at += chunk_bytes


def _find_all(data: bytes, needle: bytes):
    i = data.find(needle)
    while i >= 0:
        yield i
        i = data.find(needle, i + 1)


def _zero_from(log: CommitLog, pos: int, chunk_bytes: int = 1 << 20) -> bool:
    """True when every byte from pos to the end of the last segment is zero. Holes of sparse
    segments are skipped unread, and the walk stops at the first non-zero chunk."""
    segs = log.segments
    for segment in segs.segments:
        base = segs.base_of(segment)
        for lo, hi in _data_ranges(segment.path, max(pos - base, 0), segment.size_bytes):
            for start in range(lo, hi, chunk_bytes):
                view = segment.read(start, min(chunk_bytes, hi - start))
                if np.frombuffer(view, dtype=np.uint8).any():
                    return False
    return True


def _data_ranges(path: Path, start: int, end: int) -> list[tuple[int, int]]:
    """The parts of [start, end) of a file that hold data (SEEK_DATA/SEEK_HOLE); all of it where
    the filesystem cannot tell."""
    ranges = []
    fd = os.open(path, os.O_RDONLY)
    try:
        pos = start
        while pos < end:
            try:
                lo = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:
                    break  # only a hole from here on
                return [(start, end)]
            hi = min(os.lseek(fd, lo, os.SEEK_HOLE), end)
            if lo < end:
                ranges.append((lo, hi))
            pos = hi
    finally:
        os.close(fd)
    return ranges


# ------------------------------------------------------------------------------ consume queues


def _check_queues(root: Path, entries_per_file: int, scan: _LogScan, out: _Findings) -> None:
    on_disk = _queue_dirs(root / CONSUMEQUEUE_DIR, out)
    a = scan.arrays
    expected = {(topic, int(q)) for topic, tid in scan.topic_ids.items()
                for q in np.unique(a["queue_id"][(a["topic"] == tid) & a["consumable"]])}
    for topic, queue_id in sorted(set(on_disk) | expected):
        directory = on_disk.get((topic, queue_id),
                                root / CONSUMEQUEUE_DIR / topic / str(queue_id))
        entries, first = _read_queue(directory, entries_per_file, out)
        _check_queue(topic, queue_id, entries, first, scan, str(directory), out)
        for kind in (FindingKind.CQ_ENTRY_MISMATCH, FindingKind.CQ_GAP, FindingKind.CQ_MISSING_ENTRY,
                     FindingKind.CQ_DUPLICATE, FindingKind.CQ_PAST_END):
            out.close_group(kind, directory)


def _queue_dirs(base: Path, out: _Findings) -> dict[tuple[str, int], Path]:
    found: dict[tuple[str, int], Path] = {}
    if not base.is_dir():
        return found
    for topic_dir in sorted(base.iterdir()):
        if not topic_dir.is_dir() or not _is_topic(topic_dir.name):
            out.add(FindingKind.LAYOUT, topic_dir, "not a topic directory")
            continue
        for queue_dir in sorted(topic_dir.iterdir()):
            name = queue_dir.name
            if not (queue_dir.is_dir() and name.isdigit() and str(int(name)) == name):
                out.add(FindingKind.LAYOUT, queue_dir, "not a queue-id directory")
                continue
            found[(topic_dir.name, int(name))] = queue_dir
    return found


def _is_topic(name: str) -> bool:
    try:
        validate_topic(name)
    except StoreError:
        return False
    return True


def _read_queue(directory: Path, entries_per_file: int, out: _Findings) -> tuple[np.ndarray, int]:
    """All entries from the first file to the end of the last as one array (missing or unreadable
    files read as zeros), and the queue offset of its first entry."""
    file_bytes = entries_per_file * CQ_ENTRY_SIZE
    names = sorted(os.listdir(directory)) if directory.is_dir() else []
    bases = []
    for name in names:
        if not is_segment_name(name) or name_to_offset(name) % file_bytes:
            out.add(FindingKind.LAYOUT, directory / name, "not a consume-queue file name")
        else:
            bases.append(name_to_offset(name))
    if not bases:
        return np.zeros(0, dtype=CQ_DTYPE), 0
    entries = np.zeros((bases[-1] + file_bytes - bases[0]) // CQ_ENTRY_SIZE, dtype=CQ_DTYPE)
    for base in bases:
        path = directory / f"{base:020d}"
        try:
            mapped = MappedFile.open(path, Access.READ_ONLY, expected_bytes=file_bytes)
        except SegmentLayoutError as exc:
            out.add(FindingKind.LAYOUT, path, exc.message)
            continue
        at = (base - bases[0]) // CQ_ENTRY_SIZE
        entries[at:at + entries_per_file] = np.frombuffer(mapped.buf, dtype=CQ_DTYPE)
        mapped.close()
    return entries, bases[0] // CQ_ENTRY_SIZE


def _check_queue(topic: str, queue_id: int, entries: np.ndarray, first: int, scan: _LogScan,
                 path: str, out: _Findings) -> None:
    cp = entries["commit_pos"].astype(np.int64)
    size = entries["size"].astype(np.int64)
    tags = entries["tags_code"].astype(np.int64)
    written = (cp != 0) | (size != 0) | (tags != 0)
    count = int(np.flatnonzero(written)[-1]) + 1 if written.any() else 0
    cp, size, tags, written = cp[:count], size[:count], tags[:count], written[:count]
    filler = (cp == 0) & (size == FILLER_SIZE_MARK) & (tags == 0)
    valid = (cp >= 0) & (size > 0) & ~filler
    live = valid & (cp >= scan.min_pos)
    start = int(np.argmax(live)) if live.any() else count  # min_offset - first
    head_ok = filler[:start] | valid[:start]  # below min_offset: fillers and expired entries
    _report_runs(out, FindingKind.CQ_GAP, path, first, np.flatnonzero(~head_ok),
                 "unwritten or invalid entries before the queue's first live entry")
    body = np.arange(start, count)
    _report_runs(out, FindingKind.CQ_GAP, path, first, body[~written[start:] | filler[start:]],
                 "unwritten entries inside the queue")
    for i in body[written[start:] & ~filler[start:] & ~live[start:]]:
        out.add(FindingKind.CQ_ENTRY_MISMATCH, path, f"offset {first + i}: entry ({cp[i]}, {size[i]}) "
                "is not a live entry (negative, empty or below the log start)", int(cp[i]))
    live_idx = body[live[start:]]
    at_bad = np.isin(cp[live_idx], np.fromiter(scan.bad_starts, dtype=np.int64))
    past = cp[live_idx] + size[live_idx] > scan.data_end
    for i in live_idx[past & ~at_bad]:  # a reference to a reported bad record is not reported again
        out.add(FindingKind.CQ_PAST_END, path, f"offset {first + i}: entry [{cp[i]}, +{size[i]}) ends "
                f"past the end of valid data {scan.data_end}", int(cp[i]))
    _match_entries(topic, queue_id, first, live_idx[~past & ~at_bad], cp, size, tags, scan, path, out)
    positions, counts = np.unique(cp[live_idx], return_counts=True)
    for pos in positions[counts > 1]:
        offsets = (first + live_idx[cp[live_idx] == pos]).tolist()
        out.add(FindingKind.CQ_DUPLICATE, path, f"offsets {offsets} all point at {pos}", int(pos))
    _report_missing(topic, queue_id, first, cp, live, scan, path, out)


def _match_entries(topic: str, queue_id: int, first: int, idx: np.ndarray, cp, size, tags,
                   scan: _LogScan, path: str, out: _Findings) -> None:
    """Each entry must point at the start of a consumable record of this queue and offset."""
    a = scan.arrays
    if len(idx) == 0:
        return
    tid = scan.topic_ids.get(topic, -1)
    rec = np.searchsorted(a["pos"], cp[idx])
    recc = np.minimum(rec, max(len(a["pos"]) - 1, 0))
    if len(a["pos"]) == 0:
        ok = np.zeros(len(idx), dtype=bool)
        hit = ok
    else:
        hit = a["pos"][recc] == cp[idx]
        ok = (hit & (a["topic"][recc] == tid) & (a["queue_id"][recc] == queue_id)
              & (a["queue_offset"][recc] == first + idx) & (a["size"][recc] == size[idx])
              & (a["tags_code"][recc] == tags[idx]) & a["consumable"][recc])
    for k in np.flatnonzero(~ok):
        i, r = idx[k], recc[k]
        if not hit[k]:
            what = "no valid record starts there"
        else:
            what = (f"the record there is {_topic_name(scan, a['topic'][r])}/{a['queue_id'][r]} "
                    f"offset {a['queue_offset'][r]} size {a['size'][r]} tagsCode {a['tags_code'][r]}"
                    f"{'' if a['consumable'][r] else ' (not consumable)'}")
        out.add(FindingKind.CQ_ENTRY_MISMATCH, path, f"offset {first + i}: entry (pos {cp[i]}, size "
                f"{size[i]}, tagsCode {tags[i]}) does not match: {what}", int(cp[i]))


def _report_missing(topic: str, queue_id: int, first: int, cp, live, scan: _LogScan, path: str,
                    out: _Findings) -> None:
    """Consumable records of this queue whose offset holds no live entry with their position."""
    a = scan.arrays
    tid = scan.topic_ids.get(topic, -1)
    mine = (a["topic"] == tid) & (a["queue_id"] == queue_id) & a["consumable"]
    offsets, positions = a["queue_offset"][mine], a["pos"][mine]
    at = offsets - first
    inside = (at >= 0) & (at < len(cp))
    atc = np.clip(at, 0, max(len(cp) - 1, 0))
    present = inside & (live[atc] if len(cp) else False) & (cp[atc] == positions if len(cp) else False)
    order = np.argsort(offsets[~present], kind="stable")
    missing_offsets, missing_pos = offsets[~present][order], positions[~present][order]
    for run in _runs(missing_offsets):
        lo, hi = int(missing_offsets[run[0]]), int(missing_offsets[run[-1]])
        out.add(FindingKind.CQ_MISSING_ENTRY, path, f"{len(run)} record(s) at queue offsets "
                f"{lo}..{hi} have no consume-queue entry", int(missing_pos[run[0]]))


def _topic_name(scan: _LogScan, tid: int) -> str:
    return next((name for name, i in scan.topic_ids.items() if i == tid), "?")


def _runs(values: np.ndarray) -> list[np.ndarray]:
    """Index runs of consecutive values (values sorted)."""
    if len(values) == 0:
        return []
    breaks = np.flatnonzero(np.diff(values) != 1) + 1
    return np.split(np.arange(len(values)), breaks)


def _report_runs(out: _Findings, kind: FindingKind, path: str, first: int, idx: np.ndarray,
                 what: str) -> None:
    for run in _runs(idx):
        lo, hi = first + int(idx[run[0]]), first + int(idx[run[-1]])
        out.add(kind, path, f"{what}: offsets {lo}..{hi}")


# ------------------------------------------------------------------------------------- index


def _check_index(root: Path, slot_count: int, entry_count: int, shard_count: int, scan: _LogScan,
                 keys: _KeyProbe, out: _Findings) -> None:
    base = root / INDEX_DIR
    if base.is_dir():
        for entry in sorted(base.iterdir()):
            if not (entry.is_dir() and entry.name.isdigit() and int(entry.name) < shard_count
                    and str(int(entry.name)) == entry.name):
                out.add(FindingKind.LAYOUT, entry, f"not an index shard directory (0..{shard_count - 1})")
    a = scan.arrays
    for shard in range(shard_count):
        directory = base / str(shard)
        mine = a["key_shard"] == shard
        order = np.lexsort((a["key_hash"][mine], a["key_pos"][mine]))
        exp_pos, exp_hash = a["key_pos"][mine][order], a["key_hash"][mine][order]
        for path in _index_files(directory, slot_count, out):
            _check_index_file(path, slot_count, entry_count, exp_pos, exp_hash, scan, out)
            for kind in (FindingKind.INDEX_FILE_CORRUPT, FindingKind.INDEX_ENTRY_UNRESOLVED):
                out.close_group(kind, path)
        if keys.unchecked.get(shard):
            out.add(FindingKind.INDEX_KEY_MISSING, directory, f"{keys.unchecked[shard]} keys not checked: "
                    f"the shard cannot be opened ({keys.unreadable[shard]})")
        for _, detail, pos in (m for m in keys.missing if m[0] == shard):
            out.add(FindingKind.INDEX_KEY_MISSING, directory, detail, pos)
        out.close_group(FindingKind.INDEX_KEY_MISSING, directory)


def _index_files(directory: Path, slot_count: int, out: _Findings) -> list[Path]:
    """The shard's index files in name order; a blank last file (a crash inside create, which
    the reader ignores and the writer removes) is skipped."""
    if not directory.is_dir():
        return []
    paths = []
    for name in sorted(os.listdir(directory)):
        if len(name) == _INDEX_NAME_DIGITS and name.isdigit():
            paths.append(directory / name)
        else:
            out.add(FindingKind.LAYOUT, directory / name, "not an index file name")
    if paths and _is_blank(paths[-1], slot_count):
        paths.pop()
    return paths


def _is_blank(path: Path, slot_count: int) -> bool:
    with open(path, "rb") as f:
        return not any(f.read(slot_pos(slot_count)))


def _check_index_file(path: Path, slot_count: int, entry_count: int, exp_pos: np.ndarray,
                      exp_hash: np.ndarray, scan: _LogScan, out: _Findings) -> None:
    try:
        mapped = MappedFile.open(path, Access.READ_ONLY, index_file_size(slot_count, entry_count))
    except SegmentLayoutError as exc:
        out.add(FindingKind.INDEX_FILE_CORRUPT, path, exc.message)
        return
    try:
        header = decode_index_header(mapped.buf)
        if not 1 <= header.index_count <= entry_count:
            out.add(FindingKind.INDEX_FILE_CORRUPT, path,
                    f"index_count {header.index_count} outside [1, {entry_count}]")
            return
        n = header.index_count - 1
        heads = np.frombuffer(mapped.buf, dtype=">i4", count=slot_count, offset=slot_pos(0)).astype(np.int64)
        entries = np.frombuffer(mapped.buf, dtype=_INDEX_ENTRY_DTYPE, count=n,
                                offset=entry_pos(slot_count, 1))
        hashes = entries["key_hash"].astype(np.int64)
        positions = entries["commit_pos"].astype(np.int64)
        prevs = entries["prev_index"].astype(np.int64)
        del entries
        _check_chains(path, heads, hashes, prevs, slot_count, out)
        _check_entries_resolve(path, hashes, positions, exp_pos, exp_hash, scan, out)
    finally:
        mapped.close()


def _check_chains(path: Path, heads: np.ndarray, hashes: np.ndarray, prevs: np.ndarray,
                  slot_count: int, out: _Findings) -> None:
    """Entry i's prev must be the previous entry of its slot (0 for the first) and each slot's
    head its newest entry: what put_key builds, so every entry is reachable from its slot."""
    n = len(hashes)
    numbers = np.arange(1, n + 1)
    slots = np.mod(hashes, slot_count)
    order = np.lexsort((numbers, slots))
    s_sorted, i_sorted = slots[order], numbers[order]
    same = np.zeros(n, dtype=bool)
    same[1:] = s_sorted[1:] == s_sorted[:-1]
    expected_prev = np.zeros(n, dtype=np.int64)
    expected_prev[order[1:]] = np.where(same[1:], i_sorted[:-1], 0)
    expected_heads = np.zeros(slot_count, dtype=np.int64)
    last_of_slot = np.ones(n, dtype=bool)
    last_of_slot[:-1] = ~same[1:]
    expected_heads[s_sorted[last_of_slot]] = i_sorted[last_of_slot]
    bad_links = np.flatnonzero((prevs != expected_prev) | (hashes < 0))
    bad_heads = np.flatnonzero(heads != expected_heads)
    if len(bad_links) or len(bad_heads):
        first_link = f"entry {int(bad_links[0]) + 1}" if len(bad_links) else "-"
        first_head = f"slot {int(bad_heads[0])}" if len(bad_heads) else "-"
        out.add(FindingKind.INDEX_FILE_CORRUPT, path, f"{len(bad_links)} chain links and {len(bad_heads)} "
                f"slot heads disagree with the entries (first: {first_link}, {first_head})")


def _check_entries_resolve(path: Path, hashes: np.ndarray, positions: np.ndarray, exp_pos: np.ndarray,
                           exp_hash: np.ndarray, scan: _LogScan, out: _Findings) -> None:
    """Each live entry points at a record start with a key of that hash (in this shard)."""
    left = np.searchsorted(exp_pos, positions, side="left")
    right = np.searchsorted(exp_pos, positions, side="right")
    match = np.zeros(len(positions), dtype=bool)
    if len(exp_pos):
        for k in range(int((right - left).max(initial=0))):
            at = np.minimum(left + k, len(exp_pos) - 1)
            match |= (left + k < right) & (exp_hash[at] == hashes)
    live = positions >= scan.min_pos
    for i in np.flatnonzero(live & ~match):
        pos = int(positions[i])
        if pos in scan.bad_starts:
            continue  # the record itself is reported (CORRUPT_RECORD / TORN_TAIL)
        why = ("past the end of valid data" if pos >= scan.data_end else
               "a record start without a key of that hash" if scan.is_boundary(pos) else
               "not a record start")
        out.add(FindingKind.INDEX_ENTRY_UNRESOLVED, path,
                f"entry {i + 1} (hash {int(hashes[i])}, pos {pos}): {why}", pos)


# -------------------------------------------------------------------------------- checkpoint


def _check_checkpoint(root: Path, kind: StoreKind, scan: _LogScan | None, shard_count: int,
                      out: _Findings) -> None:
    path = root / CHECKPOINT_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        if kind is StoreKind.MQSTORE:
            out.add(FindingKind.CHECKPOINT_UNREADABLE, path, "missing")
        return
    try:
        if kind is StoreKind.ROCKETMQ and is_rocketmq_checkpoint(raw):
            decode_rocketmq_checkpoint(raw)
            return
        cp = decode_checkpoint(raw)
    except CheckpointError as exc:
        out.add(FindingKind.CHECKPOINT_UNREADABLE, path, exc.message)
        return
    if scan is None:
        return
    if kind is StoreKind.MQSTORE and cp.shard_count != shard_count:
        out.add(FindingKind.CHECKPOINT_INCONSISTENT, path,
                f"{cp.shard_count} index shard positions for {shard_count} shards")
    named = [("commitlog_flushed_pos", cp.commitlog_flushed_pos),
             ("confirm_commit_pos", cp.confirm_commit_pos), ("cq_durable_pos", cp.cq_durable_pos),
             *((f"index_durable_pos[{i}]", p) for i, p in enumerate(cp.index_durable_pos))]
    problems: dict[tuple[int, str], list[str]] = defaultdict(list)
    for name, pos in named:
        if pos < scan.min_pos:
            continue  # below the log start: retention got there first, recovery starts at min
        if pos > scan.data_end:
            problems[(pos, f"past the end of valid data {scan.data_end}")].append(name)
        elif not scan.is_boundary(pos):
            problems[(pos, "not a record boundary")].append(name)
    for (pos, problem), names in problems.items():
        out.add(FindingKind.CHECKPOINT_INCONSISTENT, path, f"{', '.join(names)} = {pos}: {problem}", pos)
