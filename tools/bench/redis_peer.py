"""The Redis Streams peer for `mqstore bench --peer redis`.

The harness starts its own redis-server on 127.0.0.1 and a free port, with a fresh temp
directory, AOF on and RDB snapshots off: `appendfsync always` for --flush sync (one fdatasync
per event-loop turn, i.e. Redis's own group commit), `everysec` for async. It is stopped
(SIGTERM, then SIGKILL after a deadline) and its directory removed at the end of the run.

Producers XADD each message to the stream `<topic>:<queue_id>` with fields d=<body> (and
k=<key> with --keys): one round trip per message at batch 1, one pipeline (transaction=False)
of B commands per batch otherwise. Consumers XREAD BLOCK across their streams.
"""

from __future__ import annotations

import collections
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from engine.errors import StoreError
from tools.bench.bench_body import intended_times
from tools.bench.worker_records import Pending, Received, SendBatch, WorkerSpec

SERVER_HINT = "install it with `apt-get install redis-server` (Debian/Ubuntu)"
CLIENT_HINT = "install the client with `pip install 'mqstore[redis]'` (redis>=5)"
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 15.0
XREAD_COUNT = 1024
APPENDFSYNC = {"sync": "always", "async": "everysec"}


class PeerUnavailableError(StoreError):
    """The peer cannot run here (a program or a Python package is missing)."""


def require_redis(server_binary: str = "redis-server") -> str:
    """Path of redis-server, after checking the Python client imports; raises with a hint."""
    missing = []
    path = shutil.which(server_binary)
    if path is None:
        missing.append(f"redis-server ({server_binary!r} is not on PATH)")
    try:
        import redis  # noqa: F401
    except ImportError:
        missing.append("the Python package redis (not installed)")
    if missing:
        raise PeerUnavailableError(f"--peer redis needs {' and '.join(missing)}",
                                   hint=f"{SERVER_HINT}; {CLIENT_HINT}")
    return path


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """A private redis-server on loopback; use as a context manager."""

    def __init__(self, flush: str, *, server_binary: str = "redis-server",
                 workdir: str | None = None):
        self.binary = require_redis(server_binary)
        self.flush = flush
        self.port = free_loopback_port()
        self.directory = Path(tempfile.mkdtemp(prefix="mqstore-bench-redis-", dir=workdir))
        self.process: subprocess.Popen | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        return [self.binary, "--bind", "127.0.0.1", "--port", str(self.port),
                "--protected-mode", "yes", "--dir", str(self.directory), "--daemonize", "no",
                "--appendonly", "yes", "--appendfsync", APPENDFSYNC[self.flush], "--save", "",
                "--logfile", str(self.directory / "redis.log")]

    def start(self) -> RedisServer:
        import redis

        self.process = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT_S
        client = redis.Redis(host="127.0.0.1", port=self.port)
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise PeerUnavailableError(f"redis-server did not start; see "
                                               f"{self.directory / 'redis.log'}") from None
                time.sleep(0.05)
        client.close()
        return self

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


def _client(target: str):
    import redis

    host, _, port = target.rpartition(":")
    return redis.Redis(host=host, port=int(port))


def stream_key(topic: str, queue_id: int) -> str:
    return f"{topic}:{queue_id}"


class RedisSender:
    """XADD per message; a pipeline of the whole batch when batch > 1. Synchronous."""

    def __init__(self, spec: WorkerSpec):
        self.client = _client(spec.target)
        self.client.ping()

    def submit(self, batch: SendBatch) -> Pending:
        pending = Pending(len(batch.bodies))
        try:
            if len(batch.bodies) == 1:
                self.client.xadd(stream_key(*batch.streams[0]), _fields(batch.bodies[0], batch.keys[0]))
                pending.statuses = {"OK": 1}
            else:
                pipe = self.client.pipeline(transaction=False)
                for stream, body, key in zip(batch.streams, batch.bodies, batch.keys, strict=True):
                    pipe.xadd(stream_key(*stream), _fields(body, key))
                replies = pipe.execute(raise_on_error=False)
                pending.statuses = dict(collections.Counter(
                    type(r).__name__ if isinstance(r, Exception) else "OK" for r in replies))
        except Exception as exc:  # connection loss etc.: every message of the batch failed
            pending.statuses = {type(exc).__name__: len(batch.bodies)}
        pending.stamp()
        return pending

    def result(self, pending: Pending) -> dict[str, int]:
        return dict(pending.statuses)

    def close(self) -> None:
        self.client.close()


def _fields(body: bytes, key: str | None) -> dict:
    return {"d": body, "k": key} if key else {"d": body}


class RedisReceiver:
    """XREAD BLOCK over its streams from the beginning (the server is fresh for each run)."""

    def __init__(self, spec: WorkerSpec):
        self.client = _client(spec.target)
        self.client.ping()
        self.ids = {stream_key(*s): "0-0" for s in spec.streams}
        self.backlog_at_start_msgs = 0  # what its streams held that it reads first (--consume-from start)
        for key in self.ids:
            if spec.consume_from == "start":
                self.backlog_at_start_msgs += self.client.xlen(key)
                continue
            last = self.client.xrevrange(key, count=1)
            if last:
                self.ids[key] = last[0][0]

    def poll(self, timeout_s: float) -> Received:
        block_ms = max(int(timeout_s * 1000), 1) if timeout_s > 0 else None
        reply = self.client.xread(self.ids, count=XREAD_COUNT, block=block_ms)
        bodies: list[bytes] = []
        for key, entries in reply or ():
            name = key.decode() if isinstance(key, bytes) else key
            if entries:
                self.ids[name] = entries[-1][0]
                bodies.extend(fields[b"d"] for _, fields in entries)
        return Received(len(bodies), intended_times(bodies))

    def close(self) -> None:
        self.client.close()
