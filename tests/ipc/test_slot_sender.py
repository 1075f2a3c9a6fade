"""ipc.slot_sender's sends from the caller's thread (send_or_enqueue) against a real
supervisor: who sends, what queues behind it, close() during it, many threads racing for the
slot, and a caller interrupted while it waits."""

from __future__ import annotations

import _thread
import os
import signal
import threading

import pytest

from engine.status import PutStatus
from ipc.producer import Producer
from ipc.slot_sender import Pending
from tests.workers.store_harness import module_store, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    yield from module_store(tmp_path_factory.mktemp("slot-sender") / "store")


def test_a_blocking_send_with_nothing_in_flight_goes_from_the_callers_thread(store):
    """send_or_enqueue sends from the caller's thread when the slot is idle; with a request in
    flight it queues for the sender thread, and both answers arrive."""
    with Producer(store.root) as producer:
        sender = producer._sender
        threads: list[str] = []
        gate = threading.Event()
        held = sender.enqueue  # an async send whose answer the sender thread delivers

        def record_thread(where, rows, reason):
            threads.append(threading.current_thread().name)

        def pending(body: bytes, deliver) -> Pending:
            encoded = producer._encode_columns("BLOCK", [body], None, None, 0)
            return Pending(encoded, deliver, True)

        sender.send_or_enqueue([pending(b"idle", record_thread)])
        assert threads == [threading.current_thread().name]

        def stall(where, rows, reason):  # the sender thread stays busy until the gate opens
            threads.append(threading.current_thread().name)
            gate.wait(30)

        held([pending(b"busy", stall)])
        wait_for(lambda: len(threads) == 2, "the sender thread to take the first request")
        done = threading.Thread(target=lambda: sender.send_or_enqueue([pending(b"queued", record_thread)]))
        done.start()
        wait_for(lambda: len(sender.queue) == 1, "the blocking send to queue behind the busy slot")
        gate.set()
        done.join(30)
        wait_for(lambda: len(threads) == 3, "the queued send's answer")
        assert threads == [threading.current_thread().name, "mqstore-producer", "mqstore-producer"]


def test_records_queued_behind_a_callers_send_go_when_it_is_answered(store):
    """The sender thread is woken when a caller's own send frees the slot only if records are
    queued: those queued meanwhile must still go (the idle sender thread is left asleep)."""
    with Producer(store.root) as producer:
        sender = producer._sender
        gate, taken = threading.Event(), threading.Event()
        answers: list[str] = []

        def pending(body: bytes, deliver) -> Pending:
            encoded = producer._encode_columns("BEHIND", [body], None, None, 0)
            return Pending(encoded, deliver, True)

        def stall(where, rows, reason):  # the caller's thread holds the slot until the gate opens
            taken.set()
            gate.wait(30)
            answers.append("caller")

        caller = threading.Thread(target=lambda: sender.send_or_enqueue([pending(b"own", stall)]))
        caller.start()
        assert taken.wait(30)
        sender.enqueue([pending(b"queued", lambda where, rows, reason: answers.append("queued"))])
        assert len(sender.queue) == 1  # the slot is busy: it waits for the caller's send
        gate.set()
        caller.join(30)
        wait_for(lambda: answers == ["caller", "queued"], "the queued send to go after the caller's")


def test_close_during_a_callers_send_returns_once_that_send_is_answered(store):
    """close() waits for a send from a caller's thread that holds the slot, and is woken when it
    is answered (nothing queued: only close waits for it)."""
    producer = Producer(store.root)
    sender = producer._sender
    gate, taken = threading.Event(), threading.Event()

    def stall(where, rows, reason):
        taken.set()
        gate.wait(30)

    encoded = producer._encode_columns("CLOSING", [b"own"], None, None, 0)
    caller = threading.Thread(target=lambda: sender.send_or_enqueue([Pending(encoded, stall, True)]))
    caller.start()
    assert taken.wait(30)
    closer = threading.Thread(target=producer.close)
    closer.start()
    wait_for(lambda: sender.closing, "close() to begin")
    assert closer.is_alive()  # the slot is still busy with the caller's send
    gate.set()
    caller.join(30)
    closer.join(30)
    assert not closer.is_alive(), "close() was not woken when the caller's send was answered"


