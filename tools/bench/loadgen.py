"""Producer and consumer process bodies for `mqstore bench`, over the real clients.

A worker is started as `python -m tools.bench _worker '<WorkerSpec JSON>'`. It connects, prints
{"event": "ready", "backlog_msgs": N} on stdout (N: what a consumer's queues held when it opened
them that it will read first, with --consume-from start), and waits for `go <start_ns>` on stdin
(CLOCK_MONOTONIC ns, which every process on the host shares). Then it reports one
{"event": "interval"} JSON line per interval and a final {"event": "done"} (a consumer's with
"caught_up_ns": when it first found nothing to read). Consumers run until the harness writes
`drain` (every acknowledged message is visible by then), empty their queues, and finish. `stop`
or EOF on stdin ends any worker early. Nothing is pickled.

Timing (coordinated omission). With a fixed rate, batch j of a producer is *intended* at
start_ns + (j + phase) * batch / rate and every latency is measured from that intended time, not
from when the send actually happened: a stall delays the sends behind it and their latencies
show it. `phase` (0 <= phase < 1) places the producer's schedule within the batch interval: the
harness gives every producer 0 (--schedule aligned, the default: every producer's batch j is
due at the same instant), or spreads them evenly (--schedule spread), as independent clients
would be.
The body starts with BODY_HEADER (magic, producer id, intended_ns, seq), so a consumer
measures end-to-end latency from the same intended time. At --rate max, intended = now.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from tools.bench.interval_recorder import IntervalRecorder

BODY_HEADER = struct.Struct("<4sIqq")  # magic, producer id, intended send time (ns), sequence
BODY_HEADER_DTYPE = np.dtype([("magic", "S4"), ("producer", "<u4"), ("intended_ns", "<i8"), ("seq", "<i8")])
assert BODY_HEADER_DTYPE.itemsize == BODY_HEADER.size and BODY_HEADER.format == "<4sIqq"  # one layout
BODY_MAGIC = b"MQB1"
MIN_BODY_BYTES = BODY_HEADER.size
MAX_SLEEP_S = 0.1
POLL_TIMEOUT_S = 0.1


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


# ---------------------------------------------------------------------------------- producing
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


class BatchBuilder:
    """Makes a producer's batches from one template: spec.batch bodies of BODY_HEADER + `tail`
    side by side in a numpy array whose header fields are written per batch (two whole-column
    writes), then cut into bytes objects by one tolist()."""

    def __init__(self, spec: WorkerSpec, tail: bytes):
        self.spec = spec
        body = BODY_HEADER.pack(BODY_MAGIC, spec.worker_id, 0, 0) + tail
        self._buffer = bytearray(body * spec.batch)  # (a structured copy would drop the tail bytes)
        self._rows = np.frombuffer(self._buffer, dtype=_body_dtype(len(body)))
        self._whole = self._rows.view(np.dtype((np.void, len(body))))
        self._seq_offsets = np.arange(spec.batch, dtype=np.int64)
        self._key_prefix = f"p{spec.worker_id}-" if spec.keys else None

    def build(self, seq: int, intended_ns: int) -> SendBatch:
        """Messages seq..seq+batch-1 of this producer, bodies stamped with `intended_ns`."""
        spec, rows = self.spec, self._rows
        rows["intended_ns"] = intended_ns
        rows["seq"] = self._seq_offsets + seq
        keys = (list(map(self._key_prefix.__add__, map(str, range(seq, seq + spec.batch))))
                if self._key_prefix is not None else None)
        return SendBatch(spec.streams, (spec.worker_id + seq) % len(spec.streams), self._whole.tolist(),
                         keys)


def _body_dtype(size_bytes: int) -> np.dtype:
    """A bench body of `size_bytes` as a numpy record: BODY_HEADER's fields, then the tail."""
    names = list(BODY_HEADER_DTYPE.names)
    return np.dtype({"names": names, "formats": [BODY_HEADER_DTYPE.fields[n][0] for n in names],
                     "offsets": [BODY_HEADER_DTYPE.fields[n][1] for n in names], "itemsize": size_bytes})


