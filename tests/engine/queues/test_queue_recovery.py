"""Consume queues recovery must rebuild rather than refuse or trust: a queue whose files break
the layout (set aside, marked, rebuilt from the log, again after a crash), a torn last entry of
an idle queue (put back from near its own record), and the rebuild marks themselves. Every test
ends with `check(root) == []`, or with the refusal that changed nothing."""

from __future__ import annotations

import shutil

import pytest

from engine.check.fsck import check
from engine.errors import BadInputError, SegmentLayoutError
from engine.files.mapped_file import Access
from engine.files.naming import consume_queue_dir
from engine.formats.cq_entry import CQ_ENTRY_SIZE, encode_cq_entry
from engine.formats.record import BODY_CRC_OFFSET
from engine.message import Message
from engine.queues.table import REBUILD_MARKER_BYTES, ConsumeQueueTable, OnUnreadable
from engine.recovery.recover import RecoveryMode
from engine.store import MessageStore
from tests.engine.recovery.test_recovery import assert_holds_exactly, body, build, record_size
from tests.helpers import SMALL_CONFIG, TOPIC, cq_entry_of, die, open_refused, patch, reopen, segment_of


@pytest.mark.parametrize("damage", ["short_last_file", "missing_middle_file"])
@pytest.mark.parametrize("mode", [RecoveryMode.ROUTINE, RecoveryMode.REBUILD])
def test_consume_queue_with_a_broken_file_layout_is_set_aside_and_rebuilt(tmp_path, damage, mode):
    """A short or missing queue file used to make every open refuse, `--rebuild` included:
    the queue is now moved to quarantine/ whole and rebuilt from the commitlog."""
    build(tmp_path, 50, crash=False)  # 25 entries a queue: files of 10
    files = sorted(consume_queue_dir(tmp_path, TOPIC, 0).iterdir())
    if damage == "short_last_file":
        with open(files[-1], "r+b") as f:
            f.truncate(100)
    else:
        files[1].unlink()
    kept = {path.name: path.read_bytes() for path in files if path.exists()}
    store = MessageStore.open(tmp_path, SMALL_CONFIG, recovery=mode)
    if mode is RecoveryMode.ROUTINE:  # a rebuild rebuilds every queue
        assert store.recovery_report.queues_rebuilt == [f"{TOPIC}/0"]
    assert_holds_exactly(store, 50)
    assert store.put(TOPIC, b"next", queue_id=0).queue_offset == 25
    store.close()
    assert check(tmp_path) == []
    (aside,) = (tmp_path / "quarantine").glob(f"consumequeue-{TOPIC}-0.*")
    assert {path.name: path.read_bytes() for path in aside.iterdir()} == kept  # byte for byte
    assert not list((tmp_path / "consumequeue" / TOPIC).glob("*.rebuild"))


@pytest.mark.parametrize("left", ["nothing", "part_of_the_rebuild"])
def test_a_crash_while_a_set_aside_queue_is_rebuilt_rebuilds_it_again(tmp_path, left):
    """Set aside, the queue is marked first (<queueId>.rebuild): a recovery that dies before its
    checkpoint leaves the mark, and the next one rebuilds the queue whole, whatever it finds."""
    build(tmp_path, 50, crash=False)
    queue_dir = consume_queue_dir(tmp_path, TOPIC, 0)
    shutil.rmtree(queue_dir)  # as the set-aside left it; the mark is what says so
    if left == "part_of_the_rebuild":
        queue_dir.mkdir()
        (queue_dir / "00000000000000000000").write_bytes(
            b"".join(encode_cq_entry(i, 10, 0) for i in range(3)) + bytes(7 * CQ_ENTRY_SIZE))
    (queue_dir.parent / "0.rebuild").write_bytes(REBUILD_MARKER_BYTES)
    store = reopen(tmp_path)
    assert store.recovery_report.queues_rebuilt == [f"{TOPIC}/0"]
    assert_holds_exactly(store, 50)
    store.close()
    assert check(tmp_path) == [] and not (queue_dir.parent / "0.rebuild").exists()


def test_an_unreadable_queue_over_old_damage_refuses_before_anything_moves(tmp_path):
    """Rebuilding a queue re-dispatches the whole log: damage anywhere below the line is seen
    before the queue is set aside, and the start is refused with every file as it was."""
    results = build(tmp_path, 50, crash=False)
    path, file_pos = segment_of(tmp_path, results[3].commit_pos)
    patch(path, file_pos + BODY_CRC_OFFSET, bytes(4))  # an old record, far below the scan start
    sorted(consume_queue_dir(tmp_path, TOPIC, 1).iterdir())[1].unlink()
    open_refused(tmp_path)
    assert not (tmp_path / "quarantine").exists()


