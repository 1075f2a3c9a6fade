"""Filter pushdown (`DataSourceReader.pushFilters`, PySpark >= 4.1): Spark's filters onto the scan.

Claimed (applied exactly by the source, so Spark does not evaluate them again):
- store: =, IN            -> the stores read (a store no value names is not planned at all)
- topic: =, IN            -> the scan's topics (consume queues prune ranges, rows are filtered)
- commit_pos: =, <, <=, >, >= -> the scan's commit-position range (ranges are cut to it)
- queue_id: =, IN; queue_offset: =, <, <=, >, >= -> an exact filter on the decoded rows
- tags: =, IN -> the scan's tag set (the consumers' exact TAGS rule, engine.filters.tag_expression;
  a value set that leaves no tag beside an earlier one goes back to Spark, which then drops all)
Used for pruning but handed back to Spark: commit_pos IN (the range around its values) and
store_ts ranges (segments and ranges whose store
times cannot match are skipped; Spark re-checks the rows, which keeps microsecond edge cases
and local-time conversions out of the source's hands). Everything else goes back to Spark.
With verify=report nothing is claimed: a bad record's row has null columns and must meet
Spark's own null semantics.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

from engine.filters.tag_expression import TagExpression
from tools.spark.partitions import ScanFilter
from tools.spark.read_plan import RowSelection

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_RANGE_OPS = GreaterThan | GreaterThanOrEqual | LessThan | LessThanOrEqual


@dataclass(frozen=True)
class Pushed:
    """What the accepted filters narrowed: the scan filter and the row selection."""

    scan_filter: ScanFilter
    selection: RowSelection


def _intersect(current: frozenset | None, values: Iterable) -> frozenset:
    wanted = frozenset(values)
    return wanted if current is None else current & wanted


def _bounds(f: Filter, lo: int | None, hi: int | None) -> tuple[int | None, int | None]:
    """Tighten the integer range [lo, hi) by a comparison or equality filter."""
    v = f.value
    if isinstance(f, EqualTo):
        return max(lo if lo is not None else v, v), min(hi if hi is not None else v + 1, v + 1)
    if isinstance(f, GreaterThan | GreaterThanOrEqual):
        start = v + 1 if isinstance(f, GreaterThan) else v
        return (start if lo is None else max(lo, start)), hi
    end = v + 1 if isinstance(f, LessThanOrEqual) else v
    return lo, (end if hi is None else min(hi, end))


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def micros_of(moment: datetime) -> int:
    """Microseconds since the epoch (a naive datetime is local time, as PySpark converts)."""
    aware = moment if moment.tzinfo is not None else moment.astimezone()
    return (aware - _EPOCH) // timedelta(microseconds=1)


def push(filters: list[Filter], scan_filter: ScanFilter, selection: RowSelection,
         columns: frozenset[str]) -> tuple[Pushed, list[Filter]]:
    """Narrow `scan_filter` and `selection` by the filters the source can apply; return them
    with the filters Spark must still evaluate."""
    rest: list[Filter] = []
    f_scan, sel = scan_filter, selection
    for f in filters:
        name = f.attribute[0] if len(f.attribute) == 1 and f.attribute[0] in columns else None
        claimed = True
        if name == "topic" and isinstance(f, EqualTo | In) and _all(f, str):
            f_scan = replace(f_scan, topics=_intersect(f_scan.topics, _values(f)))
        elif name == "tags" and isinstance(f, EqualTo | In) and _all(f, str) and _narrows_tags(f_scan, f):
            f_scan = replace(f_scan, tags=_narrowed_tags(f_scan.tags, _values(f)))
        elif name == "queue_id" and isinstance(f, EqualTo | In) and _all(f, int):
            sel = replace(sel, queue_ids=_intersect(sel.queue_ids, _values(f)))
        elif name == "commit_pos" and isinstance(f, EqualTo | In | _RANGE_OPS) and _all(f, int):
            f_scan = _narrow_positions(f_scan, f)
            claimed = not isinstance(f, In)  # IN prunes to the range around its values only
        elif name == "queue_offset" and isinstance(f, EqualTo | _RANGE_OPS) and _is_int(f.value):
            lo, hi = _bounds(f, sel.min_queue_offset, sel.end_queue_offset)
            sel = replace(sel, min_queue_offset=lo, end_queue_offset=hi)
        else:
            claimed = False
            if name == "store_ts" and isinstance(f, _RANGE_OPS) and isinstance(f.value, datetime):
                f_scan = _narrow_times(f_scan, f)
        if not claimed:
            rest.append(f)
    return Pushed(f_scan, sel), rest


def push_stores(filters: list[Filter],
                stores: frozenset[str] | None) -> tuple[frozenset[str] | None, list[Filter]]:
    """Claim = and IN on `store` (every row of a store carries its name, so they keep or drop
    whole stores): the stores still wanted, and the other filters."""
    rest: list[Filter] = []
    for f in filters:
        if f.attribute == ("store",) and isinstance(f, EqualTo | In) and _all(f, str):
            stores = _intersect(stores, _values(f))
        else:
            rest.append(f)
    return stores, rest


def _values(f: Filter) -> tuple:
    return tuple(f.value) if isinstance(f, In) else (f.value,)


def _all(f: Filter, kind: type) -> bool:
    values = _values(f)
    if kind is int:
        return bool(values) and all(_is_int(v) for v in values)
    return bool(values) and all(isinstance(v, kind) for v in values)


def _narrowed_tags(current: TagExpression, values: tuple) -> TagExpression:
    wanted = frozenset(values)
    return TagExpression(wanted if current.matches_all else current.tags & wanted)


def _narrows_tags(f_scan: ScanFilter, f: Filter) -> bool:
    """Whether the tag values keep some tag (an empty set would read as `*`) and are tags the
    consumers' rule can hold (no `||`, no surrounding spaces, not `*`)."""
    values = _values(f)
    if any(v != v.strip() or not v or "||" in v or v == "*" for v in values):
        return False
    return bool(_narrowed_tags(f_scan.tags, values).tags)


def _narrow_positions(f_scan: ScanFilter, f: Filter) -> ScanFilter:
    if isinstance(f, In):  # the smallest range holding every wanted position
        lo, hi = min(f.value), max(f.value) + 1
    else:
        lo, hi = _bounds(f, None, None)
    start = f_scan.start_pos if lo is None else max(f_scan.start_pos, lo)
    end = f_scan.end_pos if hi is None else (hi if f_scan.end_pos is None else min(f_scan.end_pos, hi))
    return replace(f_scan, start_pos=start, end_pos=end)


def _narrow_times(f_scan: ScanFilter, f: Filter) -> ScanFilter:
    """Store-time bounds in ms that keep every row the filter can accept (Spark re-checks)."""
    micros = micros_of(f.value)
    if isinstance(f, GreaterThan | GreaterThanOrEqual):
        start_ms = micros // 1000
        if f_scan.start_ms is not None:
            start_ms = max(f_scan.start_ms, start_ms)
        return replace(f_scan, start_ms=start_ms)
    end_ms = micros // 1000 + 1
    return replace(f_scan, end_ms=end_ms if f_scan.end_ms is None else min(f_scan.end_ms, end_ms))
