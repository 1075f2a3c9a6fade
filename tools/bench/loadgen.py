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
The body starts with BODY_HEADER (tools.bench.bench_body), so a consumer
measures end-to-end latency from the same intended time. At --rate max, intended = now.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

from tools.bench.bench_body import BODY_HEADER, BatchBuilder
from tools.bench.interval_recorder import IntervalRecorder
from tools.bench.worker_records import Pending, WorkerSpec

MAX_SLEEP_S = 0.1
POLL_TIMEOUT_S = 0.1


# ---------------------------------------------------------------------------------- producing
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
