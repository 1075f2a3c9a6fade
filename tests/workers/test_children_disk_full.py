"""The dispatcher and the index builders wait out a full disk: no crash, no restart, one log line
each, heartbeats all along, and they catch up when space returns.

Only their files meet the full disk: small tmpfs filesystems are mounted over the store's
`consumequeue/` and `index/` directories (the commitlog, the checkpoint and the supervisor's
files stay on the ordinary disk, which a full disk under the supervisor is tested elsewhere:
tests/faults/test_disk_full.py) and filled for real with a ballast file.
"""

from __future__ import annotations

import pytest

from engine.message import Message
from ipc.control_block import Role, process_slot_index
from ipc.producer import Producer
from tests.workers.store_harness import assert_check_clean, start_store, wait_for
from tools.store_process import StoreProcess
from tools.torture.filesystems import FilesystemUnavailable, MiB, fill, small_tmpfs, unfill, unmount

pytestmark = pytest.mark.slow
CHILDREN = [("dispatcher", Role.DISPATCHER, 0), ("index_builder[0]", Role.INDEX_BUILDER, 0),
            ("index_builder[1]", Role.INDEX_BUILDER, 1)]


@pytest.fixture
def store_with_full_derived_disks(tmp_path):
    """A store (created and stopped once, so its directories exist) whose consume queues and index
    live on 1 MiB tmpfs filesystems."""
    root = tmp_path / "store"
    assert start_store(root).stop() == 0
    mounts = []
    try:
        for name in ("consumequeue", "index"):
            mount_point = root / name
            mount_point.mkdir(exist_ok=True)
            assert not any(mount_point.iterdir())  # nothing was written yet
            try:
                small_tmpfs(mount_point, MiB)
            except FilesystemUnavailable as exc:
                pytest.skip(f"no small filesystem: {exc}")
            mounts.append(mount_point)
        yield root, mounts
    finally:
        for mount_point in reversed(mounts):
            unmount(mount_point)


def heartbeats(store: StoreProcess) -> dict[str, int]:
    with store.ctl() as ctl:
        return {name: ctl.process_slot(process_slot_index(role, shard)).heartbeat_ns
                for name, role, shard in CHILDREN}


def test_children_wait_out_a_full_disk_and_resume(store_with_full_derived_disks):
    root, disks = store_with_full_derived_disks
    store = start_store(root)
    try:
        with Producer(root) as producer:
            assert all(r.ok for r in producer.send_batch([Message("Warm", b"w", keys=(f"w{i}",))
                                                          for i in range(10)]))
            store.wait_caught_up()
            pids = {name: store.child_pid(role, shard) for name, role, shard in CHILDREN}
            for disk in disks:
                fill(disk, leave_bytes=0)
            # a new topic's queues need their first page; 1200 keys roll each shard's index file
            for start in range(0, 600, 50):
                results = producer.send_batch([Message("Fresh", b"f" * 50, keys=(f"f{i}",))
                                               for i in range(start, start + 50)])
                assert all(r.ok for r in results)  # the commitlog is on the ordinary disk
        waiting = [f"{name}: disk full, waiting for space" for name, _, _ in CHILDREN]
        wait_for(lambda: all(line in store.stderr for line in waiting), "every child to meet the full disk")
        beats = heartbeats(store)
        wait_for(lambda: all(now - beats[name] > 500_000_000 for name, now in heartbeats(store).items()),
                 "heartbeats to go on while the disk is full")
        positions = store.positions()
        assert positions.dispatched_pos < positions.written_pos
        assert all(p < positions.written_pos for p in positions.shard_processed_pos)
        for disk in disks:
            unfill(disk)
        store.wait_caught_up()
        log = store.stderr
        for name, role, shard in CHILDREN:
            assert log.count(f"{name}: disk full, waiting for space") == 1, log[-3000:]  # once, not per retry
            assert f"{name}: disk space is back; resuming" in log
            assert store.child_pid(role, shard) == pids[name]
            with store.ctl() as ctl:
                assert ctl.process_slot(process_slot_index(role, shard)).restarts == 0
        assert "SIGBUS" not in log and "Traceback" not in log
        with Producer(root) as producer:
            assert producer.send("Fresh", b"after", keys=("after",)).ok
        assert store.stop() == 0
        assert_check_clean(root)
    finally:
        if store.proc.poll() is None:
            store.kill()
