"""The supervisor as a real process: start order, stop, refusals, crashes, restarts, faults."""

from __future__ import annotations

import os
import signal
import stat
import time

import pytest

from engine.errors import ServiceNotAvailableError
from engine.files.naming import ABORT_FILE
from engine.recovery.recover import ShutdownState
from engine.status import PutStatus
from ipc.control_block import ControlBlock, Role, pid_alive
from ipc.producer import Producer
from tests.workers.store_harness import (
    PRODUCER_SCRIPT,
    assert_check_clean,
    claimed_producer_slots,
    cli,
    read_acks,
    spawn_python,
    start_store,
    store_shm_names,
    wait_for,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def store(tmp_path):
    running = start_store(tmp_path / "store")
    yield running
    if running.proc.poll() is None:
        running.stop()


def test_start_stop_clean(store):
    with Producer(store.root) as producer:
        assert producer.send("T1", b"hello").ok
    assert (store.root / ABORT_FILE).exists()
    assert store.stop() == 0
    assert not (store.root / ABORT_FILE).exists(), store.stderr
    assert store_shm_names(store.root) == []
    assert "stopped cleanly" in store.stderr
    assert_check_clean(store.root)


def test_second_supervisor_is_refused(store):
    result = cli("start", "--store", str(store.root))
    assert result.returncode == 4
    assert f"store is already in use by pid {store.proc.pid}" in result.stderr.decode()
    assert b"Traceback" not in result.stderr
    with Producer(store.root) as producer:  # the first one is untouched
        assert producer.send("T1", b"still served").ok


def test_files_and_shared_memory_are_owner_only(store):
    with Producer(store.root) as producer:
        assert producer.send("T1", b"x", keys=("k",)).ok
    store.wait_caught_up()
    loose = []
    for dirpath, dirnames, filenames in os.walk(store.root):
        for name in dirnames + filenames:
            mode = os.stat(os.path.join(dirpath, name)).st_mode
            if stat.S_IMODE(mode) & 0o077:
                loose.append((os.path.join(dirpath, name), oct(stat.S_IMODE(mode))))
    assert stat.S_IMODE(os.stat(store.root).st_mode) & 0o077 == 0
    assert loose == []
    names = store_shm_names(store.root)
    assert any(n.endswith("-ctl") for n in names) and any(n.endswith("-mbox") for n in names)
    for name in names:
        assert stat.S_IMODE(os.stat(f"/dev/shm/{name}").st_mode) == 0o600, name


def test_sigkill_supervisor_children_exit_and_next_start_recovers(tmp_path):
    store = start_store(tmp_path / "store")
    children = [store.child_pid(Role.DISPATCHER), store.child_pid(Role.INDEX_BUILDER, 0),
                store.child_pid(Role.INDEX_BUILDER, 1)]
    producers = [spawn_python(PRODUCER_SCRIPT, str(store.root), f"p{i}", "100000", "16", "T1")
                 for i in range(3)]
    wait_for(lambda: claimed_producer_slots(store.root) == 3, "the producers to connect")
    wait_for(lambda: store.positions().flushed_pos > 60_000, "some load")
    store.kill()
    wait_for(lambda: not any(pid_alive(pid) for pid in children), "orphaned children to exit", 3.0)
    assert store_shm_names(store.root)  # left behind for the next start to clean up
    acked = []
    for proc in producers:
        out, err = proc.communicate(timeout=30)  # no hang: they get SERVICE_NOT_AVAILABLE
        assert proc.returncode == 0, err.decode()
        acks = read_acks(out)
        assert acks and acks[-1][1] == "SERVICE_NOT_AVAILABLE"
        acked += [a for a in acks if a[1] == "PUT_OK"]
    assert acked
    with pytest.raises(ServiceNotAvailableError):
        Producer(store.root)
    restarted = start_store(store.root)
    assert f"after a {ShutdownState.CRASH.value} shutdown" in restarted.stderr
    restarted.wait_caught_up()
    from ipc.consumer import Consumer

    with Consumer(store.root, "verify") as consumer:
        for key, _status, queue_id, queue_offset, commit_pos, _msg_id in acked:
            result = consumer.pull("T1", queue_id, queue_offset, 1)
            assert result.messages, (key, queue_id, queue_offset)
            record = result.messages[0]
            assert (record.body.decode(), record.commit_pos) == (key, commit_pos)
    assert restarted.stop() == 0
    assert store_shm_names(store.root) == []
    assert_check_clean(store.root)


def test_flush_disk_timeout_when_the_flush_is_too_slow(tmp_path):
    store = start_store(tmp_path / "store", store={"sync_flush_timeout_ms": 50},
                        env={"MQSTORE_FAULT_FSYNC_DELAY_MS": "1000"})
    try:
        assert "fault injection" in store.stderr
        with Producer(store.root) as producer:
            started = time.monotonic()
            result = producer.send("T1", b"slow disk")
            assert result.status is PutStatus.FLUSH_DISK_TIMEOUT
            assert result.commit_pos == 0 and result.status.is_stored
            assert time.monotonic() - started < 0.8  # answered at the deadline, not after the flush
            assert producer.send("T1", b"no wait", wait=False).status is PutStatus.PUT_OK
    finally:
        assert store.stop() == 0
    assert_check_clean(store.root)


def test_restart_budget_exceeded_stops_the_store(tmp_path):
    store = start_store(tmp_path / "store", supervisor={
        "restart_budget": 2, "restart_window_s": 60.0, "restart_base_delay_s": 0.01})
    for _ in range(3):
        pid = store.child_pid(Role.DISPATCHER)
        os.kill(pid, signal.SIGKILL)
        if store.proc.poll() is None:
            try:
                store.wait_child_replaced(Role.DISPATCHER, pid)
            except (AssertionError, ServiceNotAvailableError):
                break  # the third kill exceeded the budget: the store is gone
    assert store.proc.wait(30) == 1
    err = store.stderr
    assert "restart budget of 2 restarts in 60 s exceeded; stopping the store" in err
    assert err.count("dispatcher started") == 3  # the first start and two restarts, no more
    assert store_shm_names(store.root) == []
    assert_check_clean(store.root)


def test_child_that_cannot_boot_is_not_restarted_and_its_cause_is_in_the_log(tmp_path):
    store = start_store(tmp_path / "store")
    with Producer(store.root) as producer:
        assert producer.send("T1", b"x", keys=("k",)).ok
    store.wait_caught_up()
    foreign = store.root / "index" / "0" / "not-an-index-file"
    foreign.write_bytes(b"junk")
    builder = store.child_pid(Role.INDEX_BUILDER, 0)
    os.kill(builder, signal.SIGKILL)
    assert store.proc.wait(30) == 1
    err = store.stderr
    assert "index builder 0" in err and "BOOT_FAILED" in err and "not restarting" in err
    assert err.count("index builder 0 started") == 2  # started, restarted once, failed to boot
    log = (store.root / "mqstore.log").read_text()
    failed = [line for line in log.splitlines() if "index builder 0 (pid " in line and "BOOT_FAILED" in line]
    assert failed and "stopping the store; it logged: index_builder-0[" in failed[-1], log
    assert "failed to boot: " in failed[-1] and "not-an-index-file" in failed[-1], failed[-1]
    assert f"index builder 0 (pid {builder}) killed by SIGKILL (perhaps out of memory)" in log
    foreign.unlink()
    restarted = start_store(store.root)
    assert restarted.stop() == 0
    assert_check_clean(store.root)


def test_children_exit_when_supervisor_pid_is_not_their_parent(tmp_path):
    store = start_store(tmp_path / "store")
    with ControlBlock.attach(store.root) as ctl:
        slots = [s.pid for s in ctl.process_slots() if s.role is not Role.SUPERVISOR]
    os.kill(store.proc.pid, signal.SIGSTOP)  # a hung supervisor is not a dead one ...
    try:
        time.sleep(0.3)
        assert all(pid_alive(pid) for pid in slots)
    finally:
        os.kill(store.proc.pid, signal.SIGCONT)
    assert store.stop() == 0


def test_hung_child_is_killed_and_restarted(tmp_path):
    store = start_store(tmp_path / "store", supervisor={"child_timeout_s": 0.5})
    try:
        hung = store.child_pid(Role.INDEX_BUILDER, 0)
        os.kill(hung, signal.SIGSTOP)  # alive but silent: its heartbeat stops
        store.wait_child_replaced(Role.INDEX_BUILDER, hung, shard=0)
        assert not pid_alive(hung)
        assert "is hung (no heartbeat for" in store.stderr
        logged = (store.root / "mqstore.log").read_text()
        assert (f"index builder 0 (pid {hung}) killed by the supervisor with SIGKILL (hung: no "
                "heartbeat for") in logged
        assert "perhaps out of memory" not in logged
        with Producer(store.root) as producer:
            assert producer.send("T1", b"after", keys=("k",)).ok
        store.wait_caught_up()
    finally:
        assert store.stop() == 0
    assert_check_clean(store.root)


def test_async_flush_answers_on_append_and_flushes_on_its_timer(tmp_path):
    store = start_store(tmp_path / "store", store={
        "flush": "async", "async_flush_interval_ms": 50, "async_flush_thorough_interval_ms": 200})
    try:
        with Producer(store.root) as producer:
            results = [producer.send("ASYNC", f"m{i}".encode(), queue_id=0) for i in range(20)]
        assert all(r.ok for r in results)
        wait_for(lambda: (p := store.positions()).flushed_pos == p.written_pos, "the timed flush")
        store.wait_caught_up()
        from ipc.consumer import Consumer

        with Consumer(store.root, "a") as consumer:
            assert [r.body for r in consumer.pull("ASYNC", 0, 0, 64).messages] == [
                f"m{i}".encode() for i in range(20)]
    finally:
        assert store.stop() == 0
    assert_check_clean(store.root)
