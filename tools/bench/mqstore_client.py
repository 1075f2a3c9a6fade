"""The mqstore side of a bench worker: the real ipc Producer and Consumer.

MqstoreSender sends each batch with Producer.send_columns_async, one call per topic of the
batch (no Message or PutResult per message: the answer is counted from its numpy status
column), and stamps the completion time in the future's callback (the producer's sender
thread), so the latency does not include the time the worker's main loop took to notice. With
one send in flight (--inflight 1, the default) a one-topic batch goes through the blocking
Producer.send_columns instead, as a caller that waits for each acknowledgement would send it,
and is counted at once, with no Future: the Redis and SQLite peers' bookkeeping per send.
MqstoreReceiver pulls its (topic, queue) streams with Consumer.pull_columns (numpy columns) and,
when a sweep finds nothing, long-polls with Consumer.wait_for_more across all of them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future

import numpy as np

from engine.status import GetStatus, PutStatus
from ipc.batch_result import BatchResult
from ipc.consumer import Consumer
from ipc.producer import Producer
from tools.bench.bench_body import BODY_HEADER, intended_times_of_heads
from tools.bench.worker_records import NOTHING_RECEIVED, Pending, Received, SendBatch, WorkerSpec

MOVES = (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY, GetStatus.NO_MATCHED_MESSAGE)


class MqstoreSender:
    """Sends through ipc.producer.Producer.send_columns_async, one call per topic of a batch."""

    def __init__(self, spec: WorkerSpec):
        self.producer = Producer(spec.target)
        self._plans = _topic_plans(spec.streams, spec.batch)
        # per first stream, (topic, queue ids) when the whole batch goes to one topic and is sent
        # blocking (--inflight 1): the send-and-wait shape, sent without _split
        self._blocking_whole = [(plan[0][0], plan[0][2]) if spec.inflight == 1 and len(plan) == 1 else None
                                for plan in self._plans]

    def submit(self, batch: SendBatch) -> Pending:
        whole = self._blocking_whole[batch.first_stream]
        if whole is not None:
            bodies = batch.bodies
            result = self.producer.send_columns(whole[0], bodies, keys=batch.key_column, queue_ids=whole[1])
            pending = Pending(len(bodies))
            pending.stamp()
            pending.statuses = {"OK": len(bodies)} if result.ok else _counts((result,))
            return pending
        futures = [self.producer.send_columns_async(topic, bodies, keys=keys, queue_ids=queue_ids)
                   for topic, bodies, keys, queue_ids in self._split(batch)]
        future = futures[0] if len(futures) == 1 else _all_of(futures)
        pending = Pending(len(batch.bodies), future)
        future.add_done_callback(pending.stamp)
        return pending

    def _split(self, batch: SendBatch) -> list[tuple[str, list[bytes], list[str] | None, list[int]]]:
        """(topic, bodies, keys, queue ids) of each topic the batch goes to."""
        parts = []
        for topic, rows, queue_ids in self._plans[batch.first_stream]:
            bodies, keys = batch.bodies, batch.key_column
            if rows is not None:
                bodies = [bodies[i] for i in rows]
                keys = [keys[i] for i in rows] if keys is not None else None
            parts.append((topic, bodies, keys, queue_ids))
        return parts

    def result(self, pending: Pending) -> dict[str, int]:
        if pending.statuses is not None:  # sent blocking, counted by submit
            return pending.statuses
        results = pending.future.result()
        if not pending.done_ns:  # Future wakes result() before it runs the stamping callback
            pending.stamp()
        return _counts(results if isinstance(results, list) else [results])

    def close(self) -> None:
        self.producer.close()


def _counts(results: Sequence[BatchResult]) -> dict[str, int]:
    """Messages per status name ("OK" for PUT_OK), from the results' status columns."""
    counts: dict[str, int] = {}
    for result in results:
        for status, count in result.status_counts().items():
            name = "OK" if status is PutStatus.PUT_OK else status.name
            counts[name] = counts.get(name, 0) + count
    return counts


