"""One dispatch step over a span of the commitlog, whatever its size: the way is picked inside.

A span of at most tuning.FEW_RECORDS_BYTES is decoded record by record in plain Python
(engine.dispatch.few) up to the first piece that path does not take (a filler, an IPv6 host,
non-ASCII text, damage); the batch codec (CommitLog.scan_batches and engine.dispatch.record's columns)
takes the rest and every larger span, at most `window_bytes` a call. Both write the same
consume-queue bytes and hand each shard the same keys (tests/workers/test_dispatch_few.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from engine.dispatch.few import decode_few, few_key_columns, few_to_consume_queues
from engine.dispatch.record import dispatch_columns_to_consume_queues, shard_key_columns
from engine.formats.record.dispatch_columns import DispatchColumns
from engine.log.commitlog import CommitLog, window_scans
from engine.log.scan import BatchScanner
from engine.queues.table import ConsumeQueueTable
from engine.tuning import FEW_RECORDS_BYTES

# (start_pos, end_pos, per shard (key hashes, commit positions, store times), or None for a range
# of fillers only): where a step hands the index keys of the records in [start_pos, end_pos).
KeysHandler = Callable[[int, int, Sequence | None], None]


class SpanStep(NamedTuple):
    """What one dispatch_span call did: the position it reached and the records it dispatched."""

    end_pos: int
    count: int


class SpanDispatch(NamedTuple):
    """Where a dispatcher's steps read and write: the log, the queues, the index shards' keys
    (`hand_keys` None: no shard takes them) and the most bytes one batch-codec step scans."""

    commitlog: CommitLog
    queues: ConsumeQueueTable
    shard_count: int
    hand_keys: KeysHandler | None
    window_bytes: int


def dispatch_span(where: SpanDispatch, start_pos: int, limit_pos: int) -> SpanStep:
    """Dispatch the records of [start_pos, limit_pos), or of its first `window_bytes` (more when
    one record or filler is bigger): plain Python up to FEW_RECORDS_BYTES, the batch codec past."""
    step = SpanStep(start_pos, 0)
    if limit_pos - start_pos <= FEW_RECORDS_BYTES:
        step = _dispatch_few(where, start_pos, limit_pos)
    if step.end_pos < limit_pos:
        window = _dispatch_window(where, step.end_pos, limit_pos)
        step = SpanStep(window.end_pos, step.count + window.count)
    return step


def _dispatch_few(where: SpanDispatch, start_pos: int, limit_pos: int) -> SpanStep:
    """The plain records from start_pos in plain Python, up to the first piece decode_few does not
    take or the end of the segment."""
    window = where.commitlog.window_at(start_pos)
    if window is None:
        return SpanStep(start_pos, 0)
    few = decode_few(window.buf, start_pos - window.base_pos,
                     min(limit_pos, window.segment_end_pos) - window.base_pos, window.base_pos)
    if not few.count:
        return SpanStep(start_pos, 0)
    few_to_consume_queues(where.queues, few)
    if where.hand_keys is not None:
        where.hand_keys(start_pos, few.end_pos, few_key_columns(few, where.shard_count))
    return SpanStep(few.end_pos, few.count)


def _dispatch_window(where: SpanDispatch, start_pos: int, limit_pos: int) -> SpanStep:
    """Up to window_bytes from start_pos with the batch codec (to limit_pos when one record or
    filler is bigger than the window)."""
    count, end_pos = 0, start_pos
    for scanner in window_scans(where.commitlog, start_pos, limit_pos, where.window_bytes):
        count += _dispatch_scan(where, scanner)
        end_pos = scanner.pos
    return SpanStep(end_pos, count)


def _dispatch_scan(where: SpanDispatch, scanner: BatchScanner) -> int:
    """Every run of the scan through _dispatch_run; returns the records scanned."""
    count = 0
    run_start = scanner.pos
    for run in scanner:
        count += _dispatch_run(where, run.columns(), run_start, scanner.pos)
        run_start = scanner.pos
    if scanner.pos > run_start:  # fillers crossed after the last run
        _dispatch_run(where, None, run_start, scanner.pos)
    return count


def _dispatch_run(where: SpanDispatch, cols: DispatchColumns | None, start_pos: int, end_pos: int) -> int:
    """Consume-queue entries for the records of [start_pos, end_pos) (one put_entries per queue)
    and each shard's keys of the range (cols None: fillers only); returns the records dispatched."""
    if cols is not None:
        dispatch_columns_to_consume_queues(where.queues, cols)
    if where.hand_keys is not None:
        per_shard = None if cols is None else shard_key_columns(cols, where.shard_count)
        where.hand_keys(start_pos, end_pos, per_shard)
    return 0 if cols is None else cols.count
