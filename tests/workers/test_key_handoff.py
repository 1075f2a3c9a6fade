"""The dispatcher hands index keys to the builders through the key ring; nothing depends on it."""

from __future__ import annotations

import os
import re
import signal

import pytest

from engine.store import MessageStore
from ipc.control_block import Role
from ipc.key_ring import KeyRing
from tests.workers.store_harness import (
    PRODUCER_SCRIPT,
    assert_check_clean,
    read_acks,
    spawn_python,
    start_store,
    store_shm_names,
    wait_for,
)
from tools.store_process import StoreProcess

pytestmark = pytest.mark.slow

HANDOFF_LINE = re.compile(r"index builder (\d): (\d+) bytes of commitlog indexed from the key ring, "
                          r"(\d+) scanned")


def produce(store: StoreProcess, count: int, batch: int, producers: int = 3):
    return [spawn_python(PRODUCER_SCRIPT, str(store.root), f"p{i}", str(count), str(batch), "T1")
            for i in range(producers)]


def collect(procs, count: int) -> list[list]:
    acked = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
        acks = read_acks(out)
        assert len(acks) == count and {a[1] for a in acks} == {"PUT_OK"}
        acked += acks
    return acked


def assert_every_key_found(root, acked: list[list]) -> None:
    with MessageStore.open(root) as offline:  # every key indexed exactly where it was put
        for key, _status, _qid, _offset, commit_pos, _msg_id in acked:
            assert [r.commit_pos for r in offline.query_by_key("T1", key)] == [commit_pos], key


def handoff_counts(stderr: str) -> dict[int, tuple[int, int]]:
    """Per shard, (bytes from the ring, bytes scanned) of the builders' last lines."""
    return {int(m[1]): (int(m[2]), int(m[3])) for m in HANDOFF_LINE.finditer(stderr)}


def test_builders_take_their_keys_from_the_ring(tmp_path):
    store = start_store(tmp_path / "store")
    acked = collect(produce(store, 800, 16), 800)
    store.wait_caught_up()
    flushed = store.positions().flushed_pos
    assert any(name.endswith("-keyring") for name in store_shm_names(store.root))
    assert store.stop() == 0
    counts = handoff_counts(store.stderr)
    assert sorted(counts) == [0, 1]
    for from_ring, scanned in counts.values():
        assert from_ring + scanned == flushed
        assert from_ring > flushed // 2  # most of it came from the ring
    assert store_shm_names(store.root) == []  # the dispatcher removed the ring when it stopped
    assert_check_clean(store.root)
    assert_every_key_found(store.root, acked)


def test_sigkill_dispatcher_under_load_twice_every_key_indexed(tmp_path):
    store = start_store(tmp_path / "store", supervisor={"restart_base_delay_s": 0.01})
    producers = produce(store, 2000, 8)
    dispatcher = store.child_pid(Role.DISPATCHER)
    for threshold in (30_000, 90_000):
        wait_for(lambda t=threshold: store.positions().dispatched_pos > t, "dispatch under load")
        os.kill(dispatcher, signal.SIGKILL)
        dispatcher = store.wait_child_replaced(Role.DISPATCHER, dispatcher)
    with store.ctl() as ctl:
        generation = ctl.generation
    ring = KeyRing.attach(store.root, generation)
    try:
        assert ring.writer_pid == dispatcher  # the restarted dispatcher adopted the ring
    finally:
        ring.close()
    acked = collect(producers, 2000)
    store.wait_caught_up()
    assert store.stop() == 0
    assert "key ring on" in store.stderr
    assert_check_clean(store.root)
    assert_every_key_found(store.root, acked)


def test_sigkill_an_index_builder_repeatedly_it_resumes_behind_the_ring(tmp_path):
    store = start_store(tmp_path / "store", supervisor={"restart_base_delay_s": 0.01})
    producers = produce(store, 2000, 8)
    builder = store.child_pid(Role.INDEX_BUILDER, 0)
    for threshold in (30_000, 90_000):
        wait_for(lambda t=threshold: store.positions().shard_processed_pos[0] > t, "indexing under load")
        os.kill(builder, signal.SIGKILL)
        builder = store.wait_child_replaced(Role.INDEX_BUILDER, builder, shard=0)
    acked = collect(producers, 2000)
    store.wait_caught_up()
    assert store.stop() == 0
    assert_check_clean(store.root)
    assert_every_key_found(store.root, acked)
