"""The delivery service's logic: which scheduled messages are due, and their real-topic records.

A delayed message waits in SCHEDULE_TOPIC_XXXX queue level - 1, its entry's tag field holding
its delivery time (engine.record_rules.SCHEDULED_TAG_FIELD). Each pass reads every level's
queue from its next offset (RocketMQ's delayOffset.json `offsetTable`) while entries are due,
and turns each into its REAL_TOPIC / REAL_QID record with DELAY dropped and DELIVERED_FROM set
to the scheduled record's commit position; the caller (MessageStore, the supervisor) appends
them and then marks the plan done. A level is delivered in queue order, never before its time;
timed messages (engine.delivery.timer) are found by the same pass and made into copies alike.

Exactly once across crashes: the progress file is written only once the copies it counts are
flushed, with `rescanFromPos`, the log's end at that moment. Copies delivered after it lie past
that position; a restart reads the records from there (`recover_delivered`) and skips the
scheduled records whose DELIVERED_FROM it found, instead of delivering them again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.delivery.timer import TimerWheel
from engine.errors import BadInputError, CorruptRecordError, DelayOffsetError
from engine.files.filesystem import write_file_atomically
from engine.files.mapped_file import Access
from engine.files.naming import CONSUMEQUEUE_DIR, config_path, validate_topic
from engine.formats.delay_offset import DelayOffsets, decode_delay_offsets, encode_delay_offsets
from engine.formats.properties import encode_properties
from engine.formats.record import Record, Verify
from engine.formats.record.encode_many import EncodedRecords, encode_records
from engine.log.commitlog import CommitLog
from engine.log.walk_past import walk_log
from engine.queues.table import ConsumeQueueTable
from engine.topics.system import (
    PROP_DELAY,
    PROP_DELIVERED_FROM,
    PROP_REAL_QID,
    PROP_REAL_TOPIC,
    PROP_TIMER_DELIVER_MS,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    is_system_topic,
)

DELAY_OFFSET_FILE = "delayOffset.json"
BACKUP_SUFFIX = ".bak"  # RocketMQ's MixAll.string2File keeps the previous content there
ENTRIES_PER_READ = 512  # consume-queue entries read at once per level

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One due scheduled message as the parts of its real-topic record."""

    origin_pos: int  # commit position of the scheduled record (DELIVERED_FROM)
    topic: str
    queue_id: int
    body: bytes
    props_raw: bytes  # encoded properties, without the __CRC32C tail
    born_ts_ms: int
    born_host: tuple[str, int]
    flag: int
    sys_flag: int


@dataclass
class DuePlan:
    """What one pass found: the deliveries to append, and each level's next offset once they are
    appended (entries skipped as already delivered or undeliverable move it too)."""

    deliveries: list[Delivery] = field(default_factory=list)
    next_offsets: dict[int, int] = field(default_factory=dict)
    next_due_ms: int | None = None  # the earliest delivery time not yet due, if any was seen
    timer_done: list[tuple[int, int, int]] = field(default_factory=list)  # (slot, offset, commit_pos)