def build_batch(spec: WorkerSpec, seq: int, intended_ns: int, tail: bytes) -> SendBatch:
    """Messages seq..seq+batch-1 of this producer, bodies stamped with `intended_ns`."""
    return BatchBuilder(spec, tail).build(seq, intended_ns)


def run_producer(spec: WorkerSpec, sender, recorder: IntervalRecorder, *, start_ns: int,
                 stop: threading.Event | None = None, clock: Callable[[], int] = time.monotonic_ns,
                 sleep: Callable[[float], None] = time.sleep) -> None:
    """Send batches until the run ends; `sender.submit(SendBatch) -> Pending`,
    `sender.result(Pending) -> {status name: count}` with "OK" for stored-and-acknowledged."""
    builder = BatchBuilder(spec, os.urandom(spec.size_bytes - BODY_HEADER.size))
    gap_ns = spec.batch_gap_ns
    end_ns = start_ns + int((spec.warmup_s + spec.seconds) * 1e9)
    inflight: collections.deque[Pending] = collections.deque()
    j = 0
    while stop is None or not stop.is_set():
        while len(inflight) >= spec.inflight:
            _complete(spec, sender, inflight.popleft(), recorder)
        now = clock()
        recorder.maybe_emit(now)
        intended = int(spec.due_ns(start_ns, j)) if gap_ns else now
        if intended >= end_ns or now >= end_ns:
            break
        if intended > now:
            sleep(min((intended - now) / 1e9, MAX_SLEEP_S))
            if clock() < intended:
                continue
        batch = builder.build(j * spec.batch, intended)
        sent_ns = clock()
        pending = sender.submit(batch)
        pending.intended_ns, pending.sent_ns = intended, sent_ns
        inflight.append(pending)
        j += 1
    while inflight:
        _complete(spec, sender, inflight.popleft(), recorder)
    if gap_ns:  # batches the schedule wanted sent before the end: late by at least this much
        due_before_end = int(np.ceil((end_ns - start_ns) / gap_ns - spec.phase))
        late = spec.due_ns(start_ns, np.arange(j, due_before_end)).astype(np.int64)
        recorder.add_unsent(clock(), late, spec.batch)
    recorder.finish()


def _complete(spec: WorkerSpec, sender, pending: Pending, recorder: IntervalRecorder) -> None:
    statuses = sender.result(pending)
    ok = statuses.pop("OK", 0)
    recorder.add_batch(done_ns=pending.done_ns, intended_ns=pending.intended_ns,
                       sent_ns=pending.sent_ns, ok_count=ok, answered_count=pending.count,
                       body_bytes=spec.size_bytes, errors=statuses)


# ---------------------------------------------------------------------------------- consuming
class Received(NamedTuple):
    """What one receiver poll got: how many messages, and the intended send times of those that
    are bench bodies (the receiver's part; redis gives bodies, mqstore numpy columns), with when
    each arrived if the poll read them at different times (None: when the poll returned)."""

    count: int
    intended_ns: np.ndarray  # int64
    received_ns: np.ndarray | None = None  # int64, CLOCK_MONOTONIC, one per intended_ns


NOTHING_RECEIVED = Received(0, np.zeros(0, dtype=np.int64))


def intended_times(bodies: list[bytes]) -> np.ndarray:
    """The intended send times stamped in bench bodies (others are skipped)."""
    unpack = BODY_HEADER.unpack_from
    stamps = [unpack(body)[2] for body in bodies
              if len(body) >= MIN_BODY_BYTES and body[:4] == BODY_MAGIC]
    return np.asarray(stamps, dtype=np.int64)


def intended_times_of_heads(heads: np.ndarray) -> np.ndarray:
    """intended_times of bodies given as their first BODY_HEADER.size bytes, an (n, size) uint8
    array (one row per body at least that long): whole-array, bodies without BODY_MAGIC skipped."""
    fields = np.ascontiguousarray(heads).view(BODY_HEADER_DTYPE).reshape(len(heads))
    return fields["intended_ns"][fields["magic"] == BODY_MAGIC].astype(np.int64)


