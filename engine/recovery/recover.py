"""Crash recovery (DESIGN §5): trim derived structures to what is durable, scan the commitlog
from the lowest durable position with every check, cut and quarantine a torn tail, and
re-dispatch idempotently. Bounded work: only what was written since the last checkpoint.

Step order (each step leaves a state the next run of recovery can finish):
1. consume queues: keep up to the last valid entry, zero the stale bytes behind it;
2. index shards: trim entries at or past each shard's durable position;
3. scan from min(durable positions) and re-dispatch what each structure lacks;
4. quarantine the bytes past the first invalid record, then truncate the commitlog there (even
   valid records after it go: a queue's offsets may not have a hole and a msgId is a commit
   position, so nothing can be moved up; the report counts them);
5. drop consume-queue and index entries past the cut; flush all; write the checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path

from engine.config import StoreConfig
from engine.dispatch.record import (
    consumable_rows,
    dispatch_columns_to_consume_queues,
    dispatch_columns_to_shard,
    key_hashes_and_shards,
    queue_groups,
)
from engine.errors import (
    CorruptConsumeQueueError,
    CorruptIndexError,
    CorruptRecordError,
    StoreCorruptError,
)
from engine.files.mapped_file import Access
from engine.files.naming import ABORT_FILE, QUARANTINE_DIR
from engine.formats.checkpoint import Checkpoint
from engine.formats.cq_entry import is_filler_entry
from engine.formats.record import Verify
from engine.formats.record.dispatch_columns import DispatchColumns
from engine.index.health import unsound_shards
from engine.index.shard import ShardIndex
from engine.log.commitlog import CommitLog
from engine.log.tail import data_segments_after, quarantine_tail, segment_base
from engine.log.walk_past import is_zero_from
from engine.log.written_extent import written_end_estimate
from engine.queues.cuts import planned_cuts, recovered_cuts, redispatch_floor
from engine.queues.table import ConsumeQueueTable, OnUnreadable
from engine.recovery.accepted_damage import AcceptedSpan, ScanPastAccepted, load_accepted, save_accepted
from engine.recovery.checkpoint import load_checkpoint, write_checkpoint
from engine.recovery.durable_line import durable_line, refuse_loss_below, refuse_short_segments
from engine.recovery.durable_times import CheckpointTimes
from engine.recovery.salvage import (
    HiddenTails,
    accept_new_damage,
    fill_queue_gaps,
    hidden_tails,
    keep_damaged_entries,
    restore_hidden_tails,
)
from engine.retention.line import refuse_lost_head, settle_retention_line

Progress = Callable[[int, int], None]


class ShutdownState(Enum):
    """How the last run ended: the abort file is present after a crash."""

    CLEAN = "clean"
    CRASH = "crash"


class RecoveryMode(Enum):
    """ROUTINE: bounded by the checkpoint (after any stop or crash); cuts only past the durable
    line and refuses (StoreCorruptError) to cut below it. REBUILD: the operator's choice after
    such a refusal or a `check` finding: verify the whole log, cut at the first invalid record
    wherever it is, and rebuild consume queues and index from what is kept. SALVAGE: the other
    choice: keep every valid record in place, accept the damaged spans between them
    (engine.recovery.salvage) and rebuild consume queues and index past them."""

    ROUTINE = "routine"
    REBUILD = "rebuild"
    SALVAGE = "salvage"


def detect_shutdown(root: Path) -> ShutdownState:
    return ShutdownState.CRASH if (Path(root) / ABORT_FILE).exists() else ShutdownState.CLEAN


@dataclass
class RecoveryReport:
    """What recovery found and did; the CLI prints it and `--json` emits it."""

    shutdown: str
    checkpoint_source: str
    mode: str = RecoveryMode.ROUTINE.value
    index_shards_rebuilt: list[int] = field(default_factory=list)
    checkpoint_problems: list[str] = field(default_factory=list)
    durable_pos: int = 0  # routine recovery cuts only at or past it (engine.recovery.durable_line)
    scan_start_pos: int = 0
    cut_pos: int = 0
    bytes_scanned: int = 0
    records_scanned: int = 0
    cq_entries_redispatched: int = 0
    index_keys_redispatched: int = 0
    cq_entries_trimmed: int = 0
    index_entries_trimmed: int = 0
    cut_reason: str | None = None
    quarantine_path: str | None = None
    quarantined_bytes: int = 0  # every byte from cut_pos to the last non-zero byte of the log
    quarantined_records: int = 0  # valid records inside them, after the invalid bytes at cut_pos
    segments_removed: list[str] = field(default_factory=list)
    damage_accepted: list[dict] = field(default_factory=list)  # spans a salvage accepted (new ones)
    placeholder_entries: int = 0  # consume-queue entries put for records a damaged span hides
    queues_rebuilt: list[str] = field(default_factory=list)
    queues_cut: list[str] = field(default_factory=list)  # cut at an invalid entry, re-dispatched past it
    duration_ms: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    def summary_lines(self) -> list[str]:
        lines = [
            f"{self.mode} recovery after {self.shutdown} shutdown "
            f"(checkpoint: {self.checkpoint_source})",
            f"  scanned {self.records_scanned} records, {self.bytes_scanned} bytes "
            f"from commit_pos {self.scan_start_pos} to {self.cut_pos} in {self.duration_ms:.0f} ms",
            f"  re-dispatched {self.cq_entries_redispatched} consume-queue entries, "
            f"{self.index_keys_redispatched} index keys",
        ]
        lines += [f"  checkpoint problem: {p}" for p in self.checkpoint_problems]
        if self.cut_reason:
            lines.append(f"  cut at {self.cut_pos}: {self.cut_reason}")
        if self.quarantine_path:
            lines.append(f"  {self.quarantined_bytes} bytes quarantined to {self.quarantine_path}, "
                         f"holding {self.quarantined_records} valid record(s) after the invalid "
                         f"bytes at {self.cut_pos}")
        if self.cq_entries_trimmed or self.index_entries_trimmed:
            lines.append(f"  trimmed {self.cq_entries_trimmed} consume-queue entries, "
                         f"{self.index_entries_trimmed} index entries past the cut")
        lines += [f"  removed segment {s}" for s in self.segments_removed]
        lines += [f"  accepted damage at {d['start_pos']}..{d['end_pos']} ({d['reason']}), kept in "
                  f"place; its bytes copied to {d['copy_path']}" for d in self.damage_accepted]
        if self.placeholder_entries:
            lines.append(f"  {self.placeholder_entries} consume-queue entries point at damaged spans "
                         "(readers report them as skipped)")
        lines += [f"  rebuilt consume queue {q}" for q in self.queues_rebuilt]
        lines += [f"  consume queue {q} ended in an invalid entry with bytes behind it: cut there, "
                  "its entries put back from the commitlog" for q in self.queues_cut]
        lines += [f"  rebuilt index shard {n} (its files were unreadable, damaged or missing; "
                  "any left are in quarantine/)"
                  for n in self.index_shards_rebuilt]
        return lines


@dataclass
class StoreParts:
    """The open, writable structures recovery works on."""

    root: Path
    commitlog: CommitLog
    queues: ConsumeQueueTable
    shards: list[ShardIndex]
    damaged_shards: list[int] = field(default_factory=list)


def recover(parts: StoreParts, shutdown: ShutdownState, *, mode: RecoveryMode = RecoveryMode.ROUTINE,
            progress: Progress | None = None,
            now_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> RecoveryReport:
    """Bring the store to a consistent state and write a fresh checkpoint; see the module doc."""
    started = time.monotonic()
    loaded = load_checkpoint(parts.root)
    fresh = not parts.commitlog.segments.segments
    report = RecoveryReport(shutdown=shutdown.value, checkpoint_source=loaded.source.value,
                            checkpoint_problems=[] if fresh else list(loaded.problems))
    report.mode = mode.value
    report.index_shards_rebuilt = list(parts.damaged_shards)
    cp = loaded.checkpoint if mode is RecoveryMode.ROUTINE else None
    shard_positions = _shard_durable_positions(cp, len(parts.shards))
    for shard_no in parts.damaged_shards:
        shard_positions[shard_no] = 0
    accepted, hidden = _damage_rule(parts, mode, loaded.checkpoint, _scan_start(
        cp, shard_positions, parts.commitlog.min_pos, _last_dispatched_pos(parts.queues)), report,
        now_ms())
    if mode is not RecoveryMode.ROUTINE:
        for queue in list(parts.queues):
            parts.queues.drop(queue.topic, queue.queue_id)
    parts.queues.recover_all()
    for shard_no, shard in enumerate(parts.shards):  # a damaged entry can make it re-index from lower
        report.index_entries_trimmed += shard.trim_for_recovery(shard_positions[shard_no])
        shard_positions[shard_no] = shard.processed_pos
    start_pos = _lowered_for_queue_cuts(parts, mode, report, _scan_start(
        cp, shard_positions, parts.commitlog.min_pos, _last_dispatched_pos(parts.queues)))
    report.scan_start_pos = start_pos
    cut_pos, reason = _scan_and_redispatch(parts, start_pos, report, progress, accepted)
    if mode is RecoveryMode.SALVAGE:
        report.placeholder_entries += restore_hidden_tails(parts.queues, parts.commitlog, hidden, accepted)
    report.cut_pos = cut_pos
    if reason is not None:
        report.cut_reason = reason
    if cut_pos < report.durable_pos:  # refuse_loss_below saw that range valid: never expected
        raise StoreCorruptError(f"recovery stopped below the durable line ({reason or 'zeros'})",
                                commit_pos=cut_pos, durable_pos=report.durable_pos)
    _cut(parts, cut_pos, report, now_ms())
    _finish(parts, report, cut_pos, [s for s in accepted if s.end_pos <= cut_pos])
    report.duration_ms = (time.monotonic() - started) * 1000
    return report


def _lowered_for_queue_cuts(parts: StoreParts, mode: RecoveryMode, report: RecoveryReport,
                            start_pos: int) -> int:
    """The scan start, lowered so re-dispatch puts back what recover_all cut and rebuilds the
    queues set aside (engine.queues.cuts); both named in the report."""
    cuts = recovered_cuts(parts.queues)
    report.queues_cut = [f"{queue.topic}/{queue.queue_id}" for queue, _ in cuts]
    if mode is RecoveryMode.ROUTINE:  # the other modes rebuild every queue
        report.queues_rebuilt += [f"{topic}/{queue_id}" for topic, queue_id in parts.queues.set_aside]
    floor = redispatch_floor(parts.queues, parts.commitlog, cuts)
    return start_pos if floor is None else min(start_pos, floor)


def refuse_damage_before_opening(root: Path, config: StoreConfig) -> dict[int, str]:
    """Routine recovery's durable-line refusal (refuse_loss_below, over the range recovery would
    scan) on a read-only view, before a writer opens the store: opening for writing already
    settles temp files and moves unreadable index shards aside, and a refused start must
    leave every file as it was. `recover` checks the same range again once open. Returns the
    readable index shards the writer sets aside to rebuild, with why (engine.index.health)."""
    refuse_short_segments(root, config.commitlog_file_size)
    commitlog = CommitLog.open(root, config.commitlog_file_size, Access.READ_ONLY)
    queues = ConsumeQueueTable.load(root, config.consume_queue_entries, Access.READ_ONLY,
                                    on_unreadable=OnUnreadable.SKIP)  # the writer sets them aside
    try:
        refuse_lost_head(root, commitlog.min_pos)
        cp = load_checkpoint(root).checkpoint
        shard_positions = _shard_durable_positions(cp, config.index_shards)
        unreadable, unsound = _shards_to_rebuild(root, config, commitlog)
        for shard_no in [*unreadable, *unsound]:
            shard_positions[shard_no] = 0  # recovery rebuilds it: the scan starts lower
        start_pos = _scan_start(cp, shard_positions, commitlog.min_pos, _last_dispatched_pos(queues))
        floor = redispatch_floor(queues, commitlog, planned_cuts(queues))  # as recover will lower it
        refuse_loss_below(commitlog, queues, durable_line(cp, queues),
                          start_pos if floor is None else min(start_pos, floor), load_accepted(root))
    finally:
        commitlog.close()
        queues.close()
    return unsound


def _shards_to_rebuild(root: Path, config: StoreConfig,
                       commitlog: CommitLog) -> tuple[list[int], dict[int, str]]:
    """The index shards a writer's open would quarantine and rebuild (engine.store_open): those
    it cannot read, and those whose files cannot vouch for a trim (engine.index.health), with why."""
    shards: list[ShardIndex | None] = []
    try:
        for shard_no in range(config.index_shards):
            try:
                shards.append(ShardIndex.load(root, shard_no, config.index_slot_count,
                                              config.index_entry_count, Access.READ_ONLY))
            except CorruptIndexError:
                shards.append(None)
        unsound = unsound_shards(root, commitlog, shards)
    finally:
        for shard in shards:
            if shard is not None:
                shard.close()
    return [n for n, shard in enumerate(shards) if shard is None], unsound


def _damage_rule(parts: StoreParts, mode: RecoveryMode, checkpoint: Checkpoint | None, scan_start: int,
                 report: RecoveryReport, now_ms: int) -> tuple[list[AcceptedSpan], HiddenTails]:
    """Before anything on disk changes, the damage the scan may pass over: ROUTINE refuses damage
    below the durable line that no salvage accepted; SALVAGE accepts the new damage (and notes
    the queue offsets hidden in it); REBUILD passes over none (it cuts at the first)."""
    accepted = load_accepted(parts.root)  # in every mode: a malformed file raises even for a rebuild
    if mode is RecoveryMode.REBUILD:
        return [], {}
    line = durable_line(checkpoint, parts.queues)
    report.durable_pos = line.pos
    if mode is RecoveryMode.ROUTINE:
        refuse_loss_below(parts.commitlog, parts.queues, line, scan_start, accepted)
        return accepted, {}
    salvaged = accept_new_damage(parts.root, parts.commitlog, accepted, line.pos, now_ms)
    report.damage_accepted = [asdict(s) for s in salvaged if s not in accepted]
    return salvaged, hidden_tails(parts.queues, salvaged)


def _shard_durable_positions(cp: Checkpoint | None, shard_count: int) -> list[int]:
    known = list(cp.index_durable_pos) if cp is not None else []
    return [known[i] if i < len(known) else 0 for i in range(shard_count)]


def _scan_start(cp: Checkpoint | None, shard_positions: list[int], min_pos: int,
                last_dispatched_pos: int | None) -> int:
    if cp is None:
        return min_pos
    start = min([cp.cq_durable_pos, cp.commitlog_flushed_pos, *shard_positions])
    if last_dispatched_pos is not None:  # re-verify at least the last record (RocketMQ #467)
        start = min(start, last_dispatched_pos)
    return max(start, min_pos)


def _last_dispatched_pos(queues: ConsumeQueueTable) -> int | None:
    """Start of the newest record a consume queue points at: after a clean stop the checkpoint
    says everything is durable, but the last record is still checked (a scan from the end alone
    would verify nothing, and a damaged last record would be served)."""
    starts = [entry.commit_pos for queue in queues
              if (entry := queue.entry(queue.max_offset - 1)) is not None and not is_filler_entry(entry)]
    return max(starts, default=None)


def _scan_and_redispatch(parts: StoreParts, start_pos: int, report: RecoveryReport,
                         progress: Progress | None,
                         accepted: list[AcceptedSpan]) -> tuple[int, str | None]:
    """Walk valid records from start_pos past the accepted spans, re-dispatching; return
    (cut_pos, reason or None)."""
    try:
        return _scan_from(parts, start_pos, report, progress, accepted)
    except CorruptRecordError as exc:
        if exc.pos != start_pos or start_pos == parts.commitlog.min_pos:
            raise
    # The start (a checkpoint position or the last dispatched record) is not a record boundary we
    # can trust: walk from its segment base.
    seg_base = start_pos - (start_pos - parts.commitlog.min_pos) % parts.commitlog.segments.segment_bytes
    report.checkpoint_problems.append(f"no valid record at scan start {start_pos}; "
                                      f"rescanning from segment base {seg_base}")
    report.scan_start_pos = seg_base
    return _scan_from(parts, seg_base, report, progress, accepted)


def _scan_from(parts: StoreParts, start_pos: int, report: RecoveryReport,
               progress: Progress | None, accepted: list[AcceptedSpan]) -> tuple[int, str | None]:
    commitlog, shard_count = parts.commitlog, len(parts.shards)
    end_hint = max(written_end_estimate(commitlog.segments) - start_pos, 1)  # not preallocated bytes
    pos = start_pos
    broken: set[tuple[str, int]] = set()
    first = True
    passed: list[AcceptedSpan] = []

    def pass_span(span: AcceptedSpan) -> None:  # a damaged record keeps its entry (engine.recovery.salvage)
        passed.append(span)
        report.cq_entries_redispatched += keep_damaged_entries(parts.queues, commitlog, span)

    try:
        for run in ScanPastAccepted(commitlog, start_pos, accepted, on_span=pass_span):
            first = False
            cols = run.columns()
            pos = cols.end_pos
            report.records_scanned += cols.count
            report.bytes_scanned += int(cols.total_size.sum())
            if passed:
                report.placeholder_entries += fill_queue_gaps(parts.queues, commitlog, cols, passed)
            _redispatch(parts, cols, shard_count, report, broken)
            if progress is not None:
                progress(pos - start_pos, max(end_hint, pos - start_pos))
    except CorruptRecordError as exc:
        if first and exc.pos == start_pos and start_pos != segment_base(commitlog, start_pos) \
                and not is_zero_from(commitlog, exc.pos):
            raise  # not known to be a record boundary: the caller rescans from the segment base
        pos = exc.pos
        if broken:
            _rebuild_queues(parts, broken, pos, report, accepted)
        return pos, None if is_zero_from(commitlog, pos) else exc.reason
    if broken:
        _rebuild_queues(parts, broken, pos, report, accepted)
    return pos, None


def _redispatch(parts: StoreParts, cols: DispatchColumns, shard_count: int, report: RecoveryReport,
                broken: set[tuple[str, int]]) -> None:
    """Dispatch a run of verified records; a queue that refuses its entries joins `broken`."""
    for queue_key, rows in queue_groups(cols, consumable_rows(cols)):
        if queue_key in broken:
            continue
        try:
            report.cq_entries_redispatched += dispatch_columns_to_consume_queues(parts.queues, cols, rows)
        except CorruptConsumeQueueError:
            broken.add(queue_key)
    keys = key_hashes_and_shards(cols, shard_count)
    for shard_no, shard in enumerate(parts.shards):
        report.index_keys_redispatched += dispatch_columns_to_shard(shard, cols, shard_no, keys)


def _rebuild_queues(parts: StoreParts, broken: set[tuple[str, int]], end_pos: int,
                    report: RecoveryReport, accepted: list[AcceptedSpan]) -> None:
    """A consume queue that disagrees with the commitlog is rebuilt from the commitlog (past
    accepted damage as a salvage does; the other queues are complete, so this leaves them be)."""
    for topic, queue_id in sorted(broken):
        parts.queues.drop(topic, queue_id)
        report.queues_rebuilt.append(f"{topic}/{queue_id}")
    passed: list[AcceptedSpan] = []

    def pass_span(span: AcceptedSpan) -> None:
        passed.append(span)
        keep_damaged_entries(parts.queues, parts.commitlog, span)

    for run in ScanPastAccepted(parts.commitlog, parts.commitlog.min_pos, accepted, Verify.STRUCTURE,
                                on_span=pass_span, end_pos=end_pos):
        cols = run.columns()
        fill_queue_gaps(parts.queues, parts.commitlog, cols, passed)
        for queue_key, rows in queue_groups(cols, consumable_rows(cols)):
            if queue_key in broken:
                dispatch_columns_to_consume_queues(parts.queues, cols, rows)


def _cut(parts: StoreParts, cut_pos: int, report: RecoveryReport, now_ms: int) -> None:
    """Quarantine whatever lies past cut_pos, then truncate every structure there."""
    commitlog = parts.commitlog
    tail = quarantine_tail(commitlog, parts.root / QUARANTINE_DIR, cut_pos, now_ms)
    if tail is not None:
        report.quarantine_path = str(tail.path)
        report.quarantined_bytes = tail.size_bytes
        report.quarantined_records = tail.valid_records
    report.segments_removed = [path.name for path in data_segments_after(commitlog, cut_pos)]
    commitlog.truncate_to(cut_pos)
    report.cq_entries_trimmed += parts.queues.truncate_all_from(cut_pos)
    for shard in parts.shards:  # only past the cut: a trim below it is not re-indexed any more
        if (shard.newest_commit_pos or 0) >= cut_pos:
            report.index_entries_trimmed += shard.trim_from(cut_pos)


def _finish(parts: StoreParts, report: RecoveryReport, cut_pos: int,
            accepted: list[AcceptedSpan]) -> None:
    """Make every structure durable at cut_pos, record the accepted damage below it (after the
    queues that point at it), and record all that in a fresh checkpoint."""
    parts.commitlog.reset_positions(cut_pos, cut_pos)
    parts.queues.flush_all()
    for queue in parts.queues:
        queue.correct_min_offset(parts.commitlog.min_pos)
    for shard in parts.shards:
        shard.mark_processed(cut_pos)
        shard.sync()
    if accepted != load_accepted(parts.root):
        save_accepted(parts.root, accepted)
    settle_retention_line(parts.root, parts.commitlog.min_pos)  # before: the checkpoint ends recovery
    times = CheckpointTimes(parts.commitlog, parts.root, len(parts.shards))
    write_checkpoint(parts.root, times.checkpoint(cut_pos, cut_pos, tuple(cut_pos for _ in parts.shards)))
    parts.queues.finish_rebuilds()  # the queues set aside are whole: the checkpoint says so
