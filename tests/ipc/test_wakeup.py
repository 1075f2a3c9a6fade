"""Wakeups: semaphore permissions, long-poll waiter table handshake, store-wide cleanup."""

from __future__ import annotations

import multiprocessing
import os
import signal
import stat
import time

import pytest

from engine.errors import ServiceNotAvailableError, StoreError
from ipc.control_block import ControlBlock, FlushCode
from ipc.mailbox import MailboxServer
from ipc.shm import SHM_DIR, issue_shm_token, store_prefix, unlink_stale_regions
from ipc.wakeup import (
    ConsumerWaiter,
    WaiterTable,
    Wakeup,
    supervisor_wakeup_name,
    unlink_all,
    waiter_wakeup_name,
    waiter_wakeup_names,
)

SPAWN = multiprocessing.get_context("spawn")
TARGET_POS = 100
CONSUMER_TIMEOUT_S = 30.0


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


def store_semaphores(store_dir) -> set[str]:
    prefix = "sem." + store_prefix(store_dir)[1:]
    return {entry for entry in os.listdir(SHM_DIR) if entry.startswith(prefix)}


# -- children --------------------------------------------------------------------------------------

def child_consumer(store_dir: str, run_dir: str) -> None:
    cb = ControlBlock.attach(store_dir)
    table = WaiterTable.attach(store_dir)
    with ConsumerWaiter.register(table, run_dir) as waiter:
        started = time.monotonic()
        ready = waiter.wait(lambda: cb.dispatched_pos >= TARGET_POS, CONSUMER_TIMEOUT_S)
        assert ready, "woke without the position"
        assert time.monotonic() - started < CONSUMER_TIMEOUT_S / 2, "woke by timeout, not notify"
    table.close()
    cb.close()


def child_register_and_hang(store_dir: str, run_dir: str) -> None:
    table = WaiterTable.attach(store_dir)
    waiter = ConsumerWaiter.register(table, run_dir)
    waiter.wait(lambda: False, 3600)  # killed while waiting


# -- tests -----------------------------------------------------------------------------------------

def test_wakeup_semaphore_is_owner_only_and_missing_one_is_service_not_available(store_dir):
    name = supervisor_wakeup_name(store_dir)
    with pytest.raises(ServiceNotAvailableError):
        Wakeup.open(name)
    old_umask = os.umask(0)
    try:
        wakeup = Wakeup.create(name)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(os.stat(SHM_DIR / ("sem." + name[1:])).st_mode) == 0o600
    with pytest.raises(StoreError, match="already exists"):
        Wakeup.create(name)
    other = Wakeup.open(name)
    other.post()
    other.post()
    assert wakeup.wait(1.0) and wakeup.drain() == 1 and not wakeup.wait(0)
    with pytest.raises(StoreError, match="may not unlink"):
        other.unlink()
    other.close()
    wakeup.close()
    wakeup.unlink()  # after close too
    assert store_semaphores(store_dir) == set()


def test_consumer_blocked_in_wait_is_woken_by_notify(store_dir):
    cb = ControlBlock.create(store_dir, 1, FlushCode.SYNC)
    table = WaiterTable.create(store_dir, entry_count=4)
    consumer = SPAWN.Process(target=child_consumer, args=(str(store_dir), str(store_dir / "run")))
    consumer.start()
    wait_until(lambda: any(e.waiting for e in table.registered()), 30, "consumer waiting")
    (entry,) = table.registered()
    assert entry.pid == consumer.pid and entry.sem_name.startswith(store_prefix(store_dir))
    assert table.anyone_waiting()
    cb.publish_dispatched(TARGET_POS)
    notified = time.monotonic()
    assert table.notify_waiters() == 1
    assert not table.anyone_waiting()  # the notifier cleared the flag it posted
    consumer.join(CONSUMER_TIMEOUT_S + 10)
    assert consumer.exitcode == 0
    assert time.monotonic() - notified < 5.0
    assert table.registered() == []  # the consumer left the table on close
    table.close()
    table.unlink()
    cb.close()
    cb.unlink()


def test_registered_waiter_that_is_not_waiting_accumulates_no_posts(store_dir):
    table = WaiterTable.create(store_dir, entry_count=2)
    with ConsumerWaiter.register(table, store_dir / "run") as waiter:
        assert not table.anyone_waiting()
        for _ in range(100):
            assert table.notify_waiters() == 0
        assert waiter.wakeup.pending_posts == 0
        assert not waiter.wait(lambda: False, 0.05)  # times out, then leaves the flag clear
        assert not table.entry(waiter.index).waiting
        for _ in range(100):
            table.notify_waiters()
        assert waiter.wakeup.pending_posts == 0
        assert waiter.wait(lambda: True, 30)  # ready at once: no sleep
    table.close()
    table.unlink()


