"""The operator's salvage (`mqstore recover --salvage`, RecoveryMode.SALVAGE): keep every valid
record after damage below the durable line in place, and accept the damage.

- Damage is each bad region of a walk of the whole log (engine.log.walk_past) that starts below the
  durable line with a valid record after it. Bad bytes past the line, or after the last valid
  record, are the tail: recovery cuts it as always.
- Each damaged span's bytes are copied to quarantine/<start>.<ms>.damaged; the span is recorded
  in quarantine/accepted-damage.json (engine.recovery.accepted_damage) once queues and index are rebuilt.
- Consume queues and index are rebuilt from the log, passing over the spans; commit positions
  and queue offsets of every kept record stay as they were. The records of a span are walked
  without their checksums from its start: each that decodes, ends inside the span and holds its
  queue's next offset keeps its entry. An offset a later record skips (a record whose header is
  unreadable) gets a placeholder entry pointing at the first accepted span after the queue's
  previous entry, at the span's first unreadable position (no record frame there, so every
  reader, the columns read included, reports the offset as skipped). A gap with no accepted
  span before it stays an error. The last offsets of a queue have no later record to show them:
  those the consume queue held before the salvage, pointing into an accepted span, get a
  placeholder too (else the next message would reuse an offset a consumer may have passed).
  Damaged records get no index keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from engine.dispatch.record import consumable_rows, queue_groups
from engine.errors import BadInputError, CorruptRecordError
from engine.files.filesystem import ensure_dir, write_new_file
from engine.files.naming import QUARANTINE_DIR, damaged_copy_name
from engine.formats.cq_entry import FILLER_SIZE_MARK
from engine.formats.record import Record, Verify
from engine.formats.record.dispatch_columns import DispatchColumns
from engine.log.commitlog import CommitLog
from engine.log.tail import log_chunks
from engine.log.walk_past import walk_log
from engine.log.walker import BadRegion, OnBadBytes, record_decoder, walk
from engine.queues.consume_queue import ConsumeQueue
from engine.queues.table import ConsumeQueueTable
from engine.record_rules import enters_consume_queue, tag_field_function
from engine.recovery.accepted_damage import AcceptedSpan, is_accepted, span_at

_MAX_PLACEHOLDER_BYTES = FILLER_SIZE_MARK - 1  # the filler mark itself is not a size


def find_damage(log: CommitLog, durable_pos: int) -> list[BadRegion]:
    """The bad regions of the log that start below the durable line with a valid record after
    them, in log order. Past the line a bad region is a crash's torn tail (a power loss may tear
    pages out of order there, leaving records after a hole): recovery cuts it, as always."""
    bad: list[BadRegion] = []
    data_end = log.min_pos
    for item in walk_log(log, log.min_pos, Verify.MQSTORE):
        if isinstance(item, BadRegion):
            if item.start_pos >= durable_pos:
                break
            bad.append(item)
        else:
            data_end = item.end_pos
    return [region for region in bad if region.start_pos < data_end]


def accept_new_damage(root: Path, log: CommitLog, accepted: list[AcceptedSpan], durable_pos: int,
                      now_ms: int) -> list[AcceptedSpan]:
    """The accepted spans plus each new damaged region below the durable line, its bytes copied
    to quarantine/. BadInputError (nothing written) when there is none beyond what is accepted."""
    new = [r for r in find_damage(log, durable_pos)
           if not is_accepted(accepted, r.start_pos, r.resume_pos)]
    if not new:
        raise BadInputError("--salvage", "the log has no damage followed by valid records "
                            "(beyond damage already accepted): nothing to salvage, nothing changed")
    directory = ensure_dir(Path(root) / QUARANTINE_DIR)
    spans = list(accepted)
    for region in new:
        path = directory / damaged_copy_name(region.start_pos, now_ms)
        write_new_file(path, log_chunks(log, region.start_pos, region.resume_pos))
        spans.append(AcceptedSpan(region.start_pos, region.resume_pos, region.reason, now_ms, str(path)))
    return sorted(spans, key=lambda s: s.start_pos)


def keep_damaged_entries(queues: ConsumeQueueTable, log: CommitLog, span: AcceptedSpan) -> int:
    """Put the consume-queue entries of the damaged records in `span` that can be identified
    (see the module doc); returns how many were put."""
    put = 0
    for record in _structure_walk(log, span):
        if not enters_consume_queue(record.sys_flag, record.queue_offset):
            continue
        try:
            queue = queues.get(record.topic, record.queue_id)
        except BadInputError:
            continue  # the damage is in its topic or queue id
        # no queue is made for a damaged record: the damage may lie in its topic or queue id
        if queue is None or queue.max_offset != record.queue_offset:
            continue
        tag = tag_field_function(queues.delay_levels_ms)(record.topic, record.queue_id, record.store_ts_ms,
                                                         record.tags_code)
        put += queue.put_entries([record.queue_offset], [record.commit_pos], [record.total_size], [tag])
    return put


def fill_queue_gaps(queues: ConsumeQueueTable, log: CommitLog, cols: DispatchColumns,
                    passed: list[AcceptedSpan]) -> int:
    """Placeholder entries for the offsets each queue of `cols` skips, when an accepted span
    lies after the queue's last entry; returns how many were put."""
    put = 0
    for (topic, queue_id), rows in queue_groups(cols, consumable_rows(cols)):
        queue = queues.get(topic, queue_id)
        first = int(cols.queue_offset[rows[0]])
        if queue is None or not 0 < queue.max_offset < first:
            continue
        next_pos = int(cols.commit_pos[rows[0]])
        span = next((s for s in passed if queue.max_commit_end <= s.start_pos < next_pos), None)
        if span is None:
            continue  # not explained by accepted damage: dispatch refuses the gap
        put += _put_placeholders(queue, list(range(queue.max_offset, first)), log, span)
    return put


