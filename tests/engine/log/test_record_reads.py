"""One bad record does not block its neighbours (issue 19, item 6), in one process:
MessageStore.get_messages and query_by_key deliver the good records around a corrupt one,
report it with its positions (result.skipped, a WARNING) and move the next offset past it.

The bytes are changed on disk while the store is open (its mappings are shared, so it reads
them at once) and put back before it closes: recovery, which cuts a log at its first bad record,
is another story (tests/engine/recovery/test_recovery.py).
"""

from __future__ import annotations

import logging

import pytest

from engine.check.fsck import check
from engine.formats.record import BODY_OFFSET
from engine.status import GetStatus, SkippedRecord
from engine.store import MessageStore
from tests.helpers import TOPIC, patch, read, segment_of

KEY = "shared"
COUNT = 6
BAD = 2  # the queue offset of the damaged record


def damage(root, commit_pos: int, file_delta: int, data: bytes) -> bytes:
    """Write `data` at `file_delta` bytes into the record at `commit_pos`; returns the old bytes."""
    path, file_pos = segment_of(root, commit_pos)
    old = read(path, file_pos + file_delta, len(data))
    patch(path, file_pos + file_delta, data)
    return old


DAMAGES = {  # (bytes into the record, new bytes, the reason reported)
    "a flipped body byte": (BODY_OFFSET + 1, b"\xff", "BODYCRC mismatch"),
    "a torn header": (4, b"\x00\x00\x00\x00", "unknown magic"),
}


@pytest.mark.parametrize("what", DAMAGES)
def test_get_messages_delivers_the_records_around_a_corrupt_one(tmp_path, small_config, caplog, what):
    delta, data, reason = DAMAGES[what]
    with MessageStore.open(tmp_path, small_config) as store:
        puts = [store.put(TOPIC, b"body-%d" % i, keys=(KEY, f"k{i}")) for i in range(COUNT)]
        bad_pos = puts[BAD].commit_pos
        old = damage(tmp_path, bad_pos, delta, data)
        with caplog.at_level(logging.WARNING, logger="engine.log.record_reads"):
            result = store.get_messages(TOPIC, 0, 0)
        assert result.status is GetStatus.FOUND and result.next_offset == COUNT
        assert [r.queue_offset for r in result.messages] == [0, 1, 3, 4, 5]
        assert len(result.skipped) == 1
        skipped = result.skipped[0]
        assert (skipped.commit_pos, skipped.topic, skipped.queue_id, skipped.queue_offset) == \
            (bad_pos, TOPIC, 0, BAD)
        assert skipped.reason.startswith(reason)
        assert f"commit position {bad_pos}" in caplog.text and f"{TOPIC}/0 offset {BAD}" in caplog.text

        alone = store.get_messages(TOPIC, 0, BAD, 1)  # a batch of only the bad one moves past it
        assert (alone.status, alone.messages, alone.next_offset) == \
            (GetStatus.NO_MATCHED_MESSAGE, [], BAD + 1)
        assert [s.commit_pos for s in alone.skipped] == [bad_pos]

        assert [r.queue_offset for r in store.query_by_key(TOPIC, KEY)] == [0, 1, 3, 4, 5]
        assert store.query_by_key(TOPIC, f"k{BAD}") == []
        damage(tmp_path, bad_pos, delta, old)
        assert [r.queue_offset for r in store.query_by_key(TOPIC, KEY)] == list(range(COUNT))
    assert check(tmp_path) == []


def test_a_record_of_another_queue_is_still_a_consume_queue_fault(tmp_path, small_config):
    """A sound record that is not the one its entry names: the consume queue is wrong (recovery
    rebuilds it), so the read raises rather than hand out another queue's message."""
    from engine.errors import CorruptConsumeQueueError
    from engine.formats.cq_entry import CQ_ENTRY
    from tests.helpers import cq_entry_of

    with MessageStore.open(tmp_path, small_config) as store:
        mine = [store.put(TOPIC, b"mine-%d" % i) for i in range(3)]
        other = store.put(TOPIC, b"theirs", queue_id=1)
        path, file_pos = cq_entry_of(tmp_path, 0, 1)
        old = read(path, file_pos, CQ_ENTRY.size)
        patch(path, file_pos, CQ_ENTRY.pack(other.commit_pos, CQ_ENTRY.unpack(old)[1], 0))
        with pytest.raises(CorruptConsumeQueueError) as info:
            store.get_messages(TOPIC, 0, 0)
        assert info.value.queue_offset == 1
        patch(path, file_pos, old)
        assert [r.commit_pos for r in store.get_messages(TOPIC, 0, 0).messages] == \
            [p.commit_pos for p in mine]
    assert check(tmp_path) == []


def test_skipped_record_fields_default_to_an_unknown_queue():
    assert SkippedRecord(7, "BODYCRC mismatch") == SkippedRecord(7, "BODYCRC mismatch", None, None, None)
