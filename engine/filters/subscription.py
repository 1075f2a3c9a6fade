"""What a consumer subscribed to: a tag expression and an optional property filter, one value.

Every read path applies it by one rule (RocketMQ's getMessage, reference §9.1 and
rocketmq-consumption §1.3): the consume queue's tagsCode selects candidates without reading
a record, the record's own TAGS then the property filter confirm; entries passed over do not
count toward max_count, the next offset moves past them, and one read examines at most
`Subscription.scan_entries(max_count)` entries (RocketMQ's maxFilterMessageSize, 16000 bytes of
consume queue), so a long run of non-matching entries costs a bounded pull that returns with
no message and an advanced offset instead of a scan of the whole queue.

A Subscription has a canonical text (`str`) and equality: two spellings of the same
subscription (`B||A` and `A || B`) are equal, as consumer groups need to compare members.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from engine.errors import BadInputError
from engine.filters.sql import SqlFilter, compile_sql_filter
from engine.filters.tag_expression import MATCH_ALL_TAGS, TagExpression, parse_tag_expression
from engine.formats.cq_entry import CQ_ENTRY_SIZE
from engine.formats.properties import PROP_TAGS
from engine.formats.record import Record
from engine.formats.record.view import RecordView, gather_records
from engine.status import SkippedRecord

FILTER_SCAN_BYTES = 16000  # RocketMQ's maxFilterMessageSize default (a constant in 4.9.x)
MIN_FILTER_SCAN_ENTRIES = FILTER_SCAN_BYTES // CQ_ENTRY_SIZE  # 800 entries of 20 bytes
UNDECODABLE_PROPERTIES = "properties are not UTF-8"


class SubscribedViews(NamedTuple):
    """What `Subscription.subscribed_views` keeps: the records, the next offset, and the
    records passed over as corrupt (to report, as a read reports a torn record)."""

    views: list[RecordView]
    next_offset: int
    skipped: list[SkippedRecord]


@dataclass(frozen=True, slots=True)
class Subscription:
    """A tag expression (`*` by default) and a property filter (None: none)."""

    tags: TagExpression = MATCH_ALL_TAGS
    where: SqlFilter | None = None

    @property
    def matches_all(self) -> bool:
        return self.tags.matches_all and self.where is None

    def scan_entries(self, max_count: int) -> int:
        """How many consume-queue entries a read for `max_count` messages may examine."""
        if self.matches_all or max_count == 0:
            return max_count
        return max(MIN_FILTER_SCAN_ENTRIES, max_count)

    def candidates(self, entry_codes: np.ndarray) -> np.ndarray:
        """A mask of the entries whose tagsCode may match (no record read)."""
        return self.tags.candidates(entry_codes)

    def matches(self, record: Record) -> bool:
        """Whether a record read through a candidate entry is subscribed."""
        return self.matches_properties(record.properties)

    def matches_properties(self, properties: Mapping[str, str]) -> bool:
        if not self.tags.matches(properties.get(PROP_TAGS)):
            return False
        return self.where is None or self.where.matches(properties)

    def confirm(self, view: RecordView) -> tuple[np.ndarray, list[SkippedRecord]]:
        """(keep, skipped): a mask of a view's records that are subscribed (TAGS for all of
        them at once, the property filter record by record) and the records whose properties
        had to be decoded and are not UTF-8 (corrupt bytes: no CRC is checked here), dropped."""
        keep = np.ones(view.count, dtype=bool)
        undecodable: list[int] = []
        if not self.tags.matches_all:
            wanted = frozenset(tag.encode() for tag in self.tags.tags)
            keep, rows = view.property_in(PROP_TAGS.encode(), wanted)
            undecodable.extend(rows.tolist())
        if self.where is not None:
            where = self.where
            for i in np.flatnonzero(keep).tolist():
                try:
                    keep[i] = where.matches(view.properties(i))
                except UnicodeDecodeError:
                    keep[i] = False
                    undecodable.append(i)
        skipped = [SkippedRecord(int(view.commit_pos[i]), UNDECODABLE_PROPERTIES, view.topic(i),
                                 int(view.queue_id[i]), int(view.queue_offset[i]))
                   for i in sorted(undecodable)]
        return keep, skipped

    def subscribed_views(self, views: list[RecordView], max_count: int,
                         end_offset: int) -> SubscribedViews:
        """The first `max_count` subscribed records of `views` (candidates in queue order, read
        up to queue offset `end_offset`), the next offset (one past the max_count-th, else
        `end_offset`) and the records passed over as corrupt before it (`confirm`)."""
        kept: list[RecordView] = []
        skipped: list[SkippedRecord] = []
        taken = 0
        for view in views:
            mask, corrupt = self.confirm(view)
            keep = np.flatnonzero(mask)
            full = taken + len(keep) >= max_count
            keep = keep[:max_count - taken]
            if full:  # what lies past the max_count-th record is read again by the next pull
                last = int(view.queue_offset[keep[-1]])
                corrupt = [record for record in corrupt if record.queue_offset < last]
            skipped.extend(corrupt)
            if len(keep) < view.count:
                view = gather_records(view.buf, view.commit_pos[keep] - view.base_pos, view.base_pos)
            if view.count:
                kept.append(view)
                taken += view.count
            if full:
                return SubscribedViews(kept, int(view.queue_offset[-1]) + 1, skipped)
        return SubscribedViews(kept, end_offset, skipped)

    def __str__(self) -> str:
        """The canonical text: the tag expression, then ` WHERE ` and the filter when there is one."""
        return str(self.tags) if self.where is None else f"{self.tags} WHERE {self.where}"


MATCH_ALL = Subscription()


def subscription_of(tags: str | None = None, where: str | None = None) -> Subscription:
    """The Subscription of a tag expression (None: `*`) and a property filter (None: none),
    compiled once per distinct pair (RocketMQ caches its parsed filters too)."""
    for name, value in (("tags", tags), ("where", where)):
        if value is not None and not isinstance(value, str):
            raise BadInputError(name, f"must be a str, not {type(value).__name__}")
    return _compiled(tags, where)


@lru_cache(maxsize=128)
def _compiled(tags: str | None, where: str | None) -> Subscription:
    return Subscription(MATCH_ALL_TAGS if tags is None else parse_tag_expression(tags),
                        None if where is None else compile_sql_filter(where))