class ScheduledDelivery:
    """Progress and due-finding of the delayed (delay-level) and timed messages of one store."""

    def __init__(self, root: Path, levels_ms: tuple[int, ...], queue_count: int, progress: DelayOffsets,
                 now_ms: int):
        self.root = Path(root)
        self.timer = TimerWheel.starting(progress.timer_minute_ms, dict(progress.timer_offsets), now_ms)
        self._timer_minute_saved = progress.timer_minute_ms
        self.levels_ms = levels_ms
        self.queue_count = queue_count
        self.offsets = dict(progress.offsets)
        self.rescan_from_pos = progress.rescan_from_pos
        self._delivered: dict[int, int] = {}  # origin -> its copy's position, past the saved offsets
        self.delivered_count = 0
        self.skipped_redeliveries = 0
        self.undeliverable_count = 0
        self.dropped_count = 0  # scheduled records forced cleaning removed before delivery
        self.unsaved = False

    @classmethod
    def load(cls, root: Path, levels_ms: tuple[int, ...], queue_count: int, now_ms: int) -> ScheduledDelivery:
        """The service as delayOffset.json left it (its .bak if the file is unreadable); a new
        store starts every level at offset 0."""
        path = config_path(root, DELAY_OFFSET_FILE)
        progress, errors = DelayOffsets(), []
        for candidate in (path, path.with_name(path.name + BACKUP_SUFFIX)):
            try:
                progress = decode_delay_offsets(candidate.read_bytes(), path=str(candidate))
                break
            except FileNotFoundError:
                continue
            except DelayOffsetError as exc:
                errors.append(exc)
        else:
            if errors:  # starting from offset 0 would deliver every delayed message again
                raise DelayOffsetError(
                    f"{errors[0].message}, and no readable {BACKUP_SUFFIX} beside it", path=str(path),
                    hint="put a good copy back; removing it makes every delayed message still in "
                    "SCHEDULE_TOPIC_XXXX be delivered again")
        return cls(root, levels_ms, queue_count, progress, now_ms)

    def recover_delivered(self, log: CommitLog, queues: ConsumeQueueTable) -> int:
        """Note the copies a previous run delivered after its last save; returns how many. A
        copy follows its scheduled record, so the walk starts at the lowest one not delivered yet
        (or at rescanFromPos, if higher), past any damage a salvage kept."""
        pending = self.waiting_pos(queues)
        ever = [queues.root / CONSUMEQUEUE_DIR / topic for topic in (SCHEDULE_TOPIC, TIMER_TOPIC)]
        if pending is None and not any(path.is_dir() for path in ever):
            return 0  # no delayed or timed record was ever dispatched: no copy can exist
        start = max(self.rescan_from_pos, log.min_pos, pending or 0)
        found = 0
        for record in walk_log(log, start, Verify.STRUCTURE, log.written_pos):
            if not isinstance(record, Record):
                continue
            origin = record.properties.get(PROP_DELIVERED_FROM)
            if origin is not None and origin.isdigit():
                self._delivered[int(origin)] = record.commit_pos
                found += 1
        return found

    def due(self, queues: ConsumeQueueTable, read_at: Callable[[int], Record], readable: range,
            now_ms: int, max_count: int) -> DuePlan:
        """The deliveries due at `now_ms` (at most `max_count`), level by level in queue order,
        reading only entries of records wholly inside `readable` (the log's start to what the
        dispatcher has written)."""
        plan = DuePlan()
        for level in range(1, len(self.levels_ms) + 1):
            queue = queues.get(SCHEDULE_TOPIC, level - 1)
            if queue is None or len(plan.deliveries) >= max_count:
                continue
            if queues.access is Access.READ_ONLY:
                queue.refresh()
            offset = self._first_offset(level, queue.min_offset)
            while len(plan.deliveries) < max_count:
                entries = queue.entries(offset, min(ENTRIES_PER_READ, max_count - len(plan.deliveries)))
                taken = self._take_due(entries, read_at, readable, now_ms, plan)
                offset += taken
                if taken < len(entries) or not len(entries):
                    break
            if offset != self.offsets.get(level, 0):
                plan.next_offsets[level] = offset
        self._timer_due(queues, read_at, readable, now_ms, max_count, plan)
        return plan

    def _timer_due(self, queues: ConsumeQueueTable, read_at: Callable[[int], Record], readable: range,
                   now_ms: int, max_count: int, plan: DuePlan) -> None:
        """The timer messages due at `now_ms`, into `plan` (engine.delivery.timer)."""
        for slot, offset, commit_pos in self.timer.due(queues, read_at, readable, now_ms,
                                                       max_count - len(plan.deliveries)):
            plan.timer_done.append((slot, offset, commit_pos))
            if self._delivered.pop(commit_pos, None) is not None:
                self.skipped_redeliveries += 1
            elif commit_pos < readable.start:  # forced cleaning removed its segment
                self.dropped_count += 1
                log.error("forced cleaning removed the timer message at commit_pos %d before its "
                          "delivery (%d in all since start)", commit_pos, self.dropped_count)
            elif (delivery := self._delivery_of(commit_pos, read_at)) is not None:
                plan.deliveries.append(delivery)
        waiting = self.timer.next_due_ms()
        if waiting is not None and waiting > now_ms:
            plan.next_due_ms = waiting if plan.next_due_ms is None else min(plan.next_due_ms, waiting)

    def _first_offset(self, level: int, min_offset: int) -> int:
        """The level's next offset; forced cleaning may have removed entries below the queue's
        min offset before their delivery: those are logged and counted, never silently lost."""
        offset = self.offsets.get(level, 0)
        if offset < min_offset:
            self.dropped_count += min_offset - offset
            log.error("forced cleaning removed %d delayed message(s) of level %d before their "
                      "delivery (queue offsets %d..%d; %d in all since start)", min_offset - offset, level,
                      offset, min_offset - 1, self.dropped_count)
            self.offsets[level] = offset = min_offset
            self.unsaved = True
        return offset

    def _take_due(self, entries, read_at: Callable[[int], Record], readable: range, now_ms: int,
                  plan: DuePlan) -> int:
        """Add the due entries of `entries` to `plan` up to the first that is not due or not
        readable yet; returns how many were taken."""
        positions, sizes, times = (entries[name].tolist() for name in ("commit_pos", "size", "tags_code"))
        for i, (commit_pos, size, due_ms) in enumerate(zip(positions, sizes, times, strict=True)):
            if size <= 0 or commit_pos + size > readable.stop:
                return i
            if commit_pos < readable.start:  # forced cleaning removed its segment
                self.dropped_count += 1
                log.error("forced cleaning removed the delayed message at commit_pos %d before its "
                          "delivery (%d in all since start)", commit_pos, self.dropped_count)
                continue
            if due_ms > now_ms:
                plan.next_due_ms = due_ms if plan.next_due_ms is None else min(plan.next_due_ms, due_ms)
                return i
            if self._delivered.pop(commit_pos, None) is not None:
                self.skipped_redeliveries += 1
                continue
            delivery = self._delivery_of(commit_pos, read_at)
            if delivery is not None:
                plan.deliveries.append(delivery)
        return len(positions)

    def _delivery_of(self, commit_pos: int, read_at: Callable[[int], Record]) -> Delivery | None:
        """The real-topic record parts of the scheduled record at `commit_pos`; None (logged and
        counted) for one whose REAL_TOPIC or REAL_QID cannot be delivered to."""
        try:
            record = read_at(commit_pos)
        except CorruptRecordError as exc:
            return self._undeliverable(commit_pos, f"unreadable: {exc}")
        props = dict(record.properties)
        topic, qid = props.get(PROP_REAL_TOPIC), props.get(PROP_REAL_QID, "")
        try:
            validate_topic(topic)
        except BadInputError as exc:
            return self._undeliverable(commit_pos, f"REAL_TOPIC {topic!r}: {exc.reason}")
        if is_system_topic(topic) or not qid.isdigit() or int(qid) >= self.queue_count:
            return self._undeliverable(commit_pos, f"REAL_TOPIC {topic!r} REAL_QID {qid!r} is no queue "
                                       "a producer may write")
        props.pop(PROP_DELAY, None)
        props.pop(PROP_TIMER_DELIVER_MS, None)
        props[PROP_DELIVERED_FROM] = str(commit_pos)
        return Delivery(commit_pos, topic, int(qid), record.body, encode_properties(props),
                        record.born_ts_ms, record.born_host, record.flag, record.sys_flag)

    def _undeliverable(self, commit_pos: int, why: str) -> None:
        log.error("scheduled record at %d cannot be delivered, skipped: %s", commit_pos, why)
        self.undeliverable_count += 1
        return None

    def done(self, plan: DuePlan) -> None:
        """The plan's deliveries are appended: its levels move on."""
        for level, offset in plan.next_offsets.items():
            self.offsets[level] = offset
        if plan.timer_done:
            self.timer.done(plan.timer_done)
        self.delivered_count += len(plan.deliveries)
        # the wheel's minute is worth a save once it has slots to record (a store that never
        # held a timed message starts the wheel at now again)
        self.unsaved = self.unsaved or bool(plan.next_offsets) or bool(plan.timer_done) \
            or (bool(self.timer.offsets) and self.timer.minute_ms != self._timer_minute_saved)

    def save(self, log_end_pos: int) -> None:
        """Write delayOffset.json (previous content kept as .bak). Call only once every copy
        counted is flushed, with `log_end_pos` the log's end now: copies delivered later lie past it."""
        path = config_path(self.root, DELAY_OFFSET_FILE)
        # a copy found at the last start whose origin the offsets have not passed yet is
        # found again by the next start only if the rescan begins at or below it
        # and a timer copy made out of order lies past the first entry its slot's offset has not
        # passed (engine.delivery.timer.TimerWheel.lowest_origin)
        timer_origin = self.timer.lowest_origin()
        self.rescan_from_pos = min([log_end_pos, *self._delivered.values(),
                                    *([] if timer_origin is None else [timer_origin])])
        minute = self.timer.minute_ms
        progress = DelayOffsets(self.offsets, self.rescan_from_pos, minute, self.timer.offsets)
        write_file_atomically(path, encode_delay_offsets(progress), backup_suffix=BACKUP_SUFFIX)
        self._timer_minute_saved = minute
        self.unsaved = False

    def waiting_pos(self, queues: ConsumeQueueTable) -> int | None:
        """The lowest commit position of a scheduled record not yet delivered, or None: retention
        keeps the log from there (the scheduled records of a level are in position order)."""
        lowest = None
        for level in range(1, len(self.levels_ms) + 1):
            queue = queues.get(SCHEDULE_TOPIC, level - 1)
            if queue is None:
                continue
            if queues.access is Access.READ_ONLY:
                queue.refresh()
            offset = max(self.offsets.get(level, 0), queue.min_offset)
            entry = queue.entry(offset) if offset < queue.max_offset else None
            if entry is not None and (lowest is None or entry.commit_pos < lowest):
                lowest = entry.commit_pos
        timed = self.timer.waiting_pos(queues)
        if timed is not None and (lowest is None or timed < lowest):
            lowest = timed
        return lowest


