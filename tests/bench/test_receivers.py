"""The consumer side of the bench: intended send times read from body heads (whole-array) equal
the per-body reading, and MqstoreReceiver (Consumer.pull_columns) returns what was stored."""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest

from engine.status import PutStatus
from ipc.producer import Producer
from tests.workers.store_harness import assert_check_clean, start_store
from tools.bench.bench_body import BODY_HEADER, build_batch, intended_times, intended_times_of_heads
from tools.bench.interval_recorder import IntervalRecorder
from tools.bench.loadgen import run_consumer
from tools.bench.mqstore_client import MqstoreReceiver
from tools.bench.worker_records import NOTHING_RECEIVED, Received, WorkerSpec

STREAMS = (("bench-r", 0), ("bench-r", 1))


def heads_of(bodies: list[bytes]) -> np.ndarray:
    long_enough = [b[:BODY_HEADER.size] for b in bodies if len(b) >= BODY_HEADER.size]
    return np.frombuffer(b"".join(long_enough), dtype=np.uint8).reshape(len(long_enough), BODY_HEADER.size)


def test_intended_times_of_heads_equal_intended_times():
    spec = WorkerSpec(role="producer", backend="mqstore", worker_id=4, target="-", streams=STREAMS,
                      size_bytes=40, batch=6)
    bodies = [*build_batch(spec, 0, 777, bytes(16)).bodies, b"x" * 40, b"short",
              *build_batch(spec, 6, 888, bytes(16)).bodies]
    got = intended_times_of_heads(heads_of(bodies))
    assert got.dtype == np.int64 and got.tolist() == intended_times(bodies).tolist() == [777] * 6 + [888] * 6
    assert intended_times_of_heads(np.zeros((0, BODY_HEADER.size), dtype=np.uint8)).tolist() == []


@pytest.mark.slow
def test_mqstore_receiver_counts_every_message_and_stamps_bench_bodies(tmp_path):
    running = start_store(tmp_path / "store")
    try:
        spec = WorkerSpec(role="producer", backend="mqstore", worker_id=1, target=str(running.root),
                          streams=STREAMS, size_bytes=40, batch=50)
        with Producer(running.root) as producer:
            for j in range(4):
                batch = build_batch(spec, j * 50, 1000 + j, bytes(16))
                queue_ids = [q for _, q in batch.streams]
                result = producer.send_columns("bench-r", batch.bodies, queue_ids=queue_ids)
                assert result.status_counts() == {PutStatus.PUT_OK: 50}
            assert producer.send("bench-r", b"not a bench body", queue_id=0).ok
        running.wait_caught_up()
        receiver = MqstoreReceiver(WorkerSpec(role="consumer", backend="mqstore", worker_id=9,
                                              target=str(running.root), streams=STREAMS, pull_count=64,
                                              consume_from="start"))
        try:
            assert receiver.backlog_at_start_msgs == 201
            count, stamps = 0, []
            while True:
                before_ns = time.monotonic_ns()
                got = receiver.poll(0.0)
                if not got.count:
                    break
                count += got.count
                stamps += got.intended_ns.tolist()
                arrived = got.received_ns  # each message when its own pull returned
                assert len(arrived) == len(got.intended_ns)
                assert before_ns <= arrived.min() and arrived.max() <= time.monotonic_ns()
                assert (np.diff(arrived) >= 0).all() and len(set(arrived.tolist())) == len(STREAMS)
            assert count == 201
            assert sorted(stamps) == sorted([1000 + j for j in range(4) for _ in range(50)])
            assert receiver.poll(0.2).count == 0  # waited, nothing came
        finally:
            receiver.close()
    finally:
        assert running.stop() == 0
    assert_check_clean(running.root)


@pytest.mark.slow
def test_run_consumer_reports_when_it_caught_up_with_a_backlog(tmp_path):
    running = start_store(tmp_path / "store")
    try:
        with Producer(running.root) as producer:
            result = producer.send_columns("bench-r", [b"m%d" % i for i in range(300)],
                                           queue_ids=[i % 2 for i in range(300)])
            assert result.status_counts() == {PutStatus.PUT_OK: 300}
        running.wait_caught_up()
        spec = WorkerSpec(role="consumer", backend="mqstore", worker_id=3, target=str(running.root),
                          streams=STREAMS, pull_count=64, consume_from="start", seconds=1.0)
        from_end = MqstoreReceiver(dataclasses.replace(spec, consume_from="end"))
        try:
            assert from_end.backlog_at_start_msgs == 0 and set(from_end.offsets.values()) == {150}
            from_end.offsets[STREAMS[0]] = 10**6  # past the end: the sweep moves it back
            assert from_end._sweep()[0::3] == (0, True) and from_end.offsets[STREAMS[0]] == 150
            assert from_end._sweep()[0::3] == (0, False)
        finally:
            from_end.close()
        receiver = MqstoreReceiver(spec)
        events: list[dict] = []
        drain, stop = threading.Event(), threading.Event()
        drain.set()  # read what is there, then stop at the first empty sweep
        started_ns = time.monotonic_ns()
        recorder = IntervalRecorder(started_ns, 10**9, spec.interval_count, events.append)
        try:
            assert receiver.backlog_at_start_msgs == 300
            caught_up_ns = run_consumer(spec, receiver, recorder, drain=drain, stop=stop)
        finally:
            receiver.close()
        assert recorder.total_msgs == 300
        assert started_ns < caught_up_ns < time.monotonic_ns()
        assert sum(e["msgs"] for e in events) == 300
    finally:
        assert running.stop() == 0
    assert_check_clean(running.root)


class ScriptedReceiver:
    """Answers polls from a script (a Received, or an exception to raise); then sets `drain`
    and finds nothing."""

    def __init__(self, script: list, drain: threading.Event):
        self.script, self.drain = list(script), drain
        self.began_ns: list[int] = []

    def poll(self, timeout_s: float) -> Received:
        self.began_ns.append(time.monotonic_ns())
        if not self.script:
            self.drain.set()
            return NOTHING_RECEIVED
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step


def test_run_consumer_keeps_the_first_empty_poll_and_not_a_failed_one():
    spec = WorkerSpec(role="consumer", backend="mqstore", worker_id=0, target="-", streams=STREAMS,
                      consume_from="start", seconds=1.0)
    some = Received(2, np.array([1, 2], dtype=np.int64))
    drain, stop = threading.Event(), threading.Event()
    receiver = ScriptedReceiver([some, OSError("gone for a moment"), some, NOTHING_RECEIVED, some], drain)
    recorder = IntervalRecorder(time.monotonic_ns(), 10**9, spec.interval_count, lambda event: None)
    caught_up_ns = run_consumer(spec, receiver, recorder, drain=drain, stop=stop)
    # the empty poll is the fourth; the failed one (the second) did not count as empty
    assert receiver.began_ns[2] < caught_up_ns <= receiver.began_ns[3]
    assert recorder.total_msgs == 6 and recorder.total_errors == {"OSError": 1}