def run_consumer(spec: WorkerSpec, receiver, recorder: IntervalRecorder, *,
                 drain: threading.Event, stop: threading.Event) -> int | None:
    """Receive until stopped, or drained: a poll that began after `drain` found nothing.
    `receiver.poll(timeout_s)` returns a Received. Returns when the first poll that found
    nothing began (CLOCK_MONOTONIC ns, None if none did): when it caught up with its queues."""
    caught_up_ns: int | None = None
    while not stop.is_set():
        draining = drain.is_set()
        began_ns = time.monotonic_ns()
        try:
            received = receiver.poll(0.0 if draining else POLL_TIMEOUT_S)
        except Exception as exc:  # counted and reported; the harness sees received < sent
            recorder.add_error(type(exc).__name__)
            if stop.wait(POLL_TIMEOUT_S):
                break
            continue
        now = time.monotonic_ns()
        if received.count and spec.consume_from == "start":
            recorder.add_backlog_read(now, received.intended_ns, received.count, spec.size_bytes)
        elif received.count:
            recorder.add_received(now, received.intended_ns, spec.size_bytes, received.received_ns)
            recorder.total_msgs += received.count - len(received.intended_ns)
        else:
            caught_up_ns = began_ns if caught_up_ns is None else caught_up_ns
            if draining:
                break
        recorder.maybe_emit(now)
    recorder.finish()
    return caught_up_ns


# ---------------------------------------------------------------------------------- process
def open_endpoint(spec: WorkerSpec):
    if spec.backend == "redis":
        from tools.bench import redis_peer

        return (redis_peer.RedisSender(spec) if spec.role == "producer"
                else redis_peer.RedisReceiver(spec))
    from tools.bench import mqstore_client

    return (mqstore_client.MqstoreSender(spec) if spec.role == "producer"
            else mqstore_client.MqstoreReceiver(spec))


def _emitter() -> Callable[[dict], None]:
    lock = threading.Lock()

    def emit(event: dict) -> None:
        with lock:
            sys.stdout.write(json.dumps(event, separators=(",", ":")) + "\n")
            sys.stdout.flush()

    return emit


def _watch_stdin(drain: threading.Event, stop: threading.Event) -> None:
    for line in sys.stdin:
        if line.strip() == "drain":
            drain.set()
        elif line.strip() == "stop":
            break
    stop.set()


def worker_main(argv: list[str]) -> int:
    """Entry point of one worker process (see the module docstring for the protocol)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the harness decides when to stop
    spec, emit = WorkerSpec.from_json(argv[0]), _emitter()
    try:
        endpoint = open_endpoint(spec)
    except Exception as exc:
        emit({"event": "error", "message": f"{type(exc).__name__}: {exc}"})
        return 1
    emit({"event": "ready", "pid": os.getpid(),
          "backlog_msgs": endpoint.backlog_at_start_msgs if spec.role == "consumer" else 0})
    words = sys.stdin.readline().split()
    if len(words) != 2 or words[0] != "go":
        endpoint.close()
        return 1
    start_ns = int(words[1])
    drain, stop = threading.Event(), threading.Event()
    threading.Thread(target=_watch_stdin, args=(drain, stop), daemon=True).start()
    recorder = IntervalRecorder(start_ns + int(spec.warmup_s * 1e9), int(spec.interval_s * 1e9),
                                spec.interval_count, emit)
    cpu_started = time.process_time()
    done: dict = {"event": "done"}
    try:
        if spec.role == "producer":
            run_producer(spec, endpoint, recorder, start_ns=start_ns, stop=stop)
        else:
            # from the same start as the producers: a backlog read before it would not count
            stop.wait(max(start_ns - time.monotonic_ns(), 0) / 1e9)
            done["caught_up_ns"] = run_consumer(spec, endpoint, recorder, drain=drain, stop=stop)
    finally:
        endpoint.close()
    emit({**done, "msgs_total": recorder.total_msgs, "errors_total": dict(recorder.total_errors),
          "cpu_s": round(time.process_time() - cpu_started, 3), "rss_max_bytes": _max_rss_bytes()})
    return 0


def _max_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
