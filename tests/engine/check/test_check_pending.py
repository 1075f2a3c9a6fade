"""engine.check.fsck after a crash: records past the checkpoint's durable positions that the
dispatcher had not reached are recovery's work (CheckSummary.pending), not findings; the same
damage below that line stays a finding."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from engine.check.findings import FindingKind
from engine.check.fsck import check, check_summary
from engine.formats.cq_entry import CQ_ENTRY_SIZE
from engine.formats.record import encode_record
from engine.recovery.checkpoint import load_checkpoint, write_checkpoint
from engine.store import MessageStore
from engine.store_open import Dispatch, open_store
from tests.helpers import SMALL_CONFIG, TOPIC, cq_entry_of, patch, reopen, segment_of

CONFIG = SMALL_CONFIG


def written_store(root: Path, count: int) -> list:
    store = MessageStore.open(root, CONFIG)
    results = [store.put(TOPIC, b"m%03d" % i, keys=(f"k{i}",), queue_id=i % 2) for i in range(count)]
    assert all(r.ok for r in results)
    store.close()
    return results


def crash_with_undispatched(root: Path, count: int, next_offsets: dict[int, int]) -> list[int]:
    """What a SIGKILL leaves: `count` records appended by the writer (as the supervisor does,
    no dispatch in this process), the lock gone, `abort` and the recovery checkpoint in place;
    returns their commit positions."""
    opened = open_store(root, CONFIG, writer="a test", dispatch=Dispatch.CHILD_PROCESSES)
    positions = []
    try:
        for i in range(count):
            queue_id = i % 2
            record = encode_record(TOPIC, b"late-%03d" % i, queue_id=queue_id,
                                   properties={"KEYS": f"late{i}"}, born_ts_ms=int(time.time() * 1000),
                                   born_host=("127.0.0.1", 1), store_host=CONFIG.store_ip_port)
            positions.append(opened.commitlog.append(record, queue_offset=next_offsets[queue_id],
                                                     store_ts_ms=int(time.time() * 1000)))
            next_offsets[queue_id] += 1
        opened.commitlog.flush()
    finally:
        opened.commitlog.close()
        opened.lock.release()
    return positions


def test_check_after_crash_counts_undispatched_records_as_pending_not_findings(tmp_path):
    written_store(tmp_path, 6)
    late = crash_with_undispatched(tmp_path, 5, {0: 3, 1: 3})
    summary = check_summary(tmp_path)
    assert summary.findings == ()
    assert summary.pending_records == 5
    kinds = {f.kind for f in summary.pending}
    assert kinds == {FindingKind.CQ_MISSING_ENTRY, FindingKind.INDEX_KEY_MISSING}
    assert min(f.pos for f in summary.pending) == late[0]
    store = reopen(tmp_path, CONFIG)  # routine recovery puts them back
    assert store.recovery_report.cq_entries_redispatched >= 5
    store.close()
    after = check_summary(tmp_path)
    assert after.findings == () and after.pending == () and after.pending_records == 0


def test_check_missing_entries_below_the_durable_position_stay_findings(tmp_path):
    """The checkpoint says the queues hold every record before cq_durable_pos: an entry missing
    there is damage, whatever lies past the line."""
    results = written_store(tmp_path, 6)
    crash_with_undispatched(tmp_path, 3, {0: 3, 1: 3})
    path, file_pos = cq_entry_of(tmp_path, 1, 2)  # message 5, below the line: its entry zeroed
    patch(path, file_pos, bytes(CQ_ENTRY_SIZE))
    summary = check_summary(tmp_path)
    missing = [f for f in summary.findings if f.kind is FindingKind.CQ_MISSING_ENTRY]
    assert [f.pos for f in missing] == [results[5].commit_pos]
    assert summary.pending_records == 3  # the records past the line are still only pending


def test_check_pending_line_follows_each_structure_durable_position(tmp_path):
    """A checkpoint whose cq_durable_pos is past the undispatched records makes them findings:
    only what recovery re-dispatches from the recorded positions is pending."""
    written_store(tmp_path, 4)
    late = crash_with_undispatched(tmp_path, 2, {0: 2, 1: 2})
    cp = load_checkpoint(tmp_path).checkpoint
    assert cp.cq_durable_pos == late[0]  # recovery's checkpoint: the line is where they start
    write_checkpoint(tmp_path, dataclasses.replace(cp, cq_durable_pos=_log_end(tmp_path)))
    summary = check_summary(tmp_path)
    assert {f.kind for f in summary.findings} == {FindingKind.CQ_MISSING_ENTRY}
    assert {f.kind for f in summary.pending} == {FindingKind.INDEX_KEY_MISSING}
    assert summary.pending_records == 2


def test_check_pending_nothing_when_damage_below_the_flushed_position_refuses_a_start(tmp_path):
    written_store(tmp_path, 4)
    late = crash_with_undispatched(tmp_path, 3, {0: 2, 1: 2})
    cp = load_checkpoint(tmp_path).checkpoint
    write_checkpoint(tmp_path, dataclasses.replace(cp, commitlog_flushed_pos=_log_end(tmp_path)))
    path, file_pos = segment_of(tmp_path, late[1])
    patch(path, file_pos + 30, b"\xff\xff\xff\xff")  # a record the checkpoint calls flushed
    summary = check_summary(tmp_path)
    assert FindingKind.CORRUPT_RECORD in {f.kind for f in summary.findings}
    assert summary.pending_records == 0 and summary.pending == ()
    assert FindingKind.CQ_MISSING_ENTRY in {f.kind for f in summary.findings}


def test_check_clean_store_has_nothing_pending(tmp_path):
    written_store(tmp_path, 5)
    summary = check_summary(tmp_path)
    assert check(tmp_path) == [] and summary.pending_records == 0


def _log_end(root: Path) -> int:
    return check_summary(root).end_pos
