"""Clients across a restart of the store and across os.fork(), against real supervisors
(ipc.reattach, ipc.slot_sender, ipc.producer, ipc.consumer)."""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time

import pytest

from engine.errors import BadInputError, ServiceNotAvailableError
from engine.status import GetStatus, PutStatus
from ipc import slot_claim
from ipc.consumer import Consumer
from ipc.mailbox import SlotState
from ipc.producer import Producer
from ipc.run_info import run_dir
from tests.workers.store_harness import assert_check_clean, start_store, wait_for

pytestmark = pytest.mark.slow

CHILD_DEADLINE_S = 60.0


def body_at(consumer: Consumer, topic: str, queue_id: int, queue_offset: int) -> bytes:
    result = consumer.pull(topic, queue_id, queue_offset, max_count=1, timeout_ms=10_000)
    assert result.status is GetStatus.FOUND, result
    return result.messages[0].body


def test_producer_and_consumer_keep_working_across_stop_and_start(tmp_path):
    running = start_store(tmp_path / "store")
    producer = Producer(running.root, reattach_timeout_s=60)
    consumer = Consumer(running.root, "across", reattach_timeout_s=60)
    try:
        first = producer.send("ACROSS", b"before", queue_id=0)
        assert first.ok
        assert body_at(consumer, "ACROSS", 0, first.queue_offset) == b"before"
        assert running.stop() == 0
        during: list = []  # sent while no supervisor runs: it waits for the next one
        sender = threading.Thread(target=lambda: during.append(
            producer.send("ACROSS", b"during", queue_id=0)))
        sender.start()
        running = start_store(running.root)
        sender.join(60)
        assert during and during[0].ok, during
        after = producer.send("ACROSS", b"after", queue_id=0)
        assert after.ok and after.queue_offset == first.queue_offset + 2
        running.wait_caught_up()
        pulled = consumer.pull("ACROSS", 0, first.queue_offset, max_count=10)
        assert [r.body for r in pulled.messages] == [b"before", b"during", b"after"]
    finally:
        producer.close()
        consumer.close()
        assert running.stop() == 0
    assert_check_clean(running.root)


def test_kill_9_request_in_flight_gets_outcome_unknown_then_the_producer_reattaches(tmp_path):
    running = start_store(tmp_path / "store")
    producer = Producer(running.root, reattach_timeout_s=60)
    consumer = Consumer(running.root, "killed", reattach_timeout_s=60)
    try:
        assert producer.send("KILL9", b"warm-up", queue_id=0).ok
        running.wait_caught_up()
        polled: list = []  # a long poll that spans the kill and the restart
        poller = threading.Thread(target=lambda: polled.append(
            consumer.pull("KILL9", 1, 0, timeout_ms=60_000)))
        poller.start()
        os.kill(running.proc.pid, signal.SIGSTOP)
        in_flight = producer.send_async("KILL9", b"in flight", queue_id=0)
        sender = producer._sender
        wait_for(lambda: sender.mailbox.req_seq[sender.slot.index] > sender.mailbox.resp_seq[
            sender.slot.index], "the request to be published")
        queued = producer.send_async("KILL9", b"queued", queue_id=0)  # behind it, unpublished
        running.kill()
        running = start_store(running.root)
        lost = in_flight.result(timeout=60)
        assert lost.status is PutStatus.OUTCOME_UNKNOWN, lost
        assert "may or may not be stored" in lost.reason and lost.commit_pos is None
        assert queued.result(timeout=60).ok  # never published: sent to the new supervisor
        assert producer.send("KILL9", b"after", queue_id=1).ok
        poller.join(60)
        assert polled and polled[0].status is GetStatus.FOUND, polled
        assert polled[0].messages[0].body == b"after"
    finally:
        producer.close()
        consumer.close()
        assert running.stop() == 0
    assert_check_clean(running.root)


def test_no_new_supervisor_ends_the_wait_with_a_clear_error_at_the_bound(tmp_path):
    running = start_store(tmp_path / "store")
    producer = Producer(running.root, reattach_timeout_s=1.0)
    consumer = Consumer(running.root, "bound", reattach_timeout_s=1.0)
    try:
        assert producer.send("BOUND", b"x", queue_id=0).ok
        assert running.stop() == 0
        started = time.monotonic()
        futures = [producer.send_async("BOUND", b"y", queue_id=0) for _ in range(5)]
        results = [future.result(timeout=30) for future in futures]
        elapsed = time.monotonic() - started
        assert {r.status for r in results} == {PutStatus.SERVICE_NOT_AVAILABLE}
        assert all("within reattach_timeout_s = 1 s" in r.reason for r in results), results
        assert 1.0 <= elapsed < 5.0  # one wait for the whole queue, not one per request
        started = time.monotonic()
        with pytest.raises(ServiceNotAvailableError, match="within reattach_timeout_s = 1 s"):
            consumer.pull("BOUND", 0, 0)
        assert time.monotonic() - started >= 1.0
    finally:
        producer.close()
        consumer.close()
    assert_check_clean(running.root)


