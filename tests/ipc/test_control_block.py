"""Seqlock and control block: consistent cross-process reads, growth rules, process slots."""

from __future__ import annotations

import multiprocessing
import os
import struct
import subprocess
import time

import pytest

from engine.config import FlushPolicy
from engine.errors import FormatVersionError, ServiceNotAvailableError, StoreError
from engine.status import PutStatus
from ipc import seqlock
from ipc.control_block import (
    HEADER_OFFSET,
    TOTAL_SIZE,
    ControlBlock,
    FlushCode,
    Positions,
    ProcState,
    Role,
    StoreState,
    flush_code_for,
    pid_alive,
    process_slot_index,
    remove_stale,
)
from ipc.shm import SharedRegion, issue_shm_token, region_name, unlink_stale_regions
from ipc.wakeup import unlink_all

SPAWN = multiprocessing.get_context("spawn")
WIDE_GROUP = struct.Struct("<32q")  # wide enough that a torn read would be easy to catch
WIDE_OFFSET = 64
READY_OFFSET = 0
WRITE_COUNT = 20_000
WRITE_GAP_NS = 3_000
POSITION_COUNT = 20_000


@pytest.fixture
def store_dir(tmp_path):
    issue_shm_token(tmp_path)  # what a supervisor does before creating its regions
    yield tmp_path
    unlink_stale_regions(tmp_path)
    unlink_all(tmp_path)


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.001)


def start_child(target, *args):
    proc = SPAWN.Process(target=target, args=args)
    proc.start()
    return proc


def join_ok(proc, timeout_s: float = 60.0) -> None:
    proc.join(timeout_s)
    if proc.is_alive():
        proc.kill()
        proc.join()
        pytest.fail("child did not finish in time")
    assert proc.exitcode == 0


# -- children --------------------------------------------------------------------------------------

def child_write_wide_group(name: str) -> None:
    with SharedRegion.attach(name) as region:
        buf = region.buf
        while buf[READY_OFFSET] == 0:  # the reader is spinning before we start
            time.sleep(0.0005)
        for value in range(1, WRITE_COUNT + 1):
            seqlock.write_locked(buf, WIDE_OFFSET, WIDE_GROUP, (value,) * 32)
            gap_end_ns = time.perf_counter_ns() + WRITE_GAP_NS
            while time.perf_counter_ns() < gap_end_ns:
                pass  # a hot writer that still leaves readers a window, like a real publisher
        del buf


def child_publish_positions(store_dir: str) -> None:
    cb = ControlBlock.attach(store_dir)
    for k in range(1, POSITION_COUNT + 1):
        cb.publish_written(2 * k, msg_count=1)
        cb.publish_flushed(k, latency_ns=k, flushed_bytes=3 * k)
        cb.publish_shard(1, 2 * k, k)
    cb.close()


def child_run_in_slot(store_dir: str, index: int) -> None:
    cb = ControlBlock.attach(store_dir)
    slot = cb.process_slot(index)
    assert slot is not None and slot.pid == os.getpid() and slot.state is ProcState.BOOTING
    cb.heartbeat(index)
    cb.set_process_state(index, ProcState.RUNNING)
    while cb.store_state is not StoreState.STOPPING:
        cb.heartbeat(index)
        time.sleep(0.002)
    cb.set_process_state(index, ProcState.EXITED)
    cb.close()


def child_create_and_exit(store_dir: str) -> None:
    cb = ControlBlock.create(store_dir, 2, FlushCode.ASYNC, generation=7)
    cb.set_store_state(StoreState.READY)
    cb.close()  # exits without unlinking, like a crashed supervisor


# -- seqlock -----------------------------------------------------------------------------------------

def test_seqlock_reader_process_never_sees_torn_or_backward_values(store_dir):
    name = region_name(store_dir, "seq")
    with SharedRegion.create(name, 4096) as region:
        buf = region.buf
        writer = start_child(child_write_wide_group, name)
        buf[READY_OFFSET] = 1
        last, distinct, deadline = 0, 0, time.monotonic() + 60
        while last < WRITE_COUNT and time.monotonic() < deadline:
            values = seqlock.read_consistent(buf, WIDE_OFFSET, WIDE_GROUP)
            assert len(set(values)) == 1, f"torn read: {sorted(set(values))[:4]}"
            assert values[0] >= last, f"went backwards {last} -> {values[0]}"
            distinct += values[0] != last
            last = values[0]
        join_ok(writer)
        assert last == WRITE_COUNT
        assert distinct > 10, "reader never overlapped the writer"
        del buf
        region.unlink()


