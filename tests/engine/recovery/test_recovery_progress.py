"""Recovery's progress total: the bytes it will scan, not the preallocated segment bytes."""

from __future__ import annotations

from engine.files.mapped_file import Access
from engine.log.written_extent import PAGE_BYTES, written_end_estimate
from engine.message import Message
from engine.recovery.recover import ShutdownState, recover
from engine.store import MessageStore
from engine.store_open import close_parts, open_parts
from tests.helpers import SMALL_CONFIG, TOPIC, die

SEGMENT_BYTES = 1 << 20  # a large segment, mostly unwritten: the old total was all of it
CONFIG = SMALL_CONFIG.replace(commitlog_file_size=SEGMENT_BYTES)


def crashed_store(root, count: int) -> int:
    store = MessageStore.open(root, CONFIG)
    results = store.put_batch([Message(TOPIC, b"x" * 500, queue_id=i % 4) for i in range(count)])
    assert all(r.ok for r in results)
    written = store._parts.commitlog.written_pos
    die(store)
    return written


def test_progress_ends_at_its_total_and_the_total_is_the_written_bytes(tmp_path):
    written = crashed_store(tmp_path, 400)  # ~230 KB of a 1 MiB segment
    parts = open_parts(tmp_path, CONFIG, Access.READ_WRITE)
    calls: list[tuple[int, int]] = []
    try:
        assert written <= written_end_estimate(parts.commitlog.segments) <= written + PAGE_BYTES
        recover(parts, ShutdownState.CRASH, progress=lambda done, total: calls.append((done, total)))
    finally:
        close_parts(parts)
    assert calls
    done, total = calls[-1]
    assert done == written and done <= total < done + PAGE_BYTES  # all but a page, not a quarter
    assert all(d <= t for d, t in calls)


def test_an_empty_commitlog_is_estimated_at_its_start(tmp_path):
    MessageStore.open(tmp_path, CONFIG).close()
    parts = open_parts(tmp_path, CONFIG, Access.READ_ONLY)
    try:
        assert written_end_estimate(parts.commitlog.segments) == parts.commitlog.min_pos
    finally:
        close_parts(parts)
