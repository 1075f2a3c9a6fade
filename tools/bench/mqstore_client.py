"""The mqstore side of a bench worker: the real ipc Producer and Consumer.

MqstoreSender sends each batch with Producer.send_async (batch 1) or send_batch_async and
stamps the completion time in the future's callback (the producer's sender thread), so the
latency does not include the time the worker's main loop took to notice. MqstoreReceiver pulls
its (topic, queue) streams with Consumer.pull and, when a sweep finds nothing, long-polls on the
dispatcher's published position across all of them.
"""

from __future__ import annotations

import collections

from engine.message import Message
from engine.status import GetStatus, PutStatus
from ipc.consumer import Consumer
from ipc.control_block import ControlBlock
from ipc.producer import Producer
from ipc.run_info import run_dir
from ipc.wakeup import ConsumerWaiter, WaiterTable
from tools.bench.loadgen import Pending, SendBatch, WorkerSpec

MOVES = (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY, GetStatus.NO_MATCHED_MESSAGE)


class MqstoreSender:
    """Sends through ipc.producer.Producer: send_async for batch 1, else send_batch_async."""

    def __init__(self, spec: WorkerSpec):
        self.producer = Producer(spec.target)

    def submit(self, batch: SendBatch) -> Pending:
        if len(batch.bodies) == 1:
            (topic, qid), key = batch.streams[0], batch.keys[0]
            future = self.producer.send_async(topic, batch.bodies[0], queue_id=qid,
                                              keys=(key,) if key else ())
        else:
            future = self.producer.send_batch_async([
                Message(topic, body, keys=(key,) if key else (), queue_id=qid)
                for (topic, qid), body, key in zip(batch.streams, batch.bodies, batch.keys,
                                                    strict=True)])
        pending = Pending(len(batch.bodies), future)
        future.add_done_callback(pending.stamp)
        return pending

    def result(self, pending: Pending) -> dict[str, int]:
        results = pending.future.result()
        if not pending.done_ns:  # Future wakes result() before it runs the stamping callback
            pending.stamp()
        if not isinstance(results, list):
            results = [results]
        ok = PutStatus.PUT_OK
        counts = collections.Counter("OK" if r.status is ok else r.status.name for r in results)
        return dict(counts)

    def close(self) -> None:
        self.producer.close()


class MqstoreReceiver:
    """Pulls its (topic, queue) streams with ipc.consumer.Consumer; long-polls across all of
    them on the dispatcher's published position (the same waiter table Consumer.pull uses)."""

    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        self.consumer = Consumer(spec.target, f"bench-{spec.worker_id}")
        self.ctl = ControlBlock.attach(spec.target)
        self.offsets = {s: self._start_offset(*s) for s in spec.streams}
        self._waiter = None
        self._table = None

    def _start_offset(self, topic: str, queue_id: int) -> int:
        if self.spec.consume_from == "start":
            return 0
        probe = self.consumer.pull(topic, queue_id, 1 << 62, max_count=1)
        return probe.next_offset if probe.next_offset != 1 << 62 else probe.max_offset

    def poll(self, timeout_s: float) -> list[bytes]:
        """Bodies from one sweep over the streams; if none, wait up to `timeout_s` for more."""
        bound = self.ctl.dispatched_pos
        bodies: list[bytes] = []
        for stream, offset in self.offsets.items():
            result = self.consumer.pull(stream[0], stream[1], offset,
                                        max_count=self.spec.pull_count)
            if result.status is GetStatus.FOUND:
                bodies.extend(record.body for record in result.messages)
                self.offsets[stream] = result.next_offset
            elif result.status in MOVES:
                self.offsets[stream] = result.next_offset
        if not bodies and timeout_s > 0:
            self._wait_past(bound, timeout_s)
        return bodies

    def _wait_past(self, bound: int, timeout_s: float) -> None:
        if self._waiter is None:
            self._table = WaiterTable.attach(self.spec.target)
            self._waiter = ConsumerWaiter.register(self._table, run_dir(self.spec.target))
        ctl = self.ctl
        self._waiter.wait(lambda: ctl.dispatched_pos > bound or not ctl.supervisor_alive(),
                          timeout_s)

    def close(self) -> None:
        if self._waiter is not None:
            self._waiter.close()
            self._table.close()
        self.ctl.close()
        self.consumer.close()
