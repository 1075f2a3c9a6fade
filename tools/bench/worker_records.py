"""The records a bench worker and its endpoint (the mqstore or the Redis client) exchange.

`WorkerSpec` is all one worker process needs (it travels as JSON); a producer hands its sender
a `SendBatch` and gets back a `Pending`; a consumer's receiver answers each poll with a
`Received`. The loop (tools.bench.loadgen) and the endpoints (tools.bench.mqstore_client,
tools.bench.redis_peer) import these; none imports another's loop.
"""

from __future__ import annotations

import dataclasses
import json
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


@dataclass(frozen=True)
class WorkerSpec:
    """Everything one producer or consumer process needs (travels as JSON)."""

    role: str  # "producer" | "consumer"
    backend: str  # "mqstore" | "redis"
    worker_id: int
    target: str  # store directory, or "127.0.0.1:<port>" for redis
    streams: tuple[tuple[str, int], ...]  # (topic, queue_id): sent round robin / read
    size_bytes: int = 256
    batch: int = 1
    rate_msgs_per_s: float | None = None  # this producer's share; None = as fast as acks come
    keys: bool = False
    warmup_s: float = 0.0
    seconds: float = 10.0
    interval_s: float = 5.0
    inflight: int = 1
    pull_count: int = 1024
    consume_from: str = "end"
    phase: float = 0.0  # a producer's batch j is due (j + phase) batch intervals after the start

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        data = json.loads(text)
        data["streams"] = tuple((topic, int(qid)) for topic, qid in data["streams"])
        return cls(**data)

    @property
    def interval_count(self) -> int:
        return max(int(np.ceil(self.seconds / self.interval_s - 1e-9)), 1)

    @property
    def batch_gap_ns(self) -> float:
        """Nanoseconds between this producer's batches at a fixed rate (0.0 at --rate max)."""
        return self.batch * 1e9 / self.rate_msgs_per_s if self.rate_msgs_per_s else 0.0

    def due_ns(self, start_ns: int, j):
        """When batch j (an int or an array of them) is due at a fixed rate: the one schedule."""
        return start_ns + (j + self.phase) * self.batch_gap_ns


@dataclass
class SendBatch:
    """One batch to send, as columns: message i has body bodies[i], key key_column[i] (no keys:
    None) and goes to the (topic, queue_id) stream_table[(first_stream + i) % len(stream_table)]."""

    stream_table: tuple[tuple[str, int], ...]
    first_stream: int
    bodies: list[bytes]
    key_column: list[str] | None

    @property
    def streams(self) -> list[tuple[str, int]]:
        """The (topic, queue_id) of each message."""
        table, first = self.stream_table, self.first_stream
        return [table[(first + i) % len(table)] for i in range(len(self.bodies))]

    @property
    def keys(self) -> list[str | None]:
        """The key of each message (None without keys)."""
        return self.key_column if self.key_column is not None else [None] * len(self.bodies)


class Pending:
    """A batch in flight: stamped with its completion time by whoever completes it."""

    __slots__ = ("count", "done_ns", "future", "intended_ns", "sent_ns", "statuses")

    def __init__(self, count: int, future: Future | None = None):
        self.count = count
        self.future = future
        self.statuses: dict[str, int] | None = None
        self.done_ns = 0
        self.intended_ns = 0
        self.sent_ns = 0

    def stamp(self, _future: object = None) -> None:
        self.done_ns = time.monotonic_ns()


class Received(NamedTuple):
    """What one receiver poll got: how many messages, and the intended send times of those that
    are bench bodies (the receiver's part; redis gives bodies, mqstore numpy columns), with when
    each arrived if the poll read them at different times (None: when the poll returned)."""

    count: int
    intended_ns: np.ndarray  # int64
    received_ns: np.ndarray | None = None  # int64, CLOCK_MONOTONIC, one per intended_ns


NOTHING_RECEIVED = Received(0, np.zeros(0, dtype=np.int64))
