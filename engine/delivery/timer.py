"""Delivery at a time (RocketMQ 5's timer messages): a wheel of one-minute slots over queues.

A message sent with `deliver_at_ms` T waits in the timer topic, queue `timer_slot(T)`: the
minute T falls in, modulo TIMER_SLOTS. The wheel turns over TIMER_SLOTS minutes, more than the
longest delay allowed (TIMER_MAX_DELAY_LIMIT_S) plus a slot, so a slot's queue holds the
messages of one turn at a time: every message of an earlier turn was due, and delivered,
before one of the next can be sent. The service keeps open the current minute and those that
ended less than TIMER_CLOSE_GRACE_MS ago (after a pause, every minute since, closed in turn):
it reads each open minute's queue from its next offset, learns each record's TIMER_DELIVER_MS
once, and delivers each at its time to the millisecond. Memory holds the open minutes'
messages, however many wait further ahead (the "bucketed files" of the design: each minute of
the wheel is its own consume queue).

Progress: each slot's next offset (every entry below it delivered) and the oldest open minute,
in delayOffset.json beside the delay levels. A copy delivered out of order lies past the first
entry of its minute the offset has not passed, and the save's rescanFromPos is at or below
that entry, so a restart finds it (exactly once, as for delay levels: engine.delivery.scheduled).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engine.errors import BadInputError
from engine.files.mapped_file import Access
from engine.files.naming import CONSUMEQUEUE_DIR
from engine.formats.record import Record
from engine.queues.table import ConsumeQueueTable
from engine.topics.system import PROP_TIMER_DELIVER_MS, TIMER_SLOT_MS, TIMER_SLOTS, TIMER_TOPIC

ENTRIES_PER_READ = 4096
# a minute is closed this long after its end: a message sent just before it ends has been
# dispatched to its queue by then (one dispatched later would wait a whole turn)
TIMER_CLOSE_GRACE_MS = 10_000


def timer_slot(deliver_at_ms: int) -> int:
    """The timer queue of a message due at `deliver_at_ms`."""
    return deliver_at_ms // TIMER_SLOT_MS % TIMER_SLOTS


def validate_deliver_at(deliver_at_ms: object, now_ms: int, max_delay_s: int) -> int:
    """A delivery time in ms since the epoch, at most `max_delay_s` ahead of `now_ms`
    (BadInputError otherwise); a time already past is the caller's to deliver at once."""
    if not isinstance(deliver_at_ms, int) or isinstance(deliver_at_ms, bool):
        raise BadInputError("deliver_at_ms", f"must be an int (ms since the epoch), not "
                            f"{type(deliver_at_ms).__name__}")
    if deliver_at_ms - now_ms > max_delay_s * 1000:
        raise BadInputError("deliver_at_ms", f"{deliver_at_ms} is {(deliver_at_ms - now_ms) / 1000:.0f} s "
                            f"ahead; the store delivers at most timer_max_delay_s = {max_delay_s} s ahead")
    return deliver_at_ms


@dataclass
class TimerWindow:
    """The minute being delivered: how far its slot's queue was read, and each entry read and
    not yet delivered, by queue offset: (due ms, commit position)."""

    minute_ms: int
    read_to: int = 0
    waiting: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def end_ms(self) -> int:
        return self.minute_ms + TIMER_SLOT_MS