def test_dead_consumer_gets_at_most_one_post_and_its_entry_is_reclaimed(store_dir):
    table = WaiterTable.create(store_dir, entry_count=1)
    run_dir = store_dir / "run"
    child = SPAWN.Process(target=child_register_and_hang, args=(str(store_dir), str(run_dir)))
    child.start()
    wait_until(lambda: any(e.waiting for e in table.registered()), 30, "consumer waiting")
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)
    assert table.notify_waiters() == 1  # its flag was still up
    assert table.notify_waiters() == 0  # cleared: nothing accumulates
    with ConsumerWaiter.register(table, run_dir) as waiter:
        assert waiter.index == 0 and table.entry(0).pid == os.getpid()
    table.close()
    table.unlink()


def test_unlink_all_removes_every_semaphore_of_the_store_and_no_other(store_dir, tmp_path_factory):
    server = MailboxServer.create(store_dir, slot_count=3, data_bytes=1024, max_batch=2)
    table = WaiterTable.create(store_dir, entry_count=2)
    waiter = ConsumerWaiter.register(table, store_dir / "run")
    other_store = tmp_path_factory.mktemp("other")
    issue_shm_token(other_store)
    other = Wakeup.create(supervisor_wakeup_name(other_store))
    try:
        names = store_semaphores(store_dir)
        assert len(names) == 1 + 3 + 1  # sem-sup, sem-slot-0..2, the waiter's
        removed = unlink_all(store_dir)
        assert {"sem." + name[1:] for name in removed} == names
        assert store_semaphores(store_dir) == set()
        assert len(store_semaphores(other_store)) == 1
        assert unlink_all(store_dir) == []
    finally:
        other.unlink()
        other.close()
    waiter.wakeup.post()  # handles opened before the unlink keep working
    assert waiter.wakeup.wait(1.0)
    waiter.close()
    table.close()
    server.close()


@pytest.mark.slow
def test_reclaim_dead_clears_a_killed_consumer_entry_and_keeps_a_live_one(store_dir):
    """Liveness is the entry's flock, not the pid in a name: a name whose pid is alive (pid 1)
    in an entry nobody holds goes; the live consumer's entry and semaphore stay and still work."""
    table = WaiterTable.create(store_dir, entry_count=4)
    run_dir = store_dir / "run"
    live = ConsumerWaiter.register(table, run_dir)  # first: the child cannot take its entry
    child = SPAWN.Process(target=child_register_and_hang, args=(str(store_dir), str(run_dir)))
    child.start()
    wait_until(lambda: any(e.pid == child.pid for e in table.registered()), 30, "consumer registered")
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)
    dead_name = next(e.sem_name for e in table.registered() if e.pid == child.pid)
    free = ({0, 1, 2, 3} - {e.index for e in table.registered()}).pop()
    reused = Wakeup.create(waiter_wakeup_name(store_dir, free, 1))  # pid 1 lives: not proof
    reused.close()
    assert {dead_name, live.wakeup.name, reused.name} <= set(_names(waiter_wakeup_names(store_dir)))
    removed = table.reclaim_dead(run_dir)
    assert sorted(removed) == sorted([dead_name, reused.name])
    assert _names(waiter_wakeup_names(store_dir)) == [live.wakeup.name]
    assert [(e.index, e.pid) for e in table.registered()] == [(live.index, os.getpid())]
    table.waiting[live.index] = 1
    assert table.notify_waiters() == 1 and live.wakeup.wait(1.0)
    assert table.reclaim_dead(run_dir) == []
    live.close()
    table.close()
    table.unlink()


def test_register_removes_the_names_earlier_holders_left_in_its_entry(store_dir):
    table = WaiterTable.create(store_dir, entry_count=1)
    left = Wakeup.create(waiter_wakeup_name(store_dir, 0, 1))  # a holder that died, its pid reused
    left.close()
    with ConsumerWaiter.register(table, store_dir / "run") as waiter:
        assert _names(waiter_wakeup_names(store_dir)) == [waiter.wakeup.name]
    assert waiter_wakeup_names(store_dir) == {}
    table.close()
    table.unlink()


def _names(by_entry: dict[int, list[str]]) -> list[str]:
    return sorted(name for names in by_entry.values() for name in names)
