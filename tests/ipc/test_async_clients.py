"""ipc.async_producer.AsyncProducer and ipc.async_consumer.AsyncConsumer against a real
supervisor, under asyncio's loop and uvloop: sends in flight together, order per queue,
cancellation, a crash, bad input, the GUIDE's example."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import Future
from pathlib import Path

import pytest

from engine.errors import BadInputError, StoreClosedError
from engine.status import PutResult, PutStatus
from ipc.async_consumer import AsyncConsumer
from ipc.async_producer import AsyncProducer, _settle
from ipc.consumer import Consumer
from tests.workers.store_harness import assert_check_clean, module_store, start_store

try:
    import uvloop
except ImportError:  # a machine without uvloop still tests asyncio's own loop
    uvloop = None

LOOPS = ["asyncio", pytest.param("uvloop", marks=pytest.mark.skipif(uvloop is None, reason="no uvloop"))]
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "GUIDE.md"


def run_in(loop_name: str, main):
    """Run the coroutine `main` under the named event loop."""
    if loop_name == "uvloop":
        return uvloop.run(main)
    return asyncio.run(main)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    yield from module_store(tmp_path_factory.mktemp("async") / "store")


def queue_ends(root: Path, topic: str) -> list[int]:
    with Consumer(root, "ends") as consumer:
        return [consumer._queue_end(topic, queue_id) for queue_id in range(consumer.info.queue_count)]


@pytest.mark.slow
@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_thousand_sends_64_in_flight_consumed_in_order_per_queue_under_one_loop(store, loop_name):
    topic, count, in_flight = f"ASYNC-{loop_name}", 1000, 64

    async def main():
        threads_before = threading.active_count()
        async with AsyncProducer(store.root) as producer, AsyncConsumer(store.root, "async") as consumer:
            received: list = []

            async def consume():
                async for record in consumer.messages(topic, poll_timeout_ms=200):
                    received.append(record)
                    if len(received) == count:
                        return

            reader = asyncio.create_task(consume())
            room = asyncio.Semaphore(in_flight)
            most_threads = 0

            async def send(i: int) -> PutResult:
                nonlocal most_threads
                async with room:
                    sending = producer.send(topic, f"m-{i}".encode(), keys=f"k-{i}")
                    most_threads = max(most_threads, threading.active_count())
                    return await sending

            results = await asyncio.gather(*(send(i) for i in range(count)))
            await asyncio.wait_for(reader, timeout=60)
        # the producer's sender thread and the consumer's wait thread: none per pending send
        assert most_threads <= threads_before + 2
        return results, received

    results, received = run_in(loop_name, main())
    assert {r.status for r in results} == {PutStatus.PUT_OK}
    stored = defaultdict(list)  # queue id -> bodies in queue-offset order, from the acks
    for i, result in sorted(enumerate(results), key=lambda pair: pair[1].queue_offset):
        stored[result.queue_id].append(f"m-{i}".encode())
    read = defaultdict(list)
    for record in received:
        read[record.queue_id].append(record.body)
    assert read == stored
    for queue_id in read:  # offsets were consumed gap-free, in order
        offsets = [r.queue_offset for r in received if r.queue_id == queue_id]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))


@pytest.mark.slow
def test_the_sends_of_one_loop_turn_go_in_one_request(store):
    # GIL hand-offs as often as possible: enqueued one by one, the sender thread would take the
    # first send while the loop still runs the other 63 tasks' first steps
    switch_interval_s = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        counts, results = asyncio.run(_sends_of_one_turn(store.root))
    finally:
        sys.setswitchinterval(switch_interval_s)
    assert all(result.ok for result in results)
    assert counts == [64]


async def _sends_of_one_turn(root: Path) -> tuple[list[int], list[PutResult]]:
    """The record count of each request that 64 sends made in one loop turn."""
    async with AsyncProducer(root) as producer:
        await producer.send("TURN", b"warm")  # attached, idle: the next turn starts clean
        slot = producer.producer._sender.slot
        counts: list[int] = []
        write_request = slot.write_request

        def counted(data, *, count, flags):
            counts.append(count)
            return write_request(data, count=count, flags=flags)

        slot.write_request = counted
        results = await asyncio.gather(*(producer.send("TURN", f"t-{i}".encode()) for i in range(64)))
    return counts, results


@pytest.mark.slow
@pytest.mark.parametrize("loop_name", LOOPS)
def test_a_cancelled_send_is_still_stored_whole_and_its_result_dropped(store, loop_name, caplog):
    topic, count = f"CANCEL-{loop_name}", 200

    async def main():
        async with AsyncProducer(store.root) as producer:
            tasks = [asyncio.create_task(producer.send(topic, f"c-{i}".encode())) for i in range(count)]
            await asyncio.sleep(0)  # one loop turn: every task hands its records to the sender thread
            for task in tasks[::2]:
                task.cancel()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            await producer.flush()  # the cancelled sends' answers too
        return outcomes

    with caplog.at_level(logging.WARNING, logger="ipc.async_producer"):
        outcomes = run_in(loop_name, main())
    cancelled = [i for i, o in enumerate(outcomes) if isinstance(o, asyncio.CancelledError)]
    assert len(cancelled) >= count // 4, "the cancellations came too late to test anything"
    assert all(o.ok for o in outcomes if isinstance(o, PutResult))
    assert not caplog.records  # every cancelled send was answered PUT_OK: nothing to warn about
    store.wait_caught_up()
    bodies = []
    with Consumer(store.root, "cancel-check") as consumer:
        for record in consumer.iterate(topic):  # `pull` path: every record's CRCs are checked
            bodies.append(record.body)
    assert sorted(bodies) == sorted(f"c-{i}".encode() for i in range(count))


@pytest.mark.slow
def test_cancelled_sends_in_flight_at_a_crash_are_outcome_unknown_and_the_store_checks_clean(
        tmp_path, caplog):
    running = start_store(tmp_path / "store")

    async def main():
        nonlocal running
        async with AsyncProducer(running.root, reattach_timeout_s=60) as producer:
            assert (await producer.send("CRASH", b"warm-up", queue_id=0)).ok
            os.kill(running.proc.pid, signal.SIGSTOP)  # the request below stays unanswered
            tasks = [asyncio.create_task(producer.send("CRASH", f"x-{i}".encode(), queue_id=0))
                     for i in range(16)]
            mailbox, index = producer.producer._mailbox, producer.producer._sender.slot.index
            deadline = time.monotonic() + 30
            while mailbox.req_seq[index] <= mailbox.resp_seq[index]:  # published, whole
                assert time.monotonic() < deadline, "the request was never published"
                await asyncio.sleep(0.01)
            for task in tasks:
                task.cancel()
            running.kill()
            running = start_store(running.root)
            await asyncio.wait_for(producer.flush(), timeout=60)
            return await asyncio.gather(*tasks, return_exceptions=True)

    try:
        with caplog.at_level(logging.WARNING, logger="ipc.async_producer"):
            outcomes = asyncio.run(main())
    finally:
        assert running.stop() == 0
    assert all(isinstance(outcome, asyncio.CancelledError) for outcome in outcomes)
    assert "OUTCOME_UNKNOWN" in caplog.text  # the published request: maybe stored, never twice
    assert_check_clean(running.root)


def test_a_cancelled_send_answered_outcome_unknown_is_logged(caplog):
    async def main():
        waiter = asyncio.get_running_loop().create_future()
        waiter.cancel()
        answered: Future = Future()
        answered.set_result(PutResult(PutStatus.OUTCOME_UNKNOWN, reason="the supervisor exited"))
        _settle(answered, waiter)

    with caplog.at_level(logging.WARNING, logger="ipc.async_producer"):
        asyncio.run(main())
    assert "OUTCOME_UNKNOWN" in caplog.text


@pytest.mark.slow
def test_bad_input_raises_or_is_refused_before_anything_is_sent(store):
    topic = "ASYNC-BAD"
    before = queue_ends(store.root, topic)

    async def main():
        async with AsyncProducer(store.root) as producer:
            with pytest.raises(BadInputError, match="bodies"):
                await producer.send_columns(topic, [b"fine", "not bytes"])
            refused = await producer.send("bad topic with spaces", b"x")
            assert refused.status is PutStatus.MESSAGE_ILLEGAL and refused.reason
        with pytest.raises(StoreClosedError):
            await producer.send(topic, b"after close")
        async with AsyncConsumer(store.root, "async-bad") as consumer:
            with pytest.raises(BadInputError, match="poll_timeout_ms"):
                await consumer.messages(topic, poll_timeout_ms=0).__anext__()

    asyncio.run(main())
    with pytest.raises(RuntimeError, match="no running event loop"):
        AsyncProducer(store.root)
    store.wait_caught_up()
    assert queue_ends(store.root, topic) == before


@pytest.mark.slow
def test_the_guide_asyncio_example_runs_and_prints_what_it_sent(store, capsys):
    blocks = re.findall(r"^```python\n(.*?)^```", GUIDE.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL)
    example = next(block for block in blocks if "AsyncProducer" in block)
    code = example.replace('"./data"', repr(str(store.root)))
    exec(compile(code, str(GUIDE), "exec"), {"__name__": "guide"})
    printed = capsys.readouterr().out.split()
    assert printed[:1] == ["PUT_OK"] and printed[-3:] == ["b'job-0'", "b'job-1'", "b'job-2'"], printed
