"""The operator's second answer to damage below the durable line (issue 19, item 2): a salvage
(RecoveryMode.SALVAGE, `mqstore recover --salvage`) keeps every valid record in place, accepts
the damaged span (quarantine/accepted-damage.json, its bytes copied to quarantine/), and the
store then opens, serves every other record, reports the damaged one as skipped, and checks
clean (the span is listed as accepted damage, not as a finding).
"""

from __future__ import annotations

import dataclasses
import json
import stat

import pytest

from engine.check.findings import FindingKind
from engine.check.fsck import check, check_summary
from engine.errors import BadInputError, CorruptRecordError
from engine.files.mapped_file import Access
from engine.files.naming import LOCK_FILE
from engine.formats.cq_entry import encode_cq_entry
from engine.formats.record import MAGIC_OFFSET, QUEUE_ID_OFFSET, TOTAL_SIZE_OFFSET
from engine.log.commitlog import CommitLog
from engine.message import Message
from engine.recovery.accepted_damage import ScanPastAccepted, ScanUnit, load_accepted
from engine.recovery.checkpoint import load_checkpoint, write_checkpoint
from engine.recovery.recover import RecoveryMode
from engine.status import GetStatus
from engine.store import MessageStore
from tests.engine.recovery.test_durable_line import body, crashed_store, flip_body, lag_derived_positions
from tests.helpers import (
    SMALL_CONFIG,
    TOPIC,
    cq_entry_of,
    die,
    log_bytes,
    open_refused,
    patch,
    read,
    rebuild,
    reopen,
    scan_start_after_index_trim,
    segment_of,
    snapshot,
)

COUNT, LINE_AFTER, VICTIM = 60, 50, 30


def salvage(root) -> MessageStore:
    return MessageStore.open(root, SMALL_CONFIG, recovery=RecoveryMode.SALVAGE)


def read_queue(store: MessageStore, queue_id: int) -> tuple[list[bytes], list]:
    """Every body of a queue from min to max offset, and the records reads skipped."""
    bodies, skipped = [], []
    offset = store.min_offset(TOPIC, queue_id)
    while offset < store.max_offset(TOPIC, queue_id):
        result = store.get_messages(TOPIC, queue_id, offset, 8)
        assert result.status in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE), (offset, result.status)
        assert result.next_offset > offset
        bodies += [m.body for m in result.messages]
        skipped += result.skipped
        offset = result.next_offset
    return bodies, skipped


def damaged_crash(root, damage) -> tuple[list, int]:
    """A crashed store whose record VICTIM (below the line) is damaged by `damage(root, pos)`;
    start refuses it. Returns the put results and the log's bytes before the salvage."""
    results = crashed_store(root, COUNT, checkpoint_after=LINE_AFTER)
    lag_derived_positions(root, results[20].commit_pos)
    damage(root, results[VICTIM].commit_pos)
    assert open_refused(root).commit_pos == results[VICTIM].commit_pos
    return results, log_bytes(root).rstrip(b"\0")


def break_magic(root, commit_pos: int) -> None:
    """The record's header is unreadable: no record can be identified there."""
    path, file_pos = segment_of(root, commit_pos)
    patch(path, file_pos + MAGIC_OFFSET, b"\xde\xad\xbe\xef")


def break_three(root, commit_pos: int) -> None:
    """break_magic on the record at commit_pos and the two after it."""
    for _ in range(3):
        path, file_pos = segment_of(root, commit_pos)
        size = int.from_bytes(read(path, file_pos + TOTAL_SIZE_OFFSET, 4), "big")
        break_magic(root, commit_pos)
        commit_pos += size


def others(queue_id: int) -> list[bytes]:
    return [body(i) for i in range(COUNT) if i % 2 == queue_id and i != VICTIM]