class TimerWheel:
    """Due-finding of timer messages, a minute's slot at a time: the current minute's, and the
    minutes that ended less than TIMER_CLOSE_GRACE_MS ago (a message sent at their very end may
    still reach their queue)."""

    def __init__(self, minute_ms: int, offsets: dict[int, int]):
        self.offsets = offsets  # slot -> next queue offset (every entry below it delivered)
        self.windows = [TimerWindow(minute_ms - minute_ms % TIMER_SLOT_MS)]  # oldest first

    @classmethod
    def starting(cls, minute_ms: int | None, offsets: dict[int, int], now_ms: int) -> TimerWheel:
        """The wheel where the progress left it; without progress, one turn back from now, so
        every slot is looked at once (messages a crash kept from a first save included)."""
        if minute_ms is None:
            minute_ms = now_ms - (TIMER_SLOTS - 1) * TIMER_SLOT_MS
        return cls(minute_ms, offsets)

    @property
    def minute_ms(self) -> int:
        """The oldest minute not closed yet (what the progress file records)."""
        return self.windows[0].minute_ms

    def due(self, queues: ConsumeQueueTable, read_at: Callable[[int], Record], readable: range,
            now_ms: int, max_count: int) -> list[tuple[int, int, int]]:
        """(slot, queue offset, commit position) of the timer messages due at `now_ms`, at most
        `max_count`, earliest first; minutes long over with nothing left are closed first."""
        if not (queues.root / CONSUMEQUEUE_DIR / TIMER_TOPIC).is_dir():
            # no timed message was dispatched yet: the wheel waits at the minutes still open
            grace_ms = now_ms - TIMER_CLOSE_GRACE_MS
            self.windows = [TimerWindow(grace_ms - grace_ms % TIMER_SLOT_MS)]
            return []
        self._turn_to(now_ms, queues, read_at, readable)
        ready = sorted((at, timer_slot(w.minute_ms), offset, pos)
                       for w in self.windows for offset, (at, pos) in w.waiting.items() if at <= now_ms)
        return [(slot, offset, pos) for _, slot, offset, pos in ready[:max_count]]

    def _turn_to(self, now_ms: int, queues: ConsumeQueueTable, read_at: Callable[[int], Record],
                 readable: range) -> None:
        """Open the minutes up to now's, read each open one's new entries, close the ended ones
        whose grace is over and nothing waits."""
        while self.windows[-1].end_ms <= now_ms:
            self.windows.append(TimerWindow(self.windows[-1].end_ms))
            if len(self.windows) > 2 and self._closable(self.windows[0], now_ms, queues, read_at, readable):
                self._close()
        for window in self.windows:
            self._read(window, queues, read_at, readable)
        while len(self.windows) > 1 and self._closable(self.windows[0], now_ms, queues, read_at, readable):
            self._close()

    def _closable(self, window: TimerWindow, now_ms: int, queues, read_at, readable) -> bool:
        self._read(window, queues, read_at, readable)
        return not window.waiting and now_ms >= window.end_ms + TIMER_CLOSE_GRACE_MS

    def _close(self) -> None:
        window = self.windows.pop(0)
        self._set_offset(timer_slot(window.minute_ms), window.read_to)

    def _read(self, window: TimerWindow, queues: ConsumeQueueTable, read_at: Callable[[int], Record],
              readable: range) -> None:
        """Learn the due times of the window's entries not read yet (records below `readable`'s end)."""
        slot = timer_slot(window.minute_ms)
        queue = queues.get(TIMER_TOPIC, slot)
        if queue is None:
            return
        if queues.access is Access.READ_ONLY:
            queue.refresh()
        start = max(window.read_to, self.offsets.get(slot, 0), queue.min_offset)
        while True:
            entries = queue.entries(start, ENTRIES_PER_READ)
            taken = 0
            rows = zip(entries["commit_pos"].tolist(), entries["size"].tolist(), strict=True)
            for commit_pos, size in rows:
                if size <= 0 or commit_pos + size > readable.stop:
                    break
                # a record forced cleaning removed, or one without a time (made by hand), goes
                # with this minute: the delivery service counts it and moves on
                at = _deliver_at(read_at(commit_pos)) if commit_pos >= readable.start else None
                if at is not None and at >= window.end_ms:
                    break  # the next turn's: it and all after it wait for this slot's next minute
                window.waiting[start + taken] = (window.minute_ms if at is None else at, commit_pos)
                taken += 1
            start += taken
            if taken < len(entries) or not len(entries):
                break
        window.read_to = start

    def next_due_ms(self) -> int | None:
        """The earliest delivery time of an open minute still waiting."""
        return min((at for w in self.windows for at, _ in w.waiting.values()), default=None)

    def lowest_origin(self) -> int | None:
        """The lowest commit position among the open minutes' entries their slot's offset has not
        passed: every copy made out of order lies past it."""
        return min((pos for w in self.windows for _, pos in w.waiting.values()), default=None)

    def done(self, delivered: list[tuple[int, int, int]]) -> None:
        """The deliveries (slot, queue offset, commit position) are appended: each open minute's
        slot offset moves past its delivered prefix."""
        for window in self.windows:
            slot = timer_slot(window.minute_ms)
            for done_slot, offset, _ in delivered:
                if done_slot == slot:
                    window.waiting.pop(offset, None)
            offset = self.offsets.get(slot, 0)
            while offset < window.read_to and offset not in window.waiting:
                offset += 1
            self._set_offset(slot, offset)

    def _set_offset(self, slot: int, offset: int) -> None:
        """A slot's next offset (a slot never written keeps no entry)."""
        if offset or slot in self.offsets:
            self.offsets[slot] = offset

    def waiting_pos(self, queues: ConsumeQueueTable) -> int | None:
        """The lowest commit position of a timer message not yet delivered: an open minute's
        lowest waiting one, or any slot's entry at its next offset."""
        lowest = [pos for w in self.windows for _, pos in w.waiting.values()]
        topic_dir = queues.root / CONSUMEQUEUE_DIR / TIMER_TOPIC
        slots = [int(p.name) for p in topic_dir.iterdir() if p.name.isdigit()] if topic_dir.is_dir() else []
        for slot in slots:
            queue = queues.get(TIMER_TOPIC, slot)
            if queue is None:
                continue
            if queues.access is Access.READ_ONLY:
                queue.refresh()
            offset = max(self.offsets.get(slot, 0), queue.min_offset)
            entry = queue.entry(offset) if offset < queue.max_offset else None
            if entry is not None:
                lowest.append(entry.commit_pos)
        return min(lowest, default=None)


def _deliver_at(record: Record) -> int | None:
    text = record.properties.get(PROP_TIMER_DELIVER_MS, "")
    return int(text) if text.isdigit() else None