@pytest.mark.parametrize("bad", [-1, "30", True, float("nan"), 10**9])
def test_bad_reattach_timeout_is_refused(tmp_path, bad):
    with pytest.raises(BadInputError, match="reattach_timeout_s"):
        Producer(tmp_path, reattach_timeout_s=bad)
    with pytest.raises(BadInputError, match="reattach_timeout_s"):
        Consumer(tmp_path, "g", reattach_timeout_s=bad)


def _read_child_report(read_fd: int, pid: int) -> dict:
    """The JSON a forked child wrote before exiting; fails (and kills it) past the deadline."""
    chunks, deadline = [], time.monotonic() + CHILD_DEADLINE_S
    while True:
        ready, _, _ = select.select([read_fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child did not report in time")
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(b"".join(chunks))


def _fork_child(work) -> tuple[int, int]:
    """Fork; the child runs `work()`, writes its JSON result to a pipe and _exits."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        code = 1
        try:
            os.close(read_fd)
            os.write(write_fd, json.dumps(work()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    return read_fd, pid


def test_fork_child_sends_on_its_own_slot_and_no_answer_is_mixed_up(tmp_path):
    running = start_store(tmp_path / "store")
    try:
        with Producer(running.root) as producer:
            assert producer.send("FORK", b"parent-0", queue_id=0).ok
            parent_slot = producer._sender.slot.index

            def child_work():
                results = [producer.send("FORK", f"child-{i}".encode(), queue_id=1) for i in range(50)]
                report = {"slot": producer._sender.slot.index,
                          "results": [[r.status.name, r.queue_offset] for r in results]}
                producer.close()
                return report

            read_fd, pid = _fork_child(child_work)
            parent = [producer.send("FORK", f"parent-{i}".encode(), queue_id=0) for i in range(1, 51)]
            report = _read_child_report(read_fd, pid)
            assert report["slot"] != parent_slot
            assert [status for status, _ in report["results"]] == ["PUT_OK"] * 50
            assert all(r.ok for r in parent), [r for r in parent if not r.ok]
            assert producer.send("FORK", b"parent-after", queue_id=0).ok
        running.wait_caught_up()
        with Consumer(running.root, "fork") as consumer:  # every answer names its own message
            for i, result in enumerate(parent, start=1):
                assert body_at(consumer, "FORK", 0, result.queue_offset) == f"parent-{i}".encode()
            for i, (_, queue_offset) in enumerate(report["results"]):
                assert body_at(consumer, "FORK", 1, queue_offset) == f"child-{i}".encode()
            assert consumer.pull("FORK", 1, 0, max_count=100).max_offset == 50
    finally:
        assert running.stop() == 0
    assert_check_clean(running.root)


def test_fork_child_closing_the_inherited_producer_leaves_the_parent_slot_alone(tmp_path):
    running = start_store(tmp_path / "store")
    try:
        with Producer(running.root) as producer:
            assert producer.send("FORKCLOSE", b"before").ok
            slot = producer._sender.slot.index

            def child_work():
                producer.close()
                return {}

            read_fd, pid = _fork_child(child_work)
            _read_child_report(read_fd, pid)
            assert slot_claim.is_slot_owner_alive(run_dir(running.root), slot)
            assert producer._sender.mailbox.state[slot] == SlotState.CLAIMED
            assert producer.send("FORKCLOSE", b"after").ok
    finally:
        assert running.stop() == 0
    assert_check_clean(running.root)


def test_fork_child_consumer_waits_on_its_own_entry_and_leaves_the_parents(tmp_path):
    running = start_store(tmp_path / "store")
    try:
        with Consumer(running.root, "forkc") as consumer, Producer(running.root) as producer:
            assert consumer.wait_for_more(consumer.dispatched_pos, 10) is False  # registers
            parent_entry = consumer._waiter.index

            def child_work():
                bound = consumer.dispatched_pos
                with Producer(running.root) as child_producer:
                    timer = threading.Timer(0.2, lambda: child_producer.send("FORKC", b"child", queue_id=0))
                    timer.start()
                    woke = consumer.wait_for_more(bound, 10_000)
                    timer.join()
                entry = consumer._waiter.index
                consumer.close()
                return {"woke": woke, "entry": entry}

            read_fd, pid = _fork_child(child_work)
            report = _read_child_report(read_fd, pid)
            assert report == {"woke": True, "entry": report["entry"]} and report["entry"] != parent_entry
            bound = consumer.dispatched_pos
            timer = threading.Timer(0.2, lambda: producer.send("FORKC", b"parent", queue_id=0))
            timer.start()
            assert consumer.wait_for_more(bound, 10_000) is True  # its own entry still wakes it
            timer.join()
            assert consumer._waiter.index == parent_entry
    finally:
        assert running.stop() == 0
    assert_check_clean(running.root)