def test_salvage_keeps_every_record_after_a_flipped_byte_in_place(tmp_path):
    results, before = damaged_crash(tmp_path, flip_body)
    pos, end = results[VICTIM].commit_pos, results[VICTIM + 1].commit_pos
    with salvage(tmp_path) as store:
        report = store.recovery_report
        assert report.mode == "salvage" and report.cut_pos == len(before)
        assert [(d["start_pos"], d["end_pos"]) for d in report.damage_accepted] == [(pos, end)]
        assert log_bytes(tmp_path).rstrip(b"\0") == before  # nothing moved, nothing cut
        bodies, skipped = read_queue(store, 0)
        assert bodies == others(0)
        assert [(s.commit_pos, s.queue_id, s.queue_offset) for s in skipped] == [(pos, 0, VICTIM // 2)]
        assert [m.body for m in store.query_by_key(TOPIC, f"k{VICTIM + 2}")] == [body(VICTIM + 2)]
        assert read_queue(store, 1) == (others(1), [])
    damage_file = tmp_path / "quarantine" / "accepted-damage.json"
    spans = json.loads(damage_file.read_text())
    assert [(s["start_pos"], s["end_pos"]) for s in spans] == [(pos, end)] and "CRC" in spans[0]["reason"]
    assert stat.S_IMODE(damage_file.stat().st_mode) == 0o600
    with open(spans[0]["copy_path"], "rb") as fh:
        assert fh.read() == before[pos:end]
    assert check(tmp_path) == []
    accepted = check_summary(tmp_path).accepted
    assert [(f.kind, f.pos) for f in accepted] == [(FindingKind.ACCEPTED_DAMAGE, pos)]


def test_after_a_salvage_routine_recovery_scans_past_the_accepted_span(tmp_path):
    """A later crash whose scan starts before the span: the durable-line check and the scan
    pass over it, re-dispatch keeps the damaged record's entry, nothing is cut."""
    results, _ = damaged_crash(tmp_path, flip_body)
    salvage(tmp_path).close()
    store = reopen(tmp_path)
    assert store.put(TOPIC, b"after", queue_id=0).ok
    end_pos = store.commitlog.written_pos
    die(store)
    lag_derived_positions(tmp_path, results[20].commit_pos)
    scan_start = scan_start_after_index_trim(tmp_path, load_checkpoint(tmp_path).checkpoint)
    assert scan_start <= results[20].commit_pos
    with reopen(tmp_path) as store:
        report = store.recovery_report
        assert (report.mode, report.scan_start_pos, report.cut_pos) == ("routine", scan_start, end_pos)
        assert report.quarantine_path is None
        bodies, skipped = read_queue(store, 0)
        assert bodies == [*others(0), b"after"] and len(skipped) == 1
    assert check(tmp_path) == []


def test_an_unreadable_header_gets_a_placeholder_entry_readers_skip(tmp_path):
    """The damaged record cannot be identified; the next record of its queue shows the offset
    it held, which gets an entry pointing at the damaged span."""
    results, before = damaged_crash(tmp_path, break_magic)
    pos = results[VICTIM].commit_pos
    with salvage(tmp_path) as store:
        assert store.recovery_report.placeholder_entries == 1
        assert log_bytes(tmp_path).rstrip(b"\0") == before
        bodies, skipped = read_queue(store, 0)
        assert bodies == others(0)
        assert [(s.commit_pos, s.queue_offset) for s in skipped] == [(pos, VICTIM // 2)]
        assert read_queue(store, 1) == (others(1), [])
    assert check(tmp_path) == []
    with reopen(tmp_path) as store:
        assert read_queue(store, 0)[0] == others(0)
    assert check(tmp_path) == []


def test_new_damage_after_a_salvage_is_still_refused(tmp_path):
    """Another crash whose scan starts before the accepted span: it passes over the span and
    refuses the new damage past it."""
    results, _ = damaged_crash(tmp_path, flip_body)
    salvage(tmp_path).close()
    store = reopen(tmp_path)
    assert store.put(TOPIC, b"after", queue_id=0).ok
    die(store)
    lag_derived_positions(tmp_path, results[20].commit_pos)
    flip_body(tmp_path, results[40].commit_pos)
    assert open_refused(tmp_path).commit_pos == results[40].commit_pos
    assert [f.pos for f in check(tmp_path)] == [results[40].commit_pos]


def test_salvage_of_a_store_without_damage_changes_nothing(tmp_path):
    crashed_store(tmp_path, COUNT, checkpoint_after=LINE_AFTER)
    before = {k: v for k, v in snapshot(tmp_path).items() if k != LOCK_FILE}
    with pytest.raises(BadInputError, match="nothing to salvage"):
        salvage(tmp_path)
    assert {k: v for k, v in snapshot(tmp_path).items() if k != LOCK_FILE} == before


def test_rebuild_after_a_salvage_cuts_at_the_accepted_damage_and_forgets_it(tmp_path):
    results, _ = damaged_crash(tmp_path, flip_body)
    salvage(tmp_path).close()
    with rebuild(tmp_path) as store:
        assert store.recovery_report.cut_pos == results[VICTIM].commit_pos
    assert json.loads((tmp_path / "quarantine" / "accepted-damage.json").read_text()) == []
    assert check(tmp_path) == [] and check_summary(tmp_path).accepted == ()


def test_an_unreadable_accepted_damage_file_refuses_the_start(tmp_path):
    damaged_crash(tmp_path, flip_body)
    salvage(tmp_path).close()
    (tmp_path / "quarantine" / "accepted-damage.json").write_text("{not json")
    with pytest.raises(Exception, match="accepted damage record unreadable"):
        MessageStore.open(tmp_path, SMALL_CONFIG).close()
    assert [f.kind for f in check(tmp_path)][:1] == [FindingKind.LAYOUT]


def test_messages_of_other_topics_around_the_damage_keep_their_offsets(tmp_path):
    results, _ = damaged_crash(tmp_path, flip_body)
    with salvage(tmp_path) as store:
        for i in (VICTIM - 2, VICTIM + 2):
            offset = i // 2
            got = store.get_messages(TOPIC, 0, offset, 1)
            assert got.messages[0].body == body(i)
            assert got.messages[0].commit_pos == results[i].commit_pos
        assert store.put_batch([Message(TOPIC, b"x", queue_id=0)])[0].queue_offset == COUNT // 2


def test_one_span_hiding_several_records_of_a_queue_gets_a_placeholder_for_each(tmp_path):
    """Three records in a row with unreadable headers are one damaged span: queue 0 loses two
    offsets to it, queue 1 one; each offset gets an entry pointing at the span's start."""
    results, _ = damaged_crash(tmp_path, break_three)
    pos = results[VICTIM].commit_pos
    with salvage(tmp_path) as store:
        assert store.recovery_report.placeholder_entries == 3
        lost = range(VICTIM, VICTIM + 3)
        bodies, skipped = read_queue(store, 0)
        assert bodies == [body(i) for i in range(COUNT) if i % 2 == 0 and i not in lost]
        assert [(s.commit_pos, s.queue_offset) for s in skipped] == \
            [(pos, VICTIM // 2), (pos, VICTIM // 2 + 1)]
        bodies, skipped = read_queue(store, 1)
        assert bodies == [body(i) for i in range(COUNT) if i % 2 == 1 and i not in lost]
        assert [(s.commit_pos, s.queue_offset) for s in skipped] == [(pos, VICTIM // 2)]
    assert check(tmp_path) == []


def test_a_queue_rebuilt_by_routine_recovery_keeps_its_placeholder_past_the_span(tmp_path):
    """After a salvage, a later crash finds an entry of queue 0 that names another record: the
    queue is rebuilt from the log, across the accepted span (unreadable header) and past it."""
    results, _ = damaged_crash(tmp_path, break_magic)
    salvage(tmp_path).close()
    store = reopen(tmp_path)
    end_pos = store.commitlog.written_pos
    die(store)
    cp = load_checkpoint(tmp_path).checkpoint  # queues durable to the end, the index lags
    write_checkpoint(tmp_path, dataclasses.replace(cp, index_durable_pos=tuple(
        results[20].commit_pos for _ in cp.index_durable_pos)))
    wrong = results[VICTIM + 6]
    patch(*cq_entry_of(tmp_path, 0, (VICTIM + 4) // 2),
          encode_cq_entry(wrong.commit_pos, results[VICTIM + 7].commit_pos - wrong.commit_pos, 0))
    with reopen(tmp_path) as store:
        assert (store.recovery_report.queues_rebuilt, store.recovery_report.cut_pos) == \
            ([f"{TOPIC}/0"], end_pos)
        bodies, skipped = read_queue(store, 0)
        assert bodies == others(0)
        assert [(s.commit_pos, s.queue_offset) for s in skipped] == \
            [(results[VICTIM].commit_pos, VICTIM // 2)]
    assert check(tmp_path) == []


def test_an_unreadable_last_record_of_a_queue_keeps_its_offset(tmp_path):
    """No later record of queue 0 shows the offset the damaged record held; the entry the queue
    had for it does, so the next message of queue 0 does not reuse that offset."""
    store = MessageStore.open(tmp_path, SMALL_CONFIG)
    results = store.put_batch([Message(TOPIC, body(i), queue_id=0) for i in range(20)])
    results += store.put_batch([Message(TOPIC, body(i), queue_id=1) for i in range(20, 40)])
    assert all(r.ok for r in results)
    store.checkpoint()
    die(store)
    lag_derived_positions(tmp_path, results[10].commit_pos)
    break_magic(tmp_path, results[19].commit_pos)
    assert open_refused(tmp_path).commit_pos == results[19].commit_pos
    with salvage(tmp_path) as store:
        assert store.recovery_report.placeholder_entries == 1
        bodies, skipped = read_queue(store, 0)
        assert bodies == [body(i) for i in range(19)]
        assert [(s.commit_pos, s.queue_offset) for s in skipped] == [(results[19].commit_pos, 19)]
        assert store.put(TOPIC, b"next", queue_id=0).queue_offset == 20
        assert read_queue(store, 1) == ([body(i) for i in range(20, 40)], [])
    assert check(tmp_path) == []


def flip_two(root, commit_pos: int) -> None:
    """flip_body on the record at commit_pos and the one after it (one damaged span)."""
    path, file_pos = segment_of(root, commit_pos)
    flip_body(root, commit_pos)
    flip_body(root, commit_pos + int.from_bytes(read(path, file_pos + TOTAL_SIZE_OFFSET, 4), "big"))


def flip_then_break(root, commit_pos: int) -> None:
    """flip_body on the record at commit_pos, break_magic on the one after it."""
    path, file_pos = segment_of(root, commit_pos)
    flip_body(root, commit_pos)
    break_magic(root, commit_pos + int.from_bytes(read(path, file_pos + TOTAL_SIZE_OFFSET, 4), "big"))


def test_every_record_of_a_span_that_still_decodes_keeps_its_own_entry(tmp_path):
    results, _ = damaged_crash(tmp_path, flip_two)
    with salvage(tmp_path) as store:
        [span] = store.recovery_report.damage_accepted
        assert (span["start_pos"], span["end_pos"]) == \
            (results[VICTIM].commit_pos, results[VICTIM + 2].commit_pos)
        assert store.recovery_report.placeholder_entries == 0
        for queue_id in (0, 1):
            bodies, skipped = read_queue(store, queue_id)
            victim = VICTIM + queue_id
            assert bodies == [body(i) for i in range(COUNT) if i % 2 == queue_id and i != victim]
            assert [(s.commit_pos, s.queue_offset) for s in skipped] == \
                [(results[victim].commit_pos, victim // 2)]
    assert check(tmp_path) == []


def test_a_placeholder_points_at_the_first_unreadable_position_of_its_span(tmp_path):
    """A sound frame at the span's start belongs to another queue: the placeholder points past
    it, where no record frame is, so no reader takes that record for the hidden one."""
    results, _ = damaged_crash(tmp_path, flip_then_break)
    hidden = results[VICTIM + 1]
    with salvage(tmp_path) as store:
        assert store.recovery_report.placeholder_entries == 1
        assert store.queues.get(TOPIC, 1).entry(hidden.queue_offset).commit_pos == hidden.commit_pos
        bodies, skipped = read_queue(store, 1)
        assert bodies == [body(i) for i in range(COUNT) if i % 2 == 1 and i != VICTIM + 1]
        assert [(s.commit_pos, s.queue_offset) for s in skipped] == [(hidden.commit_pos, hidden.queue_offset)]
        assert read_queue(store, 0)[0] == others(0)
    assert check(tmp_path) == []


def test_a_hole_past_the_durable_line_is_cut_as_the_tail_not_accepted(tmp_path):
    """A power loss may tear pages out of order past the line, leaving records after a hole: a
    salvage accepts only damage below the line, and the hole is where the log is cut (it once
    accepted the hole too, and the queues' offsets behind it could not be rebuilt)."""
    results, _ = damaged_crash(tmp_path, flip_body)
    hole = results[LINE_AFTER + 3].commit_pos
    path, file_pos = segment_of(tmp_path, hole)
    patch(path, file_pos, bytes(results[LINE_AFTER + 4].commit_pos - hole))  # records after it stay
    pos = results[VICTIM].commit_pos
    with salvage(tmp_path) as store:
        report = store.recovery_report
        assert [d["start_pos"] for d in report.damage_accepted] == [pos]
        assert report.cut_pos == hole and report.durable_pos <= hole
        assert store.commitlog.written_pos == hole
    assert check(tmp_path) == []


def test_a_damaged_record_whose_queue_id_is_wrong_makes_no_queue(tmp_path):
    """The damage may lie in the queue id: a salvage keeps entries in existing queues only (it
    once made consume-queue directories for queue ids the store never had)."""
    def wrong_queue(root, commit_pos: int) -> None:
        path, file_pos = segment_of(root, commit_pos)
        patch(path, file_pos + QUEUE_ID_OFFSET, (0x00DD0001).to_bytes(4, "big"))

    damaged_crash(tmp_path, wrong_queue)
    with salvage(tmp_path):
        pass
    assert sorted(p.name for p in (tmp_path / "consumequeue" / TOPIC).iterdir()) == ["0", "1"]
    with reopen(tmp_path):  # a start accepts the store (no queue beyond queue_count)
        pass
    assert check(tmp_path) == []


def test_a_record_scan_past_accepted_damage_yields_every_other_record(tmp_path):
    """ScanPastAccepted by record (the torture's ledger check and byte flips walk this way)
    goes on after the accepted span and hears of it once; the span's record is not yielded."""
    results, before = damaged_crash(tmp_path, flip_body)
    salvage(tmp_path).close()
    log = CommitLog.open(tmp_path, SMALL_CONFIG.commitlog_file_size, Access.READ_ONLY)
    try:
        heard = []
        scan = ScanPastAccepted(log, log.min_pos, load_accepted(tmp_path), unit=ScanUnit.RECORDS,
                                on_span=heard.append)
        positions = []
        with pytest.raises(CorruptRecordError, match="unwritten"):  # past the last record
            for record in scan:
                positions.append(record.commit_pos)
    finally:
        log.close()
    assert positions == [r.commit_pos for i, r in enumerate(results) if i != VICTIM]
    assert [s.start_pos for s in heard] == [results[VICTIM].commit_pos]
    assert scan.pos == len(before)  # where the written records end
