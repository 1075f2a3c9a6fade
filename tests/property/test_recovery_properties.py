"""Recovery invariants over generated stores (style anchors F.1).

1. Torn tail: for any sequence of records and ANY truncation point k at or past the last
   checkpoint (every commitlog byte from k on zeroed, `abort` left by the crash), recovery keeps
   exactly the longest prefix of whole records: queue offsets contiguous, every kept message
   readable and found by key, nothing at or past k served.
2. Bit flip: any single-byte change in one of the last records is detected: the store comes back
   as the prefix before the changed record and never serves a changed record (routine recovery
   past the checkpoint; below it a routine open refuses and a rebuild cuts).

The stores are crash states: the writer dies (`die`) after an optional checkpoint, so the bytes
past that checkpoint are exactly what a crash may lose. Truncating below the checkpoint would
remove data the store already declared durable (not a crash state; `check` and a rebuild
recovery handle that), so k is drawn from [checkpoint position, end].
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.check.fsck import check
from engine.formats.record import FILLER_SIZE
from engine.message import Message
from engine.store import MessageStore
from tests.helpers import (
    SEGMENT_BYTES,
    SMALL_CONFIG,
    TOPIC,
    die,
    log_bytes,
    open_refused,
    patch,
    quarantined,
    read,
    rebuild,
    reopen,
    segment_of,
    zero_log_from,
)

QUEUES = 3
records_st = st.lists(st.tuples(st.integers(0, QUEUES - 1), st.binary(min_size=0, max_size=400)),
                      min_size=1, max_size=24)
PROPERTY_SETTINGS = settings(max_examples=20, deadline=None)


def written(root: Path, records, checkpoint_after: int, *, crash: bool = True):
    """Put `records` (checkpoint after the first `checkpoint_after`), then die or close.
    Returns [(queue_id, body, commit_pos, end_pos, key)] and the checkpoint's position."""
    store = MessageStore.open(root, SMALL_CONFIG)
    messages = [Message(TOPIC, b, keys=(f"key{i}",), queue_id=q) for i, (q, b) in enumerate(records)]
    results = store.put_batch(messages[:checkpoint_after])
    cp_pos = store.checkpoint().cq_durable_pos if checkpoint_after else 0
    results += store.put_batch(messages[checkpoint_after:])
    assert all(r.ok for r in results)
    out = [(q, b, r.commit_pos, store.read_at(r.commit_pos).end_pos, f"key{i}")
           for i, ((q, b), r) in enumerate(zip(records, results, strict=True))]
    if crash:
        die(store)
    else:
        store.close()
    return out, cp_pos


def assert_exactly(store: MessageStore, kept, dropped) -> None:
    for queue_id in range(QUEUES):
        want = [(pos, b) for q, b, pos, _, _ in kept if q == queue_id]
        assert store.min_offset(TOPIC, queue_id) == 0
        assert store.max_offset(TOPIC, queue_id) == len(want)
        got = store.get_messages(TOPIC, queue_id, 0, 64).messages if want else []
        assert [(m.commit_pos, m.body) for m in got] == want
        assert [m.queue_offset for m in got] == list(range(len(want)))
    for _, b, pos, _, key in kept:
        assert [(m.commit_pos, m.body) for m in store.query_by_key(TOPIC, key)] == [(pos, b)]
    for *_, key in dropped:
        assert store.query_by_key(TOPIC, key) == []


@PROPERTY_SETTINGS
@given(records=records_st, data=st.data())
def test_any_torn_tail_recovers_the_longest_prefix_of_whole_records(records, data):
    checkpoint_after = data.draw(st.integers(0, len(records) - 1), label="checkpoint_after")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        msgs, cp_pos = written(root, records, checkpoint_after)
        end = msgs[-1][3]
        k = data.draw(st.integers(cp_pos, end), label="k")
        zero_log_from(root, k)
        kept = [m for m in msgs if m[3] <= k]
        dropped = msgs[len(kept):]
        kept_end = kept[-1][3] if kept else 0
        store = reopen(root)
        try:
            assert store.recovery_report.shutdown == "crash"
            pos = store.commitlog.written_pos
            at_filler = pos % SEGMENT_BYTES == 0 and 0 < pos - kept_end < SEGMENT_BYTES \
                and k >= kept_end + FILLER_SIZE  # the record was last in its segment
            assert pos == kept_end or at_filler, (pos, kept_end, k)
            assert pos <= k or at_filler
            assert_exactly(store, kept, dropped)
        finally:
            store.close()
        assert check(root) == []


@PROPERTY_SETTINGS
@given(records=records_st, data=st.data())
def test_any_single_byte_change_in_the_last_records_is_detected(records, data):
    victim = data.draw(st.integers(max(0, len(records) - 3), len(records) - 1), label="victim")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        msgs, _ = written(root, records, 0)
        _, _, pos, end, _ = msgs[victim]
        at = data.draw(st.integers(pos, end - 1), label="byte")
        flip = data.draw(st.integers(1, 255), label="xor")
        path, file_pos = segment_of(root, at)
        patch(path, file_pos, bytes([read(path, file_pos, 1)[0] ^ flip]))
        removed = log_bytes(root)[pos:].rstrip(b"\0")
        store = reopen(root)
        try:
            assert store.commitlog.written_pos == pos
            assert quarantined(root) == [removed]
            assert_exactly(store, msgs[:victim], msgs[victim:])
        finally:
            store.close()
        assert check(root) == []


@PROPERTY_SETTINGS
@given(records=records_st, data=st.data())
def test_single_byte_change_in_the_last_record_after_a_clean_stop_is_detected(records, data):
    """Even when the checkpoint calls everything durable, recovery re-verifies the last record
    (RocketMQ testRecover phase 2): the change is below the durable line, so a routine open
    refuses and names it, changing nothing, and the operator's rebuild cuts it."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        msgs, _ = written(root, records, 0, crash=False)
        _, _, pos, end, _ = msgs[-1]
        at = data.draw(st.integers(pos, end - 1), label="byte")
        path, file_pos = segment_of(root, at)
        patch(path, file_pos, bytes([read(path, file_pos, 1)[0] ^ data.draw(st.integers(1, 255))]))
        assert open_refused(root).commit_pos == pos
        store = rebuild(root)
        try:
            assert store.recovery_report.shutdown == "clean"
            assert store.commitlog.written_pos == pos
            assert_exactly(store, msgs[:-1], msgs[-1:])
        finally:
            store.close()
        assert check(root) == []