@pytest.mark.parametrize("torn", ["size", "commit_pos"])
def test_a_torn_last_entry_of_an_idle_queue_is_put_back_from_near_its_record(tmp_path, torn):
    """A torn entry whose commit position survived points at its own record: re-dispatch starts
    there, not at the queue's previous message far back in the log. Without it, it starts just
    past that message's record (correct, and longer)."""
    store = MessageStore.open(tmp_path, SMALL_CONFIG)
    first = store.put(TOPIC, b"idle-0", queue_id=0)
    store.put_batch([Message(TOPIC, body(i), queue_id=1) for i in range(300)])
    store.put(TOPIC, b"idle-1", queue_id=0)
    store.checkpoint()  # everything durable: a crash's scan starts at the last records
    die(store)
    path, file_pos = cq_entry_of(tmp_path, 0, 1)
    patch(path, file_pos + (8 if torn == "size" else 0), bytes(4) if torn == "size" else b"\x80")
    store = reopen(tmp_path)
    report = store.recovery_report
    assert report.queues_cut == [f"{TOPIC}/0"]
    if torn == "size":
        assert report.records_scanned <= 2  # the last record of queue 1, then its own
    else:
        assert report.scan_start_pos == first.commit_pos + record_size(tmp_path, first.commit_pos)
    assert [m.body for m in store.get_messages(TOPIC, 0, 0, 10).messages] == [b"idle-0", b"idle-1"]
    store.close()
    assert check(tmp_path) == []


def test_a_salvage_refuses_an_unreadable_queue(tmp_path):
    """A salvage reads each queue's old tail to keep the offsets damage hides: it cannot for an
    unreadable queue, so it refuses rather than give such an offset out again."""
    build(tmp_path, 50, crash=False)
    sorted(consume_queue_dir(tmp_path, TOPIC, 1).iterdir())[1].unlink()
    with pytest.raises(SegmentLayoutError, match="gap in segments"):
        MessageStore.open(tmp_path, SMALL_CONFIG, recovery=RecoveryMode.SALVAGE)


def test_a_reader_still_gets_the_layout_error_and_changes_nothing(tmp_path):
    build(tmp_path, 50, crash=False)
    files = sorted(consume_queue_dir(tmp_path, TOPIC, 0).iterdir())
    files[1].unlink()
    before = sorted(path.relative_to(tmp_path) for path in tmp_path.rglob("*"))
    with pytest.raises(SegmentLayoutError, match="gap in segments"):
        ConsumeQueueTable.load(tmp_path, SMALL_CONFIG.consume_queue_entries, Access.READ_ONLY)
    skipped = ConsumeQueueTable.load(tmp_path, SMALL_CONFIG.consume_queue_entries, Access.READ_ONLY,
                                     on_unreadable=OnUnreadable.SKIP)
    assert skipped.skipped == [(TOPIC, 0)] and [q.queue_id for q in skipped] == [1]
    skipped.close()
    with pytest.raises(BadInputError, match="only a writer"):
        ConsumeQueueTable.load(tmp_path, SMALL_CONFIG.consume_queue_entries, Access.READ_ONLY,
                               on_unreadable=OnUnreadable.SET_ASIDE)
    assert sorted(path.relative_to(tmp_path) for path in tmp_path.rglob("*")) == before


def test_a_users_file_named_like_a_rebuild_mark_is_foreign_not_a_mark(tmp_path):
    build(tmp_path, 20, crash=False)
    user_file = consume_queue_dir(tmp_path, TOPIC, 0).parent / "0.rebuild"
    user_file.write_bytes(b"notes")
    with MessageStore.open(tmp_path, SMALL_CONFIG) as store:
        assert store.recovery_report.queues_rebuilt == [] and store.max_offset(TOPIC, 0) == 10
    assert user_file.read_bytes() == b"notes"
    assert [f.detail for f in check(tmp_path)] == ["not a queue-id directory"]


def test_a_salvage_takes_the_marks_of_a_rebuild_that_stopped(tmp_path):
    """A salvage rebuilds every queue: a mark left by a routine recovery that died goes too."""
    results = build(tmp_path, 20, crash=False)
    path, file_pos = segment_of(tmp_path, results[5].commit_pos)
    patch(path, file_pos + BODY_CRC_OFFSET, bytes(4))  # damage a salvage accepts
    mark = consume_queue_dir(tmp_path, TOPIC, 0).parent / "0.rebuild"
    mark.write_bytes(REBUILD_MARKER_BYTES)
    assert "a recovery stopped while it rebuilt this queue" in str(check(tmp_path))
    with MessageStore.open(tmp_path, SMALL_CONFIG, recovery=RecoveryMode.SALVAGE) as store:
        assert store.max_offset(TOPIC, 0) == 10 and store.max_offset(TOPIC, 1) == 10
    assert not mark.exists() and check(tmp_path) == []
