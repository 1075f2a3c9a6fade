"""Verify a stopped store against the ledger: nothing acknowledged lost, nothing duplicated.

Run after the supervisor stopped (the lock is free) and before anything writes again. The
store is only read: `engine.check.fsck.check` first (commitlog, consume queues, index and checkpoint
agree; queue offsets contiguous; no duplicate entries), then the files are mapped read-only
and every ledger entry is looked up:

- the commitlog is scanned (incrementally: `LogIndex` remembers what it saw, and the driver
  tells it where a recovery cut the log) and every record's TORTURE_ID is collected, so an
  identity found twice is a duplicate and one found nowhere is lost;
- an acknowledged message must be found exactly once, at its commit position, in its queue at
  its queue offset, with its body digest, keys and tags, and its consume-queue entry must point
  at it;
- its keys must be found through the index (ShardIndex.query), for messages not verified yet.

Under async flush a power loss may take acknowledged messages that were not flushed yet:
those whose record ends past the flushed position of a power loss that came after their
acknowledgement are counted as `lost_unflushed` (reported, allowed). Those from the cut of an
operator's rebuild on (after damage below the durable line, tools.torture.durable_damage) are
`lost_to_rebuild` (reported, chosen). A record inside a span an operator's salvage accepted
(`mqstore recover --salvage`) is `lost_to_salvage` (reported, chosen: exactly the damaged
records; the log scan goes on past the span). Every other loss counts as `lost` (a failure
under any flush policy).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from engine.check.fsck import check
from engine.config import StoreConfig
from engine.errors import CorruptRecordError
from engine.files.mapped_file import Access
from engine.files.store_dir import config_for_store, read_meta
from engine.formats.index_file import shard_of
from engine.index.shard import ShardIndex
from engine.log.commitlog import CommitLog
from engine.queues.table import ConsumeQueueTable
from engine.recovery.accepted_damage import AcceptedSpan, ScanPastAccepted, ScanUnit, load_accepted
from tools.torture.ledger import IDENTITY_PROPERTY, LedgerEntry, body_digest

MAX_EXAMPLES = 10


class Seen(NamedTuple):
    """A torture record as found in the commitlog."""

    commit_pos: int
    total_size: int
    topic: str
    queue_id: int
    queue_offset: int
    body_digest: str
    keys: tuple[str, ...]
    tags: str | None


class PowerLoss(NamedTuple):
    """A simulated power loss: when, and how far the commitlog was flushed then."""

    at_ms: int
    flushed_pos: int


class OperatorCut(NamedTuple):
    """An operator's rebuild (`mqstore recover --rebuild`) cut the log at `cut_pos` at `at_ms`."""

    at_ms: int
    cut_pos: int


class AcceptedDamage(NamedTuple):
    """An operator's salvage accepted [start_pos, end_pos) as damaged at `at_ms`."""

    at_ms: int
    start_pos: int
    end_pos: int


@dataclass
class LogIndex:
    """Identity -> where it occurs in the commitlog, kept across rounds."""

    by_identity: dict[str, list[Seen]] = field(default_factory=lambda: defaultdict(list))
    scanned_end: int = 0

    def invalidate_from(self, cut_pos: int) -> None:
        """Recovery cut the log at `cut_pos`: forget what was seen there or later."""
        if cut_pos >= self.scanned_end:
            return
        self.forget_span(cut_pos, 1 << 63)  # commit positions are int64: this is "to the end"
        self.scanned_end = cut_pos

    def forget_span(self, start_pos: int, end_pos: int) -> None:
        """A salvage accepted [start_pos, end_pos) as damaged: what was seen there is gone."""
        for identity in list(self.by_identity):
            kept = [s for s in self.by_identity[identity] if not start_pos <= s.commit_pos < end_pos]
            if kept:
                self.by_identity[identity] = kept
            else:
                del self.by_identity[identity]

    def scan(self, commitlog: CommitLog, accepted: list[AcceptedSpan]) -> int:
        """Read records from where the last scan ended to the end of the log, past the accepted
        damaged spans; returns how many."""
        scan = ScanPastAccepted(commitlog, max(self.scanned_end, commitlog.min_pos), accepted,
                                unit=ScanUnit.RECORDS)
        count = 0
        try:
            for record in scan:
                count += 1
                self._add(record)
        except CorruptRecordError:
            pass  # the end of written data (check() has already judged what lies there)
        self.scanned_end = scan.pos
        return count

    def _add(self, record) -> None:
        identity = record.properties.get(IDENTITY_PROPERTY)
        if identity is not None:
            self.by_identity[identity].append(Seen(
                record.commit_pos, record.total_size, record.topic, record.queue_id,
                record.queue_offset, body_digest(record.body), record.keys, record.tags))


@dataclass
class VerifyState:
    """What verification carries from round to round."""

    log: LogIndex = field(default_factory=LogIndex)
    power_losses: list[PowerLoss] = field(default_factory=list)
    operator_cuts: list[OperatorCut] = field(default_factory=list)
    salvages: list[AcceptedDamage] = field(default_factory=list)
    lost_accounted: set[str] = field(default_factory=set)
    index_verified: set[str] = field(default_factory=set)


