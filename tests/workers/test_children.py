"""Dispatcher and index builders under load: SIGKILL, restart from the durable position."""

from __future__ import annotations

import os
import signal

import pytest

from engine.files.naming import consume_queue_dir, offset_to_name
from engine.formats.cq_entry import CQ_ENTRY_SIZE, encode_cq_entry
from engine.store import MessageStore
from ipc.consumer import Consumer
from ipc.control_block import Role
from ipc.producer import Producer
from tests.workers.store_harness import (
    PRODUCER_SCRIPT,
    assert_check_clean,
    read_acks,
    spawn_python,
    start_store,
    wait_for,
)
from tools.torture.faults import flip_byte

pytestmark = pytest.mark.slow


def test_sigkill_dispatcher_and_index_builder_under_load(tmp_path):
    store = start_store(tmp_path / "store")
    producers = [spawn_python(PRODUCER_SCRIPT, str(store.root), f"p{i}", "1500", "8", "T1")
                 for i in range(3)]
    wait_for(lambda: store.positions().dispatched_pos > 40_000, "dispatch under load")
    dispatcher = store.child_pid(Role.DISPATCHER)
    builder = store.child_pid(Role.INDEX_BUILDER, 1)
    os.kill(dispatcher, signal.SIGKILL)
    os.kill(builder, signal.SIGKILL)
    new_dispatcher = store.wait_child_replaced(Role.DISPATCHER, dispatcher)
    store.wait_child_replaced(Role.INDEX_BUILDER, builder, shard=1)
    acked = []
    for proc in producers:  # producers were served all along
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()
        acks = read_acks(out)
        assert len(acks) == 1500 and {a[1] for a in acks} == {"PUT_OK"}
        acked += acks
    store.wait_caught_up()
    with store.ctl() as ctl:
        slot = ctl.process_slot(1)
        assert slot.pid == new_dispatcher and slot.restarts == 1
    with Consumer(store.root, "verify") as consumer:
        for queue_id in range(4):
            expected = sorted((a[3], a[0]) for a in acked if a[2] == queue_id)
            got, offset = [], 0
            while True:
                result = consumer.pull("T1", queue_id, offset, 256)
                if not result.messages:
                    break
                got += [(r.queue_offset, r.body.decode()) for r in result.messages]
                offset = result.next_offset
            assert got == expected  # no gap, no duplicate, every acknowledged message in place
    assert store.stop() == 0
    assert_check_clean(store.root)
    with MessageStore.open(store.root) as offline:  # every key indexed exactly where it was put
        for key, _status, _qid, _offset, commit_pos, _msg_id in acked[::97]:
            assert [r.commit_pos for r in offline.query_by_key("T1", key)] == [commit_pos]


def test_a_restarted_dispatcher_puts_back_the_entries_it_cut_at_a_damaged_one(tmp_path):
    """A flipped entry below the durable position, then a dispatcher restart: its recovery ends
    the queue at the damaged entry and dispatch starts again below the durable position, so
    every entry comes back from the commitlog and no queue offset is given out twice."""
    store = start_store(tmp_path / "store", store={"consume_queue_entries": 16})
    with Producer(store.root) as producer:
        sent = [producer.send("T1", f"m{i}".encode(), queue_id=0) for i in range(40)]
        producer.send("T1", b"other", queue_id=1)
        store.wait_caught_up()
        queue_file = consume_queue_dir(store.root, "T1", 0) / offset_to_name(32 * CQ_ENTRY_SIZE)
        flip_byte(queue_file, 3 * CQ_ENTRY_SIZE + 8, 0x80)  # entry 35's size turns negative
        stray = 13 * CQ_ENTRY_SIZE  # a valid-looking entry 45, past the end: stale, never served
        with open(queue_file, "r+b") as fh:
            fh.seek(stray)
            fh.write(encode_cq_entry(sent[0].commit_pos, 100, 0))
        dispatcher = store.child_pid(Role.DISPATCHER)
        os.kill(dispatcher, signal.SIGKILL)
        store.wait_child_replaced(Role.DISPATCHER, dispatcher)
        store.wait_caught_up()
        after = producer.send("T1", b"after", queue_id=0)
        store.wait_caught_up()  # acknowledged at the flush; dispatched a step later
    assert [r.queue_offset for r in sent] == list(range(40)) and after.queue_offset == 40
    assert queue_file.read_bytes()[stray:stray + CQ_ENTRY_SIZE] == bytes(CQ_ENTRY_SIZE)
    with Consumer(store.root, "verify") as consumer:
        got = consumer.pull("T1", 0, 0, 64).messages
        assert [(r.queue_offset, r.body) for r in got] == \
            [(i, f"m{i}".encode()) for i in range(40)] + [(40, b"after")]
    assert store.stop() == 0
    assert_check_clean(store.root)
