"""Dispatcher and index builders under load: SIGKILL, restart from the durable position."""

from __future__ import annotations

import os
import signal

import pytest

from engine.store import MessageStore
from ipc.consumer import Consumer
from ipc.control_block import Role
from tests.workers.store_harness import (
    PRODUCER_SCRIPT,
    assert_check_clean,
    read_acks,
    spawn_python,
    start_store,
    wait_for,
)

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
