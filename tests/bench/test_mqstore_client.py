"""tools.bench.mqstore_client against a real store: batches cycling over several topics and
queues, sent with the blocking and the async columns call, arrive as the load generator made them."""

from __future__ import annotations

import pytest

from ipc.consumer import Consumer
from tests.workers.store_harness import assert_check_clean, start_store
from tools.bench.bench_body import BODY_HEADER, BODY_MAGIC, BatchBuilder
from tools.bench.mqstore_client import MqstoreSender, _topic_plans
from tools.bench.worker_records import WorkerSpec

STREAMS = (("bench-0", 0), ("bench-0", 1), ("bench-1", 0), ("bench-1", 1), ("bench-1", 2))


def test_topic_plans_split_a_cycling_batch_by_topic():
    plans = _topic_plans(STREAMS, 7)
    assert len(plans) == len(STREAMS)
    # a batch starting at stream 3: rows go to streams 3 4 0 1 2 3 4
    assert plans[3] == [("bench-1", [0, 1, 4, 5, 6], [1, 2, 0, 1, 2]), ("bench-0", [2, 3], [0, 1])]
    single = _topic_plans((("t", 0), ("t", 1)), 3)
    assert single == [[("t", None, [0, 1, 0])], [("t", None, [1, 0, 1])]]


@pytest.mark.slow
@pytest.mark.parametrize("inflight", [1, 3])
def test_batches_arrive_on_their_streams_with_their_keys(tmp_path, inflight):
    running = start_store(tmp_path / "store")
    try:
        spec = WorkerSpec(role="producer", backend="mqstore", worker_id=2, target=str(running.root),
                          streams=STREAMS, size_bytes=40, batch=7, keys=True, inflight=inflight)
        builder = BatchBuilder(spec, b"t" * (40 - BODY_HEADER.size))
        sender = MqstoreSender(spec)
        try:
            batches = [builder.build(j * 7, 1000 + j) for j in range(4)]
            expected = {body: (stream, key) for batch in batches
                        for body, stream, key in zip(batch.bodies, batch.streams, batch.keys, strict=True)}
            pendings = [sender.submit(batch) for batch in batches]
            assert [sender.result(p) for p in pendings] == [{"OK": 7}] * 4
            assert all(p.done_ns > 0 for p in pendings)
        finally:
            sender.close()
        running.wait_caught_up()
        got = {}
        with Consumer(running.root, "bench-test") as consumer:
            for topic, queue_id in STREAMS:
                for record in consumer.pull(topic, queue_id, 0, 100).messages:
                    got[record.body] = ((record.topic, record.queue_id), record.keys[0])
        assert got == expected
        assert {BODY_HEADER.unpack_from(b)[0] for b in got} == {BODY_MAGIC}
    finally:
        assert running.stop() == 0
    assert_check_clean(running.root)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 5])
def test_blocking_sends_of_one_topic_are_counted_without_a_future(tmp_path, batch):
    """--inflight 1 to one topic: Producer.send_columns, counted at once like the peers' sends."""
    running = start_store(tmp_path / "store")
    try:
        streams = (("solo", 0), ("solo", 1), ("solo", 3))
        spec = WorkerSpec(role="producer", backend="mqstore", worker_id=1, target=str(running.root),
                          streams=streams, size_bytes=40, batch=batch, keys=True)
        builder = BatchBuilder(spec, b"t" * (40 - BODY_HEADER.size))
        sender = MqstoreSender(spec)
        try:
            batches = [builder.build(j * batch, 1000 + j) for j in range(4)]
            pendings = [sender.submit(b) for b in batches]
            assert all(p.future is None and p.done_ns > 0 for p in pendings)
            assert [sender.result(p) for p in pendings] == [{"OK": batch}] * 4
        finally:
            sender.close()
        running.wait_caught_up()
        with Consumer(running.root, "bench-test") as consumer:
            got = {(record.body, record.queue_id, record.keys[0])
                   for _, queue_id in streams for record in consumer.pull("solo", queue_id, 0, 100).messages}
        assert got == {(body, stream[1], key) for b in batches
                       for body, stream, key in zip(b.bodies, b.streams, b.keys, strict=True)}
    finally:
        assert running.stop() == 0
    assert_check_clean(running.root)