def test_seqlock_writer_dead_mid_write_times_out_readers_then_next_write_repairs(store_dir):
    name = region_name(store_dir, "seq")
    with SharedRegion.create(name, 4096) as region:
        layout = struct.Struct("<2q")
        seqlock.write_locked(region.buf, 8, layout, (1, 2))
        seqlock.SEQ.pack_into(region.buf, 8, 3)  # as if the writer died after going odd
        with pytest.raises(StoreError, match="mid-update"):
            seqlock.read_consistent(region.buf, 8, layout, timeout_s=0.05)
        seqlock.write_locked(region.buf, 8, layout, (5, 6))
        assert seqlock.read_consistent(region.buf, 8, layout) == (5, 6)
        assert seqlock.SEQ.unpack_from(region.buf, 8)[0] % 2 == 0
        with pytest.raises(ValueError, match="aligned"):
            seqlock.write_locked(region.buf, 12, layout, (1, 2))
        region.unlink()


def test_fences_are_callable_on_this_machine():
    seqlock.fence()
    seqlock.order_fence()
    assert seqlock.FENCE_KIND in ("libatomic", "lock")


# -- control block -----------------------------------------------------------------------------------

def test_control_block_positions_from_writer_process_are_consistent_and_monotonic(store_dir):
    cb = ControlBlock.create(store_dir, 2, FlushCode.SYNC)
    writer = start_child(child_publish_positions, str(store_dir))
    last, distinct = cb.snapshot(), 0
    deadline = time.monotonic() + 60
    while last.shard_durable_pos[1] < POSITION_COUNT and time.monotonic() < deadline:
        snap = cb.snapshot()
        assert snap.written_pos == 2 * snap.appended_msgs  # one seqlocked group
        assert snap.flush_count == snap.flushed_pos == snap.last_flush_latency_ns
        assert snap.last_flush_bytes == 3 * snap.flushed_pos
        assert snap.flushed_pos <= snap.written_pos
        assert snap.shard_processed_pos[1] == 2 * snap.shard_durable_pos[1]
        for field in ("written_pos", "flushed_pos", "appended_msgs"):
            assert getattr(snap, field) >= getattr(last, field), field
        assert snap.shard_durable_pos[1] >= last.shard_durable_pos[1]
        distinct += snap != last
        last = snap
    join_ok(writer)
    assert distinct > 10, "reader never overlapped the writer"
    final = cb.snapshot()
    assert (final.written_pos, final.flushed_pos) == (2 * POSITION_COUNT, POSITION_COUNT)
    assert final.shard_processed_pos == (0, 2 * POSITION_COUNT)
    assert cb.written_pos == 2 * POSITION_COUNT and cb.flushed_pos == POSITION_COUNT
    cb.close()
    cb.unlink()


def test_control_block_publish_smaller_value_raises_and_reset_allows_it(store_dir):
    cb = ControlBlock.create(store_dir, 1, FlushCode.SYNC)
    cb.publish_written(100, msg_count=2)
    cb.publish_written(100)  # equal is fine
    with pytest.raises(ValueError, match="written_pos may only grow"):
        cb.publish_written(99)
    cb.publish_flushed(80)
    with pytest.raises(ValueError, match="flushed_pos may only grow"):
        cb.publish_flushed(79)
    with pytest.raises(ValueError, match="ahead of written_pos"):
        cb.publish_flushed(101)
    cb.publish_dispatched(60, msg_count=1)
    with pytest.raises(ValueError, match="dispatched_pos may only grow"):
        cb.publish_dispatched(59)
    cb.publish_cq_durable(50)
    with pytest.raises(ValueError, match="cq_durable_pos may only grow"):
        cb.publish_cq_durable(49)
    with pytest.raises(ValueError, match="ahead of dispatched_pos"):
        cb.publish_cq_durable(61)
    cb.publish_shard(0, 40, 30)
    with pytest.raises(ValueError, match="processed_pos may only grow"):
        cb.publish_shard(0, 39, 30)
    with pytest.raises(ValueError, match="out of range"):
        cb.publish_shard(1, 50, 50)
    assert cb.snapshot() == Positions(100, 80, 60, 50, (40,), (30,), appended_msgs=2,
                                      flush_count=1, dispatched_msgs=1)
    cb.reset_shard(0, 10, 10)  # a restarted builder starts from its durable position
    cb.reset_dispatcher(20, 20)
    assert cb.snapshot().shard_processed_pos == (10,) and cb.dispatched_pos == 20
    cb.reset_positions(Positions.uniform(5, 1))
    assert cb.snapshot() == Positions.uniform(5, 1)
    cb.close()
    cb.unlink()


def test_put_status_counts_add_up_and_put_ok_is_derived_from_appended(store_dir):
    cb = ControlBlock.create(store_dir, 1, FlushCode.SYNC)
    assert set(cb.put_status_counts().values()) == {0} and len(cb.put_status_counts()) == len(PutStatus) - 1
    cb.publish_written(300, msg_count=7)
    cb.count_put_statuses({PutStatus.MESSAGE_ILLEGAL: 2, PutStatus.FLUSH_DISK_TIMEOUT: 3})
    cb.count_put_statuses({PutStatus.MESSAGE_ILLEGAL: 1, PutStatus.UNKNOWN_ERROR: 4})
    with pytest.raises(ValueError, match="PUT_OK"):
        cb.count_put_statuses({PutStatus.PUT_OK: 1})
    reader = ControlBlock.attach(store_dir)
    counts = reader.put_status_counts()
    assert counts[PutStatus.PUT_OK] == 7 - 3  # the timed-out answers were appended too
    assert (counts[PutStatus.MESSAGE_ILLEGAL], counts[PutStatus.FLUSH_DISK_TIMEOUT],
            counts[PutStatus.UNKNOWN_ERROR], counts[PutStatus.DISK_FULL]) == (3, 3, 4, 0)
    reader.close()
    cb.close()
    cb.unlink()