def _topic_plans(streams: tuple[tuple[str, int], ...], batch: int
                 ) -> list[list[tuple[str, list[int] | None, list[int]]]]:
    """For a batch whose first message goes to streams[s], plans[s] lists per topic: the rows of
    the batch that go to it (None: all) and their queue ids (messages cycle over the streams)."""
    plans = []
    for first in range(len(streams)):
        by_topic: dict[str, tuple[list[int], list[int]]] = {}
        for row in range(batch):
            topic, queue_id = streams[(first + row) % len(streams)]
            rows, queue_ids = by_topic.setdefault(topic, ([], []))
            rows.append(row)
            queue_ids.append(queue_id)
        plans.append([(topic, rows if len(by_topic) > 1 else None, queue_ids)
                      for topic, (rows, queue_ids) in by_topic.items()])
    return plans


def _all_of(futures: list[Future]) -> Future:
    """A Future of the list of the futures' results, resolved when the last one is."""
    combined: Future = Future()
    left = [len(futures)]
    lock = threading.Lock()

    def one_done(_future: Future) -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            try:
                combined.set_result([f.result() for f in futures])
            except Exception as exc:
                combined.set_exception(exc)

    for future in futures:
        future.add_done_callback(one_done)
    return combined


class MqstoreReceiver:
    """Pulls its (topic, queue) streams with Consumer.pull_columns (numpy columns, no Record
    per message); the intended send times come from one gather of the body heads per pull, and
    a message counts as received when its own pull returned, not at the end of the sweep.
    When a sweep finds nothing, Consumer.wait_for_more sleeps until the dispatcher moves on."""

    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        self.consumer = Consumer(spec.target, f"bench-{spec.worker_id}")
        self.offsets: dict[tuple[str, int], int] = {}
        self.backlog_at_start_msgs = 0  # what its queues held that it reads first (--consume-from start)
        for stream in spec.streams:
            low, end = self._queue_range(*stream)
            self.offsets[stream] = low if spec.consume_from == "start" else end
            self.backlog_at_start_msgs += end - self.offsets[stream]

    def _queue_range(self, topic: str, queue_id: int) -> tuple[int, int]:
        """The queue's first readable offset and its end, as a pull past the end reports them."""
        probe = self.consumer.pull_columns(topic, queue_id, 1 << 62, max_count=1)
        return probe.min_offset, probe.next_offset if probe.next_offset != 1 << 62 else probe.max_offset

    def poll(self, timeout_s: float) -> Received:
        """What a sweep over the streams read (sweeping again at once while a sweep only moved
        past entries with nothing to hand out); if nothing, wait up to `timeout_s` for more."""
        bound = self.consumer.dispatched_pos
        count, stamps, arrivals, moved = self._sweep()
        while not count and moved:
            count, stamps, arrivals, moved = self._sweep()
        if not count:
            if timeout_s > 0:
                self.consumer.wait_for_more(bound, int(timeout_s * 1000))
            return NOTHING_RECEIVED
        if len(stamps) == 1:
            return Received(count, stamps[0], arrivals[0])
        return Received(count, np.concatenate(stamps), np.concatenate(arrivals))

    def _sweep(self) -> tuple[int, list[np.ndarray], list[np.ndarray], bool]:
        """One pull per stream: (messages, their intended times, their arrival times, whether an
        offset moved)."""
        count, moved = 0, False
        stamps: list[np.ndarray] = []
        arrivals: list[np.ndarray] = []
        for stream, offset in self.offsets.items():
            result = self.consumer.pull_columns(stream[0], stream[1], offset,
                                                max_count=self.spec.pull_count)
            if result.status is GetStatus.FOUND:
                pulled_ns = time.monotonic_ns()  # a message is received when its pull returns
                for view in result.views:
                    count += view.count
                    stamps.append(intended_times_of_heads(view.body_prefix(BODY_HEADER.size)[1]))
                    arrivals.append(np.full(len(stamps[-1]), pulled_ns, dtype=np.int64))
            if result.status is GetStatus.FOUND or result.status in MOVES:
                moved |= result.next_offset != offset
                self.offsets[stream] = result.next_offset
        return count, stamps, arrivals, moved

    def close(self) -> None:
        self.consumer.close()
