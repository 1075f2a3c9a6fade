"""The status report's age of a position: at an end-of-file filler it is the age of the next
segment's first record (the walker's filler rule, log_walker.is_filler_head)."""

from __future__ import annotations

from engine.files.mapped_file import Access
from engine.formats.record import encode_record
from engine.log.commitlog import CommitLog
from workers.status_report import _store_ts

SEG = 4096


def test_store_ts_at_a_filler_is_the_next_segments_first_record(tmp_path):
    log = CommitLog.open(tmp_path, SEG, Access.READ_WRITE)
    record = encode_record("T", b"x" * 900, queue_id=0, born_ts_ms=1, born_host=("127.0.0.1", 1),
                           store_host=("127.0.0.1", 2))
    positions = [log.append(record, queue_offset=i, store_ts_ms=1000 + i) for i in range(6)]
    log.flush()
    rolled = next(i for i, pos in enumerate(positions) if pos >= SEG)
    filler_pos = positions[rolled - 1] + len(record)
    assert filler_pos < SEG
    assert _store_ts(log, filler_pos) == 1000 + rolled
    assert _store_ts(log, positions[1]) == 1001
    assert _store_ts(log, log.written_pos) is None  # nothing written there yet
    log.close()
