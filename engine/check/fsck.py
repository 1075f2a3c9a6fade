"""Offline fsck (DESIGN §5, last line): verify a whole store and return findings; repair nothing.

Read-only by construction: files are mapped with Access.READ_ONLY (or read), the lock is not
taken, nothing is created or written. `check` raises only when `root` is not a store
(NotAStoreError), is newer than this code (FormatVersionError) or cannot be read
(StorePermissionError). Every problem with a store's content is a `Finding`, a value; whether
it is an error is the caller's decision.

What is checked, and where
- commitlog (engine.check.commitlog, walking with engine.log.walk_past): every record from the log's
  min position to its end, with every check of the codec (framing, field lengths,
  PHYSICALOFFSET == position, BODYCRC, CRC32C; a RocketMQ-written store is verified with
  Verify.ROCKETMQ). Zeros after the last record are a clean end. Invalid bytes with valid
  records after them are CORRUPT_RECORD (the walk resynchronises at the next record, else at
  the next segment); invalid bytes after the last valid record are a TORN_TAIL.
- consume queues (engine.check.consume_queues, mqstore stores): each entry against its record,
  offsets contiguous, no duplicates, no entry past the end of the log.
- index (engine.check.index, mqstore stores): every key found by `ShardIndex.query`; every entry
  resolves to a record key and carries that record's store time; slot heads and chains agree.
- checkpoint (here; mqstore stores): readable, and every durable position is a record boundary
  at or before the end of valid data.
- recovery pending (engine.check.pending): a consume-queue entry or index key missing for a
  record routine recovery re-dispatches (past the checkpoint's durable positions, what a
  crash leaves) is listed in CheckSummary.pending, not among the findings;
- accepted damage (engine.recovery.accepted_damage): a corrupt record inside a span a salvage accepted
  is listed in CheckSummary.accepted, not among the findings (it is known and kept on purpose);
  damage outside every accepted span is a finding as before.

Entries below the commitlog's min position are *expired* (retention deletes segments before
the consume-queue and index files that point into them; see engine.retention.expiry), never corrupt.
A RocketMQ-written store (no store.json) is checked for its commitlog and checkpoint only; its
segment size is the size of its files (RocketMQ's default is 1 GiB; test stores are smaller).
A finding's kinds, its value and its JSON form live in engine.check.findings.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from engine.check.commitlog import LogScan, Progress, scan_log
from engine.check.consume_queues import check_queues
from engine.check.findings import MAX_FINDINGS_PER_FILE, Finding, FindingKind, FindingList
from engine.check.index import KeyProbe, check_index
from engine.check.pending import PendingWork
from engine.delivery.levels import DEFAULT_DELAY_LEVELS_MS, parse_delay_levels
from engine.errors import AcceptedDamageError, CheckpointError, NotAStoreError, SegmentLayoutError
from engine.files.mapped_file import Access
from engine.files.naming import CHECKPOINT_FILE, commitlog_dir, infer_segment_bytes, segment_files
from engine.files.store_dir import StoreKind, inspect_store_dir, read_meta
from engine.formats.checkpoint import decode_checkpoint, decode_rocketmq_checkpoint, is_rocketmq_checkpoint
from engine.formats.record import Verify
from engine.log.commitlog import CommitLog
from engine.log.tail import tail_end
from engine.recovery.accepted_damage import AcceptedSpan, accepted_damage_path, load_accepted
from engine.retention.line import lost_head_reason


@dataclass(frozen=True)
class CheckSummary:
    """What a check looked at, and what it found."""

    store_kind: str
    records: int
    bytes_scanned: int
    min_pos: int
    end_pos: int
    findings: tuple[Finding, ...]
    accepted: tuple[Finding, ...] = ()  # ACCEPTED_DAMAGE notes: not findings
    pending: tuple[Finding, ...] = ()  # missing entries and keys recovery re-dispatches: not findings
    pending_records: int = 0  # the distinct records those are about


def check(root: Path | str, *, progress: Progress | None = None) -> list[Finding]:
    """Verify the store at `root` read-only; an empty list means it is consistent."""
    return list(check_summary(root, progress=progress).findings)


def check_summary(root: Path | str, *, progress: Progress | None = None) -> CheckSummary:
    """`check` plus how many records and bytes it verified."""
    root = Path(root)
    kind = inspect_store_dir(root)
    if kind is StoreKind.NEW:
        raise NotAStoreError("no store here (missing or empty directory)", path=str(root))
    out = FindingList(MAX_FINDINGS_PER_FILE)
    noted = FindingList(MAX_FINDINGS_PER_FILE)
    accepted = _load_accepted(root, out)
    if kind is StoreKind.MQSTORE:
        meta = read_meta(root)
        segment_bytes, verify = meta.commitlog_file_size, Verify.MQSTORE
        shard_count = meta.index_shards
    else:
        meta, verify, shard_count = None, Verify.ROCKETMQ, 0
    try:
        if meta is None:  # a RocketMQ store records no segment size: its files share one
            segment_bytes = infer_segment_bytes(segment_files(commitlog_dir(root)))
        log = CommitLog.open(root, segment_bytes, Access.READ_ONLY)
    except SegmentLayoutError as exc:
        out.add(FindingKind.LAYOUT, exc.path or str(commitlog_dir(root)), exc.message)
        _check_checkpoint(root, kind, None, shard_count, out)
        return CheckSummary(kind.value, 0, 0, 0, 0, tuple(out.items))
    if kind is StoreKind.MQSTORE and (lost := lost_head_reason(root, log.min_pos)) is not None:
        out.add(FindingKind.LAYOUT, str(commitlog_dir(root)), lost)
    keys = None
    try:
        if meta is not None:
            keys = KeyProbe(root, meta.index_slot_count, meta.index_entry_count, shard_count)
        if progress is not None:
            progress = _against_written_bytes(progress, log)
        levels = DEFAULT_DELAY_LEVELS_MS if meta is None or meta.message_delay_level is None \
            else parse_delay_levels(meta.message_delay_level)
        scan = scan_log(log, verify, shard_count, None if keys is None else keys.probe, progress, out,
                        accepted, noted, levels)
        pending = PendingWork.nothing() if meta is None else PendingWork.read(root, scan, shard_count)
        if meta is not None:
            check_queues(root, meta.consume_queue_entries, scan, out, pending)
            check_index(root, meta.index_slot_count, meta.index_entry_count, shard_count, scan, keys, out,
                        pending)
        _check_checkpoint(root, kind, scan, shard_count, out)
    finally:
        if keys is not None:
            keys.close()
        log.close()
    return CheckSummary(kind.value, scan.records, scan.bytes_scanned, scan.min_pos, scan.data_end,
                        tuple(out.items), tuple(noted.items), pending.findings, pending.record_count)


def _against_written_bytes(progress: Progress, log: CommitLog) -> Progress:
    """`progress` with the bytes written to the log as its total, not the size of its segments:
    a small store in a 1 GiB segment is checked "of 0.1 MiB", not "of 1024.0 MiB"."""
    written_bytes = tail_end(log, log.min_pos) - log.min_pos

    def report(done_bytes: int, segments_bytes: int) -> None:
        if done_bytes >= segments_bytes:  # the walk's last call: everything written was checked
            done_bytes = written_bytes
        progress(done_bytes, max(written_bytes, done_bytes))
    return report


def _load_accepted(root: Path, out: FindingList) -> list[AcceptedSpan]:
    """The accepted spans; an unreadable list is a LAYOUT finding and accepts nothing."""
    try:
        return load_accepted(root)
    except AcceptedDamageError as exc:
        out.add(FindingKind.LAYOUT, exc.path or str(accepted_damage_path(root)), exc.message)
        return []


def _check_checkpoint(root: Path, kind: StoreKind, scan: LogScan | None, shard_count: int,
                      out: FindingList) -> None:
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