def test_control_block_process_slots_round_trip_with_child_heartbeats(store_dir):
    cb = ControlBlock.create(store_dir, 4, FlushCode.SYNC, generation=3)
    index = process_slot_index(Role.INDEX_BUILDER, 2)
    assert index == 4 and process_slot_index(Role.DISPATCHER) == 1
    child = SPAWN.Process(target=child_run_in_slot, args=(str(store_dir), index))
    cb.claim_process_slot(0, Role.SUPERVISOR, 0, os.getpid())
    child.start()
    cb.claim_process_slot(index, Role.INDEX_BUILDER, 2, child.pid)  # before the child reads it
    wait_until(lambda: cb.process_slot(index).state is ProcState.RUNNING, 30, "child RUNNING")
    first_beat = cb.process_slot(index).heartbeat_ns
    wait_until(lambda: cb.process_slot(index).heartbeat_ns > first_beat, 10, "a new heartbeat")
    slot = cb.process_slot(index)
    assert (slot.pid, slot.role, slot.shard, slot.generation, slot.restarts) == (
        child.pid, Role.INDEX_BUILDER, 2, 3, 0)
    assert abs(slot.heartbeat_ns - time.monotonic_ns()) < 10 * 10**9
    assert [s.index for s in cb.process_slots()] == [0, index]
    cb.set_store_state(StoreState.STOPPING)
    join_ok(child)
    assert cb.process_slot(index).state is ProcState.EXITED
    cb.claim_process_slot(index, Role.INDEX_BUILDER, 2, 4242)  # the restart
    assert cb.process_slot(index).restarts == 1
    assert cb.process_slot(index).state is ProcState.BOOTING
    cb.close()
    cb.unlink()


def test_control_block_attach_sees_header_and_readiness(store_dir):
    with pytest.raises(ServiceNotAvailableError):
        ControlBlock.attach(store_dir)
    owner = ControlBlock.create(store_dir, 3, flush_code_for(FlushPolicy.ASYNC), generation=9)
    reader = ControlBlock.attach(store_dir)
    assert (reader.supervisor_pid, reader.generation, reader.shard_count) == (os.getpid(), 9, 3)
    assert reader.flush_policy is FlushPolicy.ASYNC
    assert abs(reader.started_ns - time.time_ns()) < 60 * 10**9
    assert reader.store_state is StoreState.STARTING and not reader.is_ready()
    owner.set_store_state(StoreState.READY)
    assert reader.is_ready() and reader.supervisor_alive()
    with pytest.raises(StoreError):
        ControlBlock.create(store_dir, 3, FlushCode.SYNC)  # a second one on the same store
    reader.close()
    owner.close()
    owner.unlink()


def test_control_block_attach_to_other_layout_version_is_refused(store_dir):
    owner = ControlBlock.create(store_dir, 1, FlushCode.SYNC)
    struct.pack_into("<I", owner.region.buf, HEADER_OFFSET + 8, 99)
    with pytest.raises(FormatVersionError, match="layout version 99"):
        ControlBlock.attach(store_dir)
    owner.region.buf[0:8] = b"NOTMQSTX"
    with pytest.raises(StoreError, match="not an mqstore control block"):
        ControlBlock.attach(store_dir)
    owner.close()
    owner.unlink()


def test_control_block_left_by_dead_supervisor_is_not_ready_and_removable(store_dir):
    child = start_child(child_create_and_exit, str(store_dir))
    join_ok(child)
    cb = ControlBlock.attach(store_dir)
    assert cb.region.size_bytes == TOTAL_SIZE
    assert cb.store_state is StoreState.READY  # what it last said...
    assert not cb.supervisor_alive() and not cb.is_ready()  # ...but nobody runs
    cb.close()
    assert remove_stale(store_dir) == 7
    assert remove_stale(store_dir) is None
    with pytest.raises(ServiceNotAvailableError):
        ControlBlock.attach(store_dir)


def test_pid_alive_is_false_for_a_zombie_and_a_reaped_process():
    """A dead child its parent has not reaped still takes signals; pid_alive must say dead."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert pid_alive(child.pid) and pid_alive(os.getpid())
        child.kill()
        deadline = time.monotonic() + 10
        while _proc_state(child.pid) != "Z":  # the kernel makes it a zombie: we have not waited
            assert time.monotonic() < deadline, "the killed child never became a zombie"
            time.sleep(0.005)
        assert not pid_alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not pid_alive(child.pid) and not pid_alive(0) and not pid_alive(-1)


def _proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat_file:
        stat = stat_file.read()
    return stat[stat.rfind(")") + 2]
