"""engine.store_open.open_store: the one open sequence of MessageStore.open and the supervisor."""

from __future__ import annotations

import json

import pytest

from engine.errors import StoreLockedError, StoreMetaMismatchError
from engine.files.naming import ABORT_FILE, STORE_META_FILE
from engine.files.store_dir import StoreLock
from engine.store import MessageStore
from engine.store_open import Dispatch, close_parts, open_store
from tests.helpers import SMALL_CONFIG, TOPIC, snapshot


def written_store(root, count: int = 5) -> list:
    with MessageStore.open(root, SMALL_CONFIG) as store:
        return [store.put(TOPIC, b"m%d" % i, queue_id=i % 2) for i in range(count)]


def test_message_store_refuses_a_hand_edited_store_json_and_changes_nothing(tmp_path):
    root = tmp_path / "store"
    written_store(root)
    meta_path = root / STORE_META_FILE
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "index_shards": 1}))
    before = snapshot(root)
    with pytest.raises(StoreMetaMismatchError, match="index_shards = 1"):
        MessageStore.open(root, SMALL_CONFIG)
    assert snapshot(root) == before


def test_child_processes_dispatch_hands_over_the_commitlog_and_the_next_offsets(tmp_path):
    root = tmp_path / "store"
    results = written_store(root)
    opened = open_store(root, SMALL_CONFIG, writer="a test", dispatch=Dispatch.CHILD_PROCESSES)
    try:
        assert opened.parts is None and not opened.new_store
        assert opened.commitlog.written_pos == results[-1].commit_pos + opened.commitlog.read_at(
            results[-1].commit_pos).total_size
        assert opened.next_offsets == {(TOPIC, 0): 3, (TOPIC, 1): 2}
        assert (root / ABORT_FILE).exists()
        with pytest.raises(StoreLockedError):
            StoreLock.acquire(root)
    finally:
        opened.commitlog.close()
        opened.lock.release()


def test_in_process_dispatch_keeps_every_part_open(tmp_path):
    opened = open_store(tmp_path / "store", SMALL_CONFIG, writer="a test", dispatch=Dispatch.IN_PROCESS)
    try:
        assert opened.new_store and opened.next_offsets == {}
        assert opened.parts is not None and opened.parts.commitlog is opened.commitlog
        assert len(opened.parts.shards) == SMALL_CONFIG.index_shards
    finally:
        close_parts(opened.parts)
        opened.lock.release()


def test_a_failing_step_under_the_lock_releases_it_and_opens_nothing(tmp_path):
    root = tmp_path / "store"
    written_store(root)

    def fail() -> None:
        raise RuntimeError("stale children would not go")

    with pytest.raises(RuntimeError, match="stale children"):
        open_store(root, SMALL_CONFIG, writer="a test", dispatch=Dispatch.IN_PROCESS, after_lock=fail)
    assert not (root / ABORT_FILE).exists()
    StoreLock.acquire(root).release()  # the lock was released
