"""How old a sealed commitlog segment is: the store time of its last record.

Retention expires a segment by the records it holds, never by its file's mtime, which a restore,
a copy tool or a clock set after boot moves (Kafka expires by a segment's largest timestamp
since 0.10.1; RocketMQ by mtime). The last record is the newest one ending where the segment's
end-of-file filler starts that reads with every check (engine.log.last_record). A segment that does
not end in a filler (or in a record at its very end), or where no record ending there reads,
is aged by the next segment's first record instead: it was stored after every record of this one,
so its store time bounds theirs from above (a clock set back is the one exception, as it is for
any record time) and expiring by it can only keep data longer. Only when that record does not
read either has the segment no age (`last_store_ts_ms` None); what retention does with it is
engine.retention.expiry's rule.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from engine.errors import BadInputError, CorruptRecordError
from engine.log.commitlog import CommitLog
from engine.log.last_record import last_record_of_segment

log = logging.getLogger(__name__)


class SegmentAge(NamedTuple):
    """A sealed segment's last store time, or None and why it cannot be told."""

    base_pos: int
    last_store_ts_ms: int | None
    problem: str | None = None


def read_segment_age(commitlog: CommitLog, base_pos: int) -> SegmentAge:
    """The age of the sealed segment at `base_pos` (its tail is read, not its records)."""
    try:
        record = last_record_of_segment(commitlog, base_pos)
    except CorruptRecordError as exc:
        return _aged_by_next_segment(commitlog, base_pos, f"its last record does not read: {exc}")
    if record is None:
        return _aged_by_next_segment(commitlog, base_pos,
                                     "it does not end in an end-of-file filler after a record")
    return SegmentAge(base_pos, record.store_ts_ms)


def _aged_by_next_segment(commitlog: CommitLog, base_pos: int, problem: str) -> SegmentAge:
    """The age of a segment whose last record cannot be told, bounded from above by the next
    segment's first record (a record start by construction, so no body can fake it)."""
    try:
        first = commitlog.read_at(base_pos + commitlog.segment_bytes)
    except (CorruptRecordError, BadInputError) as exc:
        return SegmentAge(base_pos, None, f"{problem}, nor does the next segment's first record "
                                          f"({exc})")
    return SegmentAge(base_pos, first.store_ts_ms,
                      f"{problem}; aged by the next segment's first record instead")


class SegmentAges:
    """Each sealed segment's age, read once per process: a sealed segment's records never
    change while the store runs (only recovery cuts, before any pass), and a damaged one is
    warned about once."""

    def __init__(self) -> None:
        self._known: dict[int, SegmentAge] = {}

    def age_of(self, commitlog: CommitLog, base_pos: int) -> SegmentAge:
        """The age of a sealed segment; one without an age is warned about once."""
        age = self._known.get(base_pos)
        if age is None:
            age = self._known[base_pos] = read_segment_age(commitlog, base_pos)
            if age.problem is not None and age.last_store_ts_ms is None:
                log.warning("commitlog segment at %d: %s; retention keeps it (and the segments "
                            "after it) until disk pressure removes segments regardless of age",
                            base_pos, age.problem)
            elif age.problem is not None:
                log.warning("commitlog segment at %d: %s", base_pos, age.problem)
        return age

    def forget_below(self, min_pos: int) -> None:
        """Drop what is known of segments retention has removed."""
        for base_pos in [b for b in self._known if b < min_pos]:
            del self._known[base_pos]