HiddenTails = dict[tuple[str, int], list[int]]  # queue -> offsets whose entries pointed into a span


def hidden_tails(queues: ConsumeQueueTable, spans: list[AcceptedSpan]) -> HiddenTails:
    """Before the queues are rebuilt: each queue's trailing offsets whose entries point into an
    accepted span (the entries after the queue's last one outside every span)."""
    hidden: HiddenTails = {}
    for queue in queues:
        offsets = []
        for offset in range(queue.max_offset - 1, queue.min_offset - 1, -1):
            entry = queue.entry(offset)
            if entry is None or span_at(spans, entry.commit_pos) is None:
                break
            offsets.append(offset)
        if offsets:
            hidden[(queue.topic, queue.queue_id)] = offsets[::-1]
    return hidden


def restore_hidden_tails(queues: ConsumeQueueTable, log: CommitLog, hidden: HiddenTails,
                         spans: list[AcceptedSpan]) -> int:
    """After the rebuild: a placeholder for each hidden offset the rebuilt queue still ends
    before, pointing at the first accepted span after its last entry; returns how many."""
    put = 0
    for (topic, queue_id), offsets in sorted(hidden.items()):
        queue = queues.get(topic, queue_id)
        if queue is None or queue.max_offset not in offsets:
            continue
        span = next((s for s in spans if queue.max_commit_end <= s.start_pos), None)
        if span is None:
            continue
        put += _put_placeholders(queue, offsets[offsets.index(queue.max_offset):], log, span)
    return put


def _put_placeholders(queue: ConsumeQueue, offsets: list[int], log: CommitLog, span: AcceptedSpan) -> int:
    """Entries at `offsets` (consecutive) pointing at the span's first unreadable position."""
    pos = _unreadable_pos(log, span)
    count = len(offsets)
    size = min(span.end_pos - pos, _MAX_PLACEHOLDER_BYTES)
    return queue.put_entries(np.array(offsets), np.full(count, pos), np.full(count, size),
                             np.zeros(count, dtype=np.int64))


def _structure_walk(log: CommitLog, span: AcceptedSpan) -> Iterator[Record]:
    """The records from the span's start that decode without checksums and end inside it."""
    window = log.window_at(span.start_pos)
    try:
        for item in walk(window, span.start_pos, span.end_pos, record_decoder(Verify.STRUCTURE),
                         Verify.STRUCTURE, OnBadBytes.RAISE):
            if not isinstance(item, Record):
                return
            yield item
    except CorruptRecordError:
        return


def _unreadable_pos(log: CommitLog, span: AcceptedSpan) -> int:
    """The first position of the span where no record decodes even without checksums."""
    ends = [record.end_pos for record in _structure_walk(log, span)]
    return min(ends[-1] if ends else span.start_pos, span.end_pos - 1)

