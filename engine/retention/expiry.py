"""Retention (reference §8): expire commitlog segments by age and by disk usage, then clean the
consume queues and index files below the new minimum commit position.

When segments may go, judged on the used fraction of the store's filesystem:

    usage >= disk_full_ratio (90%)         DISK_FULL (puts are refused); delete regardless of age
    usage >= disk_clean_force_ratio (85%)  delete regardless of age
    usage >= disk_warn_ratio (75%)         delete expired segments at any hour
    local hour == delete_when_hour         delete expired segments
    a manual pass (`mqstore clean`)        delete expired segments at any hour
    otherwise                              delete nothing

A segment is expired when now >= the store time of its last record + file_reserved_hours
(engine.retention.segment_age; Kafka's rule). Its file's mtime is never read: a restore, a copy tool or
a clock set after boot moves it. A segment whose last record cannot be read is aged by the next
segment's first record (engine.retention.segment_age); one with no age at all is never expired
by age; a store time in the future keeps its segment until that time has aged.
The walk goes oldest to newest, never touches the last (active) segment, stops at the first
segment it may not delete (so segments never go from the middle) and deletes at most
`max_files` per pass. A pass that leaves segments behind that may go says so (`more_due`): its
caller runs the next pass at once, so retention keeps pace with any write rate while the I/O
of one pass stays bounded (the tails of at most `max_files` + 1 segments are read, each once).

Step order. Each step is durable on its own (unlink + fsync of the directory), and death
between any two steps leaves a state that readers, `recover` and `check` accept:

1. `delete_segments`: remove commitlog segments, oldest first, one at a time. The log's min
   position moves up. Consume-queue and index entries below it are now *expired*, not
   corrupt: readers never read below the min position, `check` skips such entries, and
   recovery's `correct_min_offset` moves each queue's min offset past them.
2. `clean_consume_queues`: each queue deletes the files whose entries all lie below the min
   position and corrects its min offset.
3. `clean_index`: each shard deletes the files whose entries all lie below the min position.

A derived structure never loses an entry before the commitlog bytes it points at, so no step
leaves a reference into the middle of the log; steps 2 and 3 run on every pass, so a pass cut
short after step 1 is finished by the next one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, NamedTuple

from engine.config import StoreConfig
from engine.errors import BadInputError
from engine.files.filesystem import disk_usage_ratio
from engine.retention.line import raise_retention_line
from engine.retention.segment_age import SegmentAge, SegmentAges

if TYPE_CHECKING:
    from engine.index.shard import ShardIndex
    from engine.log.commitlog import CommitLog
    from engine.queues.consume_queue import ConsumeQueue
    from engine.recovery.recover import StoreParts

MS_PER_HOUR = 3_600_000
DEFAULT_MAX_FILES = 10


class RetentionReason(Enum):
    """Why a pass was allowed to delete (the strongest trigger that held)."""

    NONE = "none"
    TIME_UP = "time_up"  # the delete hour: expired segments go
    SPACE_WARN = "space_warn"  # usage >= warn ratio: expired segments go at any hour
    SPACE_FORCE = "space_force"  # usage >= clean-force (or full) ratio: oldest segments go regardless of age
    MANUAL = "manual"  # asked for (`mqstore clean`): expired segments go at any hour


class PassKind(Enum):
    """Who started a pass: the schedule, or an operator (RocketMQ's executeDeleteFilesManually)."""

    SCHEDULED = "scheduled"
    MANUAL = "manual"


@dataclass
class RetentionReport:
    """What one retention pass did; `disk_full` is the DISK_FULL verdict for the store."""

    segments_removed: list[str] = field(default_factory=list)
    cq_files_removed: int = 0
    index_files_removed: int = 0
    disk_usage_ratio: float = 0.0
    disk_full: bool = False
    reason: RetentionReason = RetentionReason.NONE
    min_commit_pos: int = 0
    more_due: bool = False  # segments that may go were left behind by the batch limit

    def to_dict(self) -> dict:
        out = asdict(self)
        out["reason"] = self.reason.value
        return out


def local_hour(now_ms: int) -> int:
    """The local wall-clock hour of `now_ms` (RocketMQ's deleteWhen is local time)."""
    return time.localtime(now_ms / 1000).tm_hour


def retention_reason(now_ms: int, usage_ratio: float, config: StoreConfig,
                     kind: PassKind = PassKind.SCHEDULED) -> RetentionReason:
    """The trigger that holds now, strongest first (pure)."""
    if usage_ratio >= config.disk_clean_force_ratio:
        return RetentionReason.SPACE_FORCE
    if usage_ratio >= config.disk_warn_ratio:
        return RetentionReason.SPACE_WARN
    if local_hour(now_ms) == config.delete_when_hour:
        return RetentionReason.TIME_UP
    return RetentionReason.MANUAL if kind is PassKind.MANUAL else RetentionReason.NONE


def is_disk_full(usage_ratio: float, config: StoreConfig) -> bool:
    """DISK_FULL holds at or above the top threshold and clears below it."""
    return usage_ratio >= config.disk_full_ratio


class RetentionPlan(NamedTuple):
    """The segments one pass deletes (base positions, oldest first), the trigger, and whether
    segments that may go are left behind by the batch limit (the next pass is due at once)."""

    base_positions: list[int]
    reason: RetentionReason
    more_due: bool


def is_expired(age: SegmentAge, now_ms: int, config: StoreConfig) -> bool:
    """Its last record is older than file_reserved_hours; a segment without an age never is."""
    if age.last_store_ts_ms is None:
        return False
    return now_ms >= age.last_store_ts_ms + config.file_reserved_hours * MS_PER_HOUR


def plan_retention(sealed_bases: Sequence[int], age_of: Callable[[int], SegmentAge], now_ms: int,
                   usage_ratio: float, config: StoreConfig, max_files: int = DEFAULT_MAX_FILES,
                   kind: PassKind = PassKind.SCHEDULED) -> RetentionPlan:
    """The plan of one pass over `sealed_bases`, the segments that may go at all, oldest first
    (never the active one: `plan_log` builds the list). `age_of` is asked only for the
    segments an age decides, at most `max_files` + 1 of them, and not at all under SPACE_FORCE.
    """
    reason = retention_reason(now_ms, usage_ratio, config, kind)
    if reason is RetentionReason.NONE:
        return RetentionPlan([], reason, False)
    regardless_of_age = reason is RetentionReason.SPACE_FORCE
    chosen: list[int] = []
    for base_pos in sealed_bases:
        if not (regardless_of_age or is_expired(age_of(base_pos), now_ms, config)):
            break  # never from the middle
        if len(chosen) >= max_files:
            return RetentionPlan(chosen, reason, max_files > 0)
        chosen.append(base_pos)
    return RetentionPlan(chosen, reason, False)


# ------------------------------------------------------------------------------ the steps


def delete_segments(parts: StoreParts, base_positions: Sequence[int]) -> list[str]:
    """Step 1: remove the planned segments, oldest first; returns their file names.

    Each base must be the log's current first segment (the plan is a prefix of the log);
    `CommitLog.remove_oldest_segment` refuses the active segment.
    """
    return remove_segments(parts.commitlog, base_positions)


def remove_segments(log: CommitLog, base_positions: Sequence[int]) -> list[str]:
    """Step 1 on a commitlog (the supervisor's, which alone writes it); file names removed."""
    removed = []
    if base_positions:  # first the line, so the log never starts above it unless damaged
        raise_retention_line(log.segments.directory.parent, base_positions[-1] + log.segment_bytes)
    for base_pos in base_positions:
        if base_pos != log.min_pos:
            raise BadInputError("segment", f"{base_pos} is not the oldest ({log.min_pos}); "
                                "retention never deletes from the middle")
        removed.append(log.remove_oldest_segment().name)
    return removed


def clean_consume_queues(parts: StoreParts, min_commit_pos: int) -> int:
    """Step 2: drop consume-queue files wholly below `min_commit_pos`, correct min offsets."""
    return expire_queues(parts.queues, min_commit_pos)


def clean_index(parts: StoreParts, min_commit_pos: int) -> int:
    """Step 3: drop index files wholly below `min_commit_pos` in every shard."""
    return expire_shards(parts.shards, min_commit_pos)


def expire_queues(queues: Iterable[ConsumeQueue], min_commit_pos: int) -> int:
    """Step 2 over the queues a process owns (the dispatcher's); files deleted."""
    return sum(queue.delete_expired_files(min_commit_pos) for queue in queues)


def expire_shards(shards: Iterable[ShardIndex], min_commit_pos: int) -> int:
    """Step 3 over the shards a process owns (an index builder's one); files deleted."""
    return sum(shard.delete_expired(min_commit_pos) for shard in shards)


def plan_pass(parts: StoreParts, config: StoreConfig, *, now_ms: int, usage_ratio: float,
              ages: SegmentAges, max_files: int = DEFAULT_MAX_FILES,
              kind: PassKind = PassKind.SCHEDULED, scheduled_pos: int | None = None) -> RetentionPlan:
    """`plan_retention` over an open store's segments (see `plan_log`)."""
    return plan_log(parts.commitlog, config, now_ms=now_ms, usage_ratio=usage_ratio, ages=ages,
                    max_files=max_files, end_pos=parts.commitlog.written_pos, kind=kind,
                    scheduled_pos=scheduled_pos)


def plan_log(log: CommitLog, config: StoreConfig, *, now_ms: int, usage_ratio: float, end_pos: int,
             ages: SegmentAges, max_files: int = DEFAULT_MAX_FILES,
             kind: PassKind = PassKind.SCHEDULED, scheduled_pos: int | None = None) -> RetentionPlan:
    """`plan_retention` over the segments of `log` that lie wholly below `end_pos`.

    `scheduled_pos` is the lowest delayed record not delivered yet (ScheduledDelivery.waiting_pos):
    its segment and those after it stay, whatever their age; only forced cleaning on a full disk
    passes it (the delivery service then logs and counts each delayed message it lost).

    `end_pos` is the write position in one process; the supervisor passes the lowest position
    every process has made durable, so no segment goes that a child still has to read. The
    segment holding `end_pos` stands for the active one: never chosen, as are those after it
    (and the last segment always). Ages come from `ages`, read once per segment.
    """
    if scheduled_pos is not None and \
            retention_reason(now_ms, usage_ratio, config, kind) is not RetentionReason.SPACE_FORCE:
        end_pos = min(end_pos, scheduled_pos)
    bases = [s.base_pos for s in log.segments_info()]
    sealed = sum(1 for base in bases if base + log.segment_bytes <= end_pos)
    ages.forget_below(log.min_pos)
    return plan_retention(bases[:min(sealed, len(bases) - 1)], lambda base: ages.age_of(log, base),
                          now_ms, usage_ratio, config, max_files, kind)


def run_retention(parts: StoreParts, config: StoreConfig, *, now_ms: int | None = None,
                  usage_ratio: float | None = None, max_files: int = DEFAULT_MAX_FILES,
                  kind: PassKind = PassKind.SCHEDULED, ages: SegmentAges | None = None,
                  scheduled_pos: int | None = None) -> RetentionReport:
    """One retention pass over an open, writable store (see the module doc for the rules).

    `usage_ratio` defaults to the measured usage of the store's filesystem; a caller that has
    just measured it (the supervisor's cleaner) passes its value. DISK_FULL is judged on the
    usage before this pass deletes anything, as RocketMQ does; the next pass clears it. A
    caller that runs passes again passes the same `ages`, so no segment's records are read twice.
    """
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    ratio = disk_usage_ratio(parts.root) if usage_ratio is None else usage_ratio
    plan = plan_pass(parts, config, now_ms=now_ms, usage_ratio=ratio, max_files=max_files, kind=kind,
                     ages=SegmentAges() if ages is None else ages, scheduled_pos=scheduled_pos)
    removed = delete_segments(parts, plan.base_positions)
    min_commit_pos = parts.commitlog.min_pos
    return RetentionReport(segments_removed=removed,
                           cq_files_removed=clean_consume_queues(parts, min_commit_pos),
                           index_files_removed=clean_index(parts, min_commit_pos),
                           disk_usage_ratio=ratio, disk_full=is_disk_full(ratio, config),
                           reason=plan.reason, min_commit_pos=min_commit_pos, more_due=plan.more_due)
