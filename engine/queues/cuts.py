"""Where re-dispatch must start in the log to put back the consume-queue entries that recovery
cut (ConsumeQueue.cut_offset) or set aside (ConsumeQueueTable.set_aside).

A queue ended at an invalid entry with bytes behind it lost that entry and those after it; their
records lie past the record of the entry before, and often start exactly where the invalid
entry still points (a torn or flipped size leaves its commit position): that record, when it is
the entry's own (topic, queue, offset), is where re-dispatch starts, so a torn tail costs a
short scan, not one back to the queue's previous message. A queue set aside starts empty and is
rebuilt from the log's start.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.errors import StoreError
from engine.formats.record import Verify
from engine.log.commitlog import CommitLog
from engine.queues.consume_queue import ConsumeQueue
from engine.queues.table import ConsumeQueueTable


def cut_floor_pos(queue: ConsumeQueue, cut_offset: int, log: CommitLog) -> int:
    """The lowest commit position holding a record of `queue`'s entries from `cut_offset` on."""
    try:
        pointed = queue.raw_entry(cut_offset).commit_pos
        if log.min_pos <= pointed < log.written_pos:
            record = log.read_at(pointed, Verify.STRUCTURE)
            if (record.topic, record.queue_id, record.queue_offset) == \
                    (queue.topic, queue.queue_id, cut_offset):
                return max(pointed, queue.record_end_before(cut_offset))
    except StoreError:  # no record there: the entry's commit position is damaged too
        pass
    return queue.record_end_before(cut_offset)


def redispatch_floor(queues: ConsumeQueueTable, log: CommitLog,
                     cuts: Iterable[tuple[ConsumeQueue, int]]) -> int | None:
    """Where re-dispatch must start to restore every cut and every queue set aside or skipped
    (None: no queue needs it), never below the log's start."""
    floors = [cut_floor_pos(queue, offset, log) for queue, offset in cuts]
    if queues.set_aside or queues.skipped:
        floors.append(0)
    return max(min(floors), log.min_pos) if floors else None


def recovered_cuts(queues: ConsumeQueueTable) -> list[tuple[ConsumeQueue, int]]:
    """After recover_all: each queue it ended at an invalid entry with bytes behind it."""
    return [(queue, queue.cut_offset) for queue in queues if queue.cut_offset is not None]


def planned_cuts(queues: ConsumeQueueTable) -> list[tuple[ConsumeQueue, int]]:
    """Read-only, before a writer opens the store: the cuts recover_all will make."""
    return [(queue, offset) for queue in queues if (offset := queue.find_cut()) is not None]