def test_blocking_sends_from_many_threads_beside_async_ones_are_all_stored_once(store):
    """Blocking sends race the sender thread for the slot: every message is stored exactly
    once, each queue's offsets are dense, and a batch larger than a request goes in several."""
    with Producer(store.root) as producer:
        big = producer._mailbox.max_batch + 7
        results: list = []

        def blocking(t):
            for i in range(60):
                results.append(producer.send("RACE", f"b{t}-{i}".encode(), queue_id=t % 2))

        def async_sends():
            futures = [producer.send_async("RACE", f"a-{i}".encode(), queue_id=i % 2) for i in range(200)]
            results.extend(f.result(timeout=60) for f in futures)

        threads = [threading.Thread(target=blocking, args=(t,)) for t in range(4)]
        threads.append(threading.Thread(target=async_sends))
        for thread in threads:
            thread.start()
        batch = producer.send_columns("RACE", [b"c%d" % i for i in range(big)], queue_ids=1)
        for thread in threads:
            thread.join(120)
    assert batch.ok and len(batch) == big
    assert {r.status for r in results} == {PutStatus.PUT_OK} and len(results) == 440
    offsets = {q: sorted([r.queue_offset for r in results if r.queue_id == q] +
                         (batch.queue_offset.tolist() if q == 1 else [])) for q in (0, 1)}
    for q, got in offsets.items():
        assert got == list(range(got[0], got[0] + len(got))), q  # dense: none lost or doubled


def test_a_caller_interrupted_while_waiting_leaves_the_producer_usable(store):
    """Ctrl-C (KeyboardInterrupt) in a blocking send that waits in the caller's thread: the
    request stays in flight in the slot; the next send waits for its answer first instead of
    finding the slot busy."""
    with Producer(store.root) as producer, store.ctl() as ctl:
        assert producer.send("INTR", b"warm").status is PutStatus.PUT_OK
        os.kill(ctl.supervisor_pid, signal.SIGSTOP)
        try:
            timer = threading.Timer(0.3, _thread.interrupt_main)
            timer.start()
            with pytest.raises(KeyboardInterrupt):
                producer.send("INTR", b"interrupted")
            timer.join()
        finally:
            os.kill(ctl.supervisor_pid, signal.SIGCONT)
        result = producer.send("INTR", b"after")
    assert result.status is PutStatus.PUT_OK, result


def test_request_now_sends_one_request_when_idle_and_declines_when_busy_or_too_big(store):
    """request_now answers an idle slot's request in the caller's thread; with a request in
    flight, or more records than one request holds, it sends nothing and returns None."""
    with Producer(store.root) as producer:
        sender = producer._sender
        encoded = producer._encode_columns("NOW", [b"a", b"b"], None, None, 1)
        rows, reason = sender.request_now(encoded.buf, 2)
        assert reason is None and rows["status"].tolist() == [PutStatus.PUT_OK] * 2
        assert rows["queue_offset"].tolist() == [0, 1] and rows["queue_id"].tolist() == [1, 1]
        assert sender.request_now(encoded.buf, sender.mailbox.max_batch + 1) is None
        gate, taken = threading.Event(), threading.Event()

        def stall(where, rows, reason):  # the sender thread holds the slot until the gate opens
            taken.set()
            gate.wait(30)

        sender.enqueue([Pending(producer._encode_columns("NOW", [b"c"], None, None, 1), stall, True)])
        assert taken.wait(30)
        try:
            assert sender.request_now(encoded.buf, 2) is None
        finally:
            gate.set()
        result = producer.send_columns("NOW", [b"d"], queue_ids=1)
        assert result.ok and result.queue_offset.tolist() == [3]  # "c" went, nothing twice
