"""`engine.check.fsck`, the commitlog part: walk every record (engine.log.walk_past), report the bad
regions, and keep the valid records as columns for the consume-queue, index and checkpoint checks.

Invalid bytes with valid records after them are CORRUPT_RECORD; invalid bytes after the last
valid record are a TORN_TAIL, what a crash leaves until recovery cuts it. A corrupt record inside
a span the operator accepted (`mqstore recover --salvage`, engine.recovery.accepted_damage) is noted as
ACCEPTED_DAMAGE in a separate list: it is known and kept on purpose, not a finding.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from engine.check.findings import FindingKind, FindingList
from engine.delivery.levels import DEFAULT_DELAY_LEVELS_MS
from engine.dispatch.record import keys_by_shard
from engine.formats.index_file import index_key_hash_of
from engine.formats.record import Filler, Record, Verify
from engine.log.commitlog import CommitLog
from engine.log.walk_past import walk_log
from engine.log.walker import BadRegion
from engine.record_rules import enters_consume_queue, tag_field_function
from engine.recovery.accepted_damage import AcceptedSpan, is_accepted, span_at

Progress = Callable[[int, int], None]
RecordVisitor = Callable[[Record, dict[int, list[str]]], None]  # a record and its keys by shard

_COLUMNS = ("pos", "size", "topic", "queue_id", "queue_offset", "tags_code", "store_ts_ms", "consumable")
_KEY_COLUMNS = ("shard", "pos", "hash")
_PROGRESS_STEP_BYTES = 64 << 20


@dataclass
class LogScan:
    """The valid records of the log as parallel columns (compact arrays while scanning, numpy
    after `freeze`, sorted by position), and each record key as (shard, commit_pos, key hash)."""

    min_pos: int
    data_end: int
    records: int = 0
    bytes_scanned: int = 0
    topic_ids: dict[str, int] = field(default_factory=dict)
    columns: dict[str, array] = field(default_factory=lambda: {c: array("q") for c in _COLUMNS})
    keys: dict[str, array] = field(default_factory=lambda: {c: array("q") for c in _KEY_COLUMNS})
    filler_ends: list[int] = field(default_factory=list)
    bad_starts: set[int] = field(default_factory=set)  # reported as CORRUPT_RECORD / TORN_TAIL
    accepted: list[tuple[int, int]] = field(default_factory=list)  # [start, end) noted ACCEPTED_DAMAGE
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    delay_levels_ms: tuple[int, ...] = DEFAULT_DELAY_LEVELS_MS  # the tag field of scheduled entries
    tag_field: Callable[[str, int, int, int], int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.tag_field = tag_field_function(self.delay_levels_ms)  # one rule, looked up once

    def add(self, record: Record, by_shard: dict[int, list[str]]) -> None:
        self.records += 1
        self.bytes_scanned += record.total_size
        tag = self.tag_field(record.topic, record.queue_id, record.store_ts_ms, record.tags_code)
        values = (record.commit_pos, record.total_size,
                  self.topic_ids.setdefault(record.topic, len(self.topic_ids)), record.queue_id,
                  record.queue_offset, tag, record.store_ts_ms,
                  enters_consume_queue(record.sys_flag, record.queue_offset))
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

    def at_damage(self, positions: np.ndarray) -> np.ndarray:
        """Which positions are a reported bad record's start or lie inside accepted damage (a
        salvage's entries point there): entries there are not matched against a record."""
        inside = np.isin(positions, np.fromiter(self.bad_starts, dtype=np.int64))
        for start, end in self.accepted:
            inside |= (positions >= start) & (positions < end)
        return inside

    def topic_name(self, tid: int) -> str:
        return next((name for name, i in self.topic_ids.items() if i == tid), "?")


def scan_log(log: CommitLog, verify: Verify, shard_count: int, visit: RecordVisitor | None,
             progress: Progress | None, out: FindingList, accepted: list[AcceptedSpan],
             noted: FindingList, delay_levels_ms: tuple[int, ...] = DEFAULT_DELAY_LEVELS_MS) -> LogScan:
    """Walk every record (each valid one also goes to `visit`); report bad regions (those inside
    `accepted` spans go to `noted`); return the valid records' columns."""
    segs = log.segments
    scan = LogScan(min_pos=segs.min_pos, data_end=segs.min_pos, delay_levels_ms=delay_levels_ms)
    total = segs.end_pos - segs.min_pos
    bad: list[BadRegion] = []
    next_report = segs.min_pos
    for item in walk_log(log, segs.min_pos, verify):
        if isinstance(item, BadRegion):
            bad.append(item)
            continue
        if isinstance(item, Filler):
            scan.filler_ends.append(item.end_pos)
        else:
            by_shard = keys_by_shard(item, shard_count) if shard_count else {}
            scan.add(item, by_shard)
            if visit is not None:
                visit(item, by_shard)
        scan.data_end = item.end_pos
        if progress is not None and scan.data_end >= next_report:
            progress(scan.data_end - segs.min_pos, total)
            next_report = scan.data_end + _PROGRESS_STEP_BYTES
    _report_bad_regions(bad, scan, out, accepted, noted)
    if progress is not None:
        progress(total, total)
    scan.freeze()
    return scan


def _report_bad_regions(bad: list[BadRegion], scan: LogScan, out: FindingList,
                        accepted: list[AcceptedSpan], noted: FindingList) -> None:
    for region in bad:
        start = region.start_pos
        scan.bad_starts.add(start)
        if start < scan.data_end and is_accepted(accepted, start, region.resume_pos):
            span = span_at(accepted, start)
            scan.accepted.append((start, region.resume_pos))
            noted.add(FindingKind.ACCEPTED_DAMAGE, region.path, f"{region.reason}; accepted by a "
                      f"salvage at {span.accepted_ms} ms (copy: {span.copy_path})", start)
        elif start >= scan.data_end:
            out.add(FindingKind.TORN_TAIL, region.path, f"bytes after the last valid record are not a "
                    f"record ({region.reason}); {region.resume_pos - start} bytes to the next record "
                    "or segment", start)
        else:
            out.add(FindingKind.CORRUPT_RECORD, region.path,
                    f"{region.reason}; the scan resumed at {region.resume_pos}", start)
    for path in {region.path for region in bad}:
        out.close_group(FindingKind.CORRUPT_RECORD, path)