@dataclass
class VerifyReport:
    """The outcome of one verification; `problems` is empty when the round passed."""

    findings: list[str] = field(default_factory=list)
    acknowledged: int = 0
    timed_out: int = 0
    lost: list[str] = field(default_factory=list)
    lost_unflushed: list[str] = field(default_factory=list)
    lost_to_rebuild: list[str] = field(default_factory=list)  # cut by an OperatorCut: chosen
    lost_to_salvage: list[str] = field(default_factory=list)  # inside an AcceptedDamage: chosen
    duplicated: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)
    index_missing: list[str] = field(default_factory=list)
    records_scanned: int = 0

    @property
    def problems(self) -> list[str]:
        out = [f"check: {f}" for f in self.findings[:MAX_EXAMPLES]]
        for name in ("lost", "duplicated", "mismatched", "index_missing"):
            items = getattr(self, name)
            if items:
                out.append(f"{name}: {len(items)} (e.g. {items[:MAX_EXAMPLES]})")
        return out


def store_config(root: Path) -> StoreConfig:
    return config_for_store(read_meta(Path(root)), StoreConfig())


def verify_store(root: Path, entries: list[LedgerEntry], state: VerifyState) -> VerifyReport:
    """Check the stopped store at `root`, then every ledger entry against it."""
    root = Path(root)
    report = VerifyReport(findings=[str(f) for f in check(root)])
    config = store_config(root)
    commitlog = CommitLog.open(root, config.commitlog_file_size, Access.READ_ONLY)
    queues = ConsumeQueueTable.load(root, config.consume_queue_entries, Access.READ_ONLY)
    shards = [ShardIndex.load(root, n, config.index_slot_count, config.index_entry_count,
                              Access.READ_ONLY) for n in range(config.index_shards)]
    try:
        report.records_scanned = state.log.scan(commitlog, load_accepted(root))
        report.duplicated = sorted(i for i, seen in state.log.by_identity.items() if len(seen) > 1)
        found = _verify_entries(entries, state, report)
        _verify_queue_entries(found, queues, report)
        _verify_index(found, shards, state, report)
    finally:
        commitlog.close()
        queues.close()
        for shard in shards:
            shard.close()
    return report


def _verify_entries(entries: list[LedgerEntry], state: VerifyState,
                    report: VerifyReport) -> list[LedgerEntry]:
    """Presence and content of each ledger entry; returns the acknowledged ones found once."""
    found = []
    for entry in entries:
        if not entry.acknowledged:
            report.timed_out += 1
            continue
        report.acknowledged += 1
        if entry.identity in state.lost_accounted:
            continue
        seen = state.log.by_identity.get(entry.identity, ())
        if not seen:
            _account_loss(entry, state, report)
            continue
        if len(seen) > 1:
            continue  # counted in `duplicated`
        problem = _mismatch(entry, seen[0])
        if problem:
            report.mismatched.append(f"{entry.identity}: {problem}")
        else:
            found.append(entry)
    return found


def _account_loss(entry: LedgerEntry, state: VerifyState, report: VerifyReport) -> None:
    if any(loss.at_ms >= entry.ack_ms and entry.end_pos > loss.flushed_pos
           for loss in state.power_losses):
        report.lost_unflushed.append(entry.identity)
        state.lost_accounted.add(entry.identity)
    elif any(cut.at_ms >= entry.ack_ms and entry.end_pos > cut.cut_pos for cut in state.operator_cuts):
        report.lost_to_rebuild.append(entry.identity)
        state.lost_accounted.add(entry.identity)
    elif any(s.at_ms >= entry.ack_ms and s.start_pos <= entry.commit_pos < s.end_pos
             for s in state.salvages):
        report.lost_to_salvage.append(entry.identity)
        state.lost_accounted.add(entry.identity)
    else:
        report.lost.append(entry.identity)


def _mismatch(entry: LedgerEntry, seen: Seen) -> str | None:
    wanted = (entry.commit_pos, entry.record_bytes, entry.topic, entry.queue_id, entry.queue_offset,
              entry.body_digest, tuple(entry.keys), entry.tags)
    if tuple(seen) == wanted:
        return None
    names = ("commit_pos", "record_bytes", "topic", "queue_id", "queue_offset", "body_digest",
             "keys", "tags")
    return ", ".join(f"{n} {w!r} != stored {s!r}" for n, w, s in zip(names, wanted, seen, strict=True)
                     if w != s)


def _verify_queue_entries(found: list[LedgerEntry], queues: ConsumeQueueTable,
                          report: VerifyReport) -> None:
    """Each message's consume-queue entry, at its queue offset, points at its record."""
    by_queue: dict[tuple[str, int], list[LedgerEntry]] = defaultdict(list)
    for entry in found:
        by_queue[(entry.topic, entry.queue_id)].append(entry)
    for (topic, queue_id), group in by_queue.items():
        queue = queues.get(topic, queue_id)
        if queue is None:
            report.mismatched += [f"{e.identity}: no consume queue {topic}/{queue_id}" for e in group]
            continue
        low = queue.min_offset
        positions = queue.entries(low, queue.max_offset - low)["commit_pos"].astype(np.int64)
        for entry in group:
            i = entry.queue_offset - low
            if not 0 <= i < len(positions) or int(positions[i]) != entry.commit_pos:
                got = int(positions[i]) if 0 <= i < len(positions) else None
                report.mismatched.append(f"{entry.identity}: consume queue {topic}/{queue_id} "
                                         f"offset {entry.queue_offset} holds {got}, "
                                         f"expected {entry.commit_pos}")


def _verify_index(found: list[LedgerEntry], shards: list[ShardIndex], state: VerifyState,
                  report: VerifyReport) -> None:
    """Every key of each message not index-verified before is found at its commit position."""
    for entry in found:
        if entry.identity in state.index_verified:
            continue
        missing = [key for key in entry.keys
                   if entry.commit_pos not in shards[shard_of(entry.topic, key, len(shards))]
                   .query(entry.topic, key)]
        if missing:
            report.index_missing.append(f"{entry.identity}: keys {missing}")
        else:
            state.index_verified.add(entry.identity)
