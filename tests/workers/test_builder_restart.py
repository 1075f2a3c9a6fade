"""A restarted index builder whose trim meets a damaged entry below its durable position."""

from __future__ import annotations

import os
import signal

import pytest

from engine.files.naming import index_shard_dir
from engine.formats.index_file import decode_index_header, entry_pos
from engine.store import MessageStore
from ipc.control_block import Role
from ipc.producer import Producer
from tests.workers.store_harness import SMALL_STORE, assert_check_clean, start_store
from tools.torture.faults import flip_byte

pytestmark = pytest.mark.slow

COMMIT_POS_FIELD = 4  # index entry: key_hash 4 | commit_pos 8 | time_diff_s 4 | prev_index 4


def test_a_restarted_builder_reindexes_what_its_trim_took_below_the_durable_position(tmp_path):
    """The flipped entry is the first one the trim's position search reads: the restarted
    builder resumes at the newest record it kept (it used to resume at its durable position,
    publish it, and lose every key after the flipped entry)."""
    store = start_store(tmp_path / "store")
    with Producer(store.root) as producer:
        sent = [producer.send("T1", f"m{i}".encode(), keys=(f"k{i}",)) for i in range(120)]
        store.wait_caught_up()
        last = sorted(index_shard_dir(store.root, 0).iterdir())[-1]
        count = decode_index_header(last.read_bytes()).index_count
        at = entry_pos(SMALL_STORE["index_slot_count"], 1 + (count - 1) // 2) + COMMIT_POS_FIELD
        flip_byte(last, at, 0x40)
        builder = store.child_pid(Role.INDEX_BUILDER, 0)
        os.kill(builder, signal.SIGKILL)
        store.wait_child_replaced(Role.INDEX_BUILDER, builder, shard=0)
        store.wait_caught_up()
    assert store.stop() == 0
    assert_check_clean(store.root)
    with MessageStore.open(store.root) as offline:
        for i, result in enumerate(sent):
            assert [m.commit_pos for m in offline.query_by_key("T1", f"k{i}")] == [result.commit_pos]