def encode_deliveries(deliveries: list[Delivery], store_host: tuple[str, int]) -> EncodedRecords:
    """The deliveries' records end to end (stamped at append), each keeping its BORNTIMESTAMP,
    BORNHOST, FLAG and SYSFLAG: one encode_records per run of deliveries sharing them."""
    pieces: list[EncodedRecords] = []
    start = 0
    while start < len(deliveries):
        first = deliveries[start]
        end = start + 1
        while end < len(deliveries) and _same_origin(deliveries[end], first):
            end += 1
        run = deliveries[start:end]
        pieces.append(encode_records([d.topic.encode("utf-8") for d in run], [d.body for d in run],
                                     [d.props_raw for d in run], [d.queue_id for d in run],
                                     born_ts_ms=first.born_ts_ms, born_host=first.born_host,
                                     store_host=store_host, flag=first.flag, sys_flag=first.sys_flag))
        start = end
    if len(pieces) == 1:
        return pieces[0]
    buf = bytearray().join(piece.buf for piece in pieces)
    offsets = np.cumsum([0, *(len(piece.buf) for piece in pieces[:-1])])
    starts = np.concatenate([piece.starts + at for piece, at in zip(pieces, offsets, strict=True)]) \
        if pieces else np.zeros(0, dtype=np.int64)
    sizes = np.concatenate([piece.sizes for piece in pieces]) if pieces else np.zeros(0, dtype=np.int64)
    return EncodedRecords(buf, starts.astype(np.int64), sizes.astype(np.int64))


def _same_origin(a: Delivery, b: Delivery) -> bool:
    return (a.born_ts_ms, a.born_host, a.flag, a.sys_flag) == (b.born_ts_ms, b.born_host, b.flag, b.sys_flag)
