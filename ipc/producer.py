"""Producer: puts messages into a running store from a co-located process.

    with Producer("./data") as producer:
        result = producer.send("orders", b"...", keys=("order-42",))
        assert result.ok, result
        results = producer.send_batch([Message("orders", body) for body in bodies])
        future = producer.send_async("orders", b"...")

The producer validates and encodes every record itself (engine.message's rules, the properties
through encode_message_properties, the records many at a time with
engine.formats.record_batch.encode_records, byte-identical to record.encode_record), so bad
input gets its status (MESSAGE_ILLEGAL, PROPERTIES_SIZE_EXCEEDED, with the reason) without a
round trip, and the supervisor only checks, stamps and copies. Records travel as bytes in the
producer's mailbox slot; results come back in the slot's numpy results array. Nothing is
pickled.

Threads and batching: every send goes through one bounded local queue drained by a single
sender thread, which coalesces whatever is queued into one mailbox request (up to the slot's
record and byte limits, never mixing wait and no-wait messages), sends it and waits for its
answer while the next batch accumulates. Many threads calling send() therefore cost one
request per group, not one per message. The queue is bounded in bytes: when the store is
behind, send_async blocks up to `enqueue_timeout_s` and then answers OS_PAGE_CACHE_BUSY (not
stored) -- memory never grows without bound.

Failure statuses: SERVICE_NOT_AVAILABLE when the supervisor is gone (never a hang); the
supervisor's FLUSH_DISK_TIMEOUT (stored, not yet durable); UNKNOWN_ERROR when no answer came
within sync_flush_timeout + 5 s (the messages may still be stored). A producer process killed
mid-request leaves nothing: a request becomes visible only when complete.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path

import numpy as np

from engine.errors import (
    BadInputError,
    ReadOnlyStoreError,
    ServiceNotAvailableError,
    StoreClosedError,
    StoreError,
    StorePermissionError,
)
from engine.formats.record import (
    CRC32C_PROP_SIZE,
    MAX_PROPERTIES_BYTES,
    RECORD_FIXED_SIZE,
    make_msg_id,
    new_uniq_keys,
)
from engine.formats.record_batch import EncodedRecords, encode_records
from engine.message import Message, encode_message_properties, validate_body, validate_queue_id
from engine.naming import validate_topic
from engine.status import PutResult, PutStatus
from engine.store_dir import StoreKind, inspect_store_dir, read_meta
from ipc.control_block import ControlBlock
from ipc.mailbox import Mailbox, ProducerSlot, RequestFlag
from ipc.run_info import RunInfo, read_run_info, run_dir

DEFAULT_MAX_PENDING_BYTES = 64 * 1024 * 1024
RESPONSE_MARGIN_S = 5.0
BORN_IP = "127.0.0.1"
_STATUSES = {int(status): status for status in PutStatus}
MAX_TOPIC_CACHE = 4096

log = logging.getLogger(__name__)


def attach_running_store(store_dir: str | os.PathLike) -> tuple[ControlBlock, RunInfo]:
    """Check the directory, attach the control block of its READY supervisor, read run info.

    Raises NotAStoreError / FormatVersionError / StorePermissionError for a bad directory and
    ServiceNotAvailableError at once when no supervisor serves it."""
    root = Path(store_dir)
    try:
        kind = inspect_store_dir(root)
    except StorePermissionError:
        raise
    except PermissionError:  # a parent directory is closed to us (another user's store)
        raise StorePermissionError("no permission to read the store directory", path=str(root),
                                   hint="the store belongs to another user") from None
    if kind is StoreKind.NEW:
        raise ServiceNotAvailableError("no store here and no supervisor runs on it", path=str(root),
                                       hint="start one with `mqstore start --store DIR`")
    if kind is StoreKind.ROCKETMQ:
        raise ReadOnlyStoreError("this is a RocketMQ-written store; it has no supervisor",
                                 path=str(root))
    read_meta(root)  # FormatVersionError for a newer store
    try:
        ctl = ControlBlock.attach(root)
    except ServiceNotAvailableError:
        raise ServiceNotAvailableError("no supervisor runs on this store", path=str(root),
                                       hint="start it with `mqstore start`") from None
    try:
        if not ctl.supervisor_alive():
            raise ServiceNotAvailableError(f"the store's supervisor (pid {ctl.supervisor_pid}) is "
                                           "gone", path=str(root),
                                           hint="start it again with `mqstore start`")
        if not ctl.is_ready():
            raise ServiceNotAvailableError(f"the store's supervisor is {ctl.store_state.name.lower()}",
                                           path=str(root), hint="retry once it is ready")
        info = read_run_info(root, ctl.supervisor_pid)
    except BaseException:
        ctl.close()
        raise
    return ctl, info


class _Pending:
    """Encoded records of one send call waiting in the local queue, and where results go.

    Records lie end to end in `blob` (record_batch.encode_records); `deliver(indexes, results)`
    receives the results of a run of them at once."""

    __slots__ = ("blob", "cursor", "deliver", "ends", "indexes", "nbytes", "starts", "wait")

    def __init__(self, encoded: EncodedRecords, indexes: list[int], wait: bool,
                 deliver: Callable[[list[int], list[PutResult]], None]):
        self.blob = encoded.buf
        self.starts = encoded.starts
        self.ends = encoded.starts + encoded.sizes
        self.indexes = indexes
        self.wait = wait
        self.deliver = deliver
        self.cursor = 0
        self.nbytes = len(encoded.buf)

    @property
    def count(self) -> int:
        return len(self.starts)


class _BatchCollector:
    """Collects one result per message of a batch and resolves a Future with the list."""

    def __init__(self, results: list[PutResult | None], future: Future):
        self.results = results
        self.future = future
        self.missing = sum(1 for r in results if r is None)
        self._lock = threading.Lock()
        if not self.missing:
            future.set_result(results)

    def deliver(self, indexes: list[int], results: list[PutResult]) -> None:
        with self._lock:
            for index, result in zip(indexes, results, strict=True):
                self.results[index] = result
            self.missing -= len(indexes)
            done = self.missing == 0
        if done:
            self.future.set_result(self.results)


def _single(future: Future) -> Callable[[list[int], list[PutResult]], None]:
    return lambda _indexes, results: future.set_result(results[0])


class Producer:
    """A co-located producer; one mailbox slot, one sender thread. Use as a context manager."""

    def __init__(self, store_dir: str | os.PathLike, *,
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
                 enqueue_timeout_s: float | None = None):
        self.root = Path(store_dir)
        self._ctl, self.info = attach_running_store(self.root)
        try:
            self._mailbox = Mailbox.attach(self.root)
            try:
                self._slot = ProducerSlot.claim(self._mailbox, run_dir(self.root),
                                                alive=self._ctl.supervisor_alive)
            except BaseException:
                self._mailbox.close()
                raise
        except BaseException:
            self._ctl.close()
            raise
        self._response_timeout_s = self.info.sync_flush_timeout_ms / 1000.0 + RESPONSE_MARGIN_S
        self._enqueue_timeout_s = (self._response_timeout_s if enqueue_timeout_s is None
                                   else enqueue_timeout_s)
        self._max_pending_bytes = max_pending_bytes
        self._store_host = self.info.store_ip_port
        self._msg_id_prefix = make_msg_id(self._store_host, 0)[:-16]
        self._born_host = (BORN_IP, os.getpid() & 0x7FFFFFFF)
        self._round_robin: dict[str, itertools.count] = {}
        self._topics: dict[str, bytes] = {}  # validated topics, UTF-8
        self._queue: collections.deque[_Pending] = collections.deque()
        self._pending_bytes = 0
        self._cond = threading.Condition()
        self._closing = False
        self._closed = False
        self._broken: str | None = None
        self._sender = threading.Thread(target=self._send_loop, name="mqstore-producer",
                                        daemon=True)
        self._sender.start()

    # ------------------------------------------------------------------------------ public API
    def send(self, topic: str, body: bytes, *, tags: str | None = None, keys: Iterable[str] | str = (),
             queue_id: int | None = None, properties: Mapping[str, str] | None = None,
             wait: bool = True) -> PutResult:
        """Put one message; blocks until the store answers (PUT_OK after the flush under sync)."""
        return self.send_async(topic, body, tags=tags, keys=keys, queue_id=queue_id,
                               properties=properties, wait=wait).result()

    def send_async(self, topic: str, body: bytes, *, tags: str | None = None,
                   keys: Iterable[str] | str = (), queue_id: int | None = None,
                   properties: Mapping[str, str] | None = None, wait: bool = True) -> Future:
        """Like send, returning a Future that resolves to the PutResult."""
        keys = (keys,) if isinstance(keys, str) else tuple(keys)
        message = Message(topic, body, tags=tags, keys=keys, queue_id=queue_id,
                          properties=dict(properties or {}), wait=wait)
        future: Future = Future()
        results: list[PutResult | None] = [None]
        runs = self._encode_runs([message], results)
        if results[0] is not None:
            future.set_result(results[0])
            return future
        for encoded, indexes, run_wait in runs:
            self._enqueue(_Pending(encoded, indexes, run_wait, _single(future)))
        return future

    def send_batch(self, messages: Sequence[Message]) -> list[PutResult]:
        """Put many messages (one request per slot-full); one result each, in order."""
        return self.send_batch_async(messages).result()

    def send_batch_async(self, messages: Sequence[Message]) -> Future:
        """Like send_batch, returning a Future of the result list."""
        results: list[PutResult | None] = [None] * len(messages)
        runs = self._encode_runs(messages, results)
        future: Future = Future()
        collector = _BatchCollector(results, future)
        for encoded, indexes, wait in runs:
            self._enqueue(_Pending(encoded, indexes, wait, collector.deliver))
        return future

    def close(self) -> None:
        """Send what is queued, then give the mailbox slot back. Idempotent."""
        if self._closed:
            return
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._sender.join()
        self._closed = True
        self._slot.release()
        self._mailbox.close()
        self._ctl.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ------------------------------------------------------------------------------ encoding
    def _next_queue_id(self, topic: str) -> int:
        counter = self._round_robin.get(topic)
        if counter is None:
            counter = self._round_robin.setdefault(topic, itertools.count())
        return next(counter) % self.info.queue_count

    def _encode_runs(self, messages: Sequence[Message], results: list[PutResult | None]
                     ) -> list[tuple[EncodedRecords, list[int], bool]]:
        """Validate each message (a bad one gets its status in `results`) and encode the rest,
        many at once, in runs of equal `wait` (which never share a request)."""
        runs: list[tuple[bool, list[int], list[tuple[bytes, bytes, bytes, int]]]] = []
        for i, (message, uniq_key) in enumerate(zip(messages, new_uniq_keys(len(messages)),
                                                    strict=True)):
            try:
                parts = self._message_parts(message, uniq_key)
            except BadInputError as exc:
                status = (PutStatus.PROPERTIES_SIZE_EXCEEDED
                          if exc.field == "properties" and "exceed" in exc.reason
                          else PutStatus.MESSAGE_ILLEGAL)
                results[i] = PutResult(status, reason=str(exc))
                continue
            if not runs or runs[-1][0] != message.wait:
                runs.append((message.wait, [], []))
            runs[-1][1].append(i)
            runs[-1][2].append(parts)
        encoded = []
        born_ts_ms = time.time_ns() // 1_000_000
        for wait, indexes, parts in runs:
            topics, bodies, props, queue_ids = zip(*parts, strict=True)
            encoded.append((encode_records(topics, bodies, props, queue_ids, born_ts_ms=born_ts_ms,
                                           born_host=self._born_host, store_host=self._store_host),
                            indexes, wait))
        return encoded

    def _message_parts(self, message: Message, uniq_key: str) -> tuple[bytes, bytes, bytes, int]:
        """(topic, body, properties without the CRC32C tail, queue id) of a valid message."""
        if not isinstance(message, Message):
            raise BadInputError("message", f"not a Message: {type(message).__name__}")
        topic = message.topic
        topic_raw = self._topics.get(topic) if type(topic) is str else None
        if topic_raw is None:
            topic_raw = validate_topic(topic).encode("utf-8")
            if len(self._topics) < MAX_TOPIC_CACHE:
                self._topics[topic] = topic_raw
        body = validate_body(message.body)
        if len(body) > self.info.max_body_bytes:
            raise BadInputError("body", f"{len(body)} bytes exceeds the maximum of "
                                f"{self.info.max_body_bytes}")
        props_raw = encode_message_properties(message, uniq_key)
        if len(props_raw) + CRC32C_PROP_SIZE > MAX_PROPERTIES_BYTES:
            raise BadInputError("properties", f"{len(props_raw)} bytes plus the {CRC32C_PROP_SIZE}"
                                f"-byte CRC32C property exceeds {MAX_PROPERTIES_BYTES}")
        size = RECORD_FIXED_SIZE + len(body) + len(topic_raw) + len(props_raw) + CRC32C_PROP_SIZE
        if size > self._mailbox.data_bytes:
            raise BadInputError("body", f"a record of {size} bytes is larger than a mailbox slot "
                                f"({self._mailbox.data_bytes} bytes)")
        queue_id = message.queue_id
        if queue_id is None:
            queue_id = self._next_queue_id(topic)
        return topic_raw, body, props_raw, validate_queue_id(queue_id, self.info.queue_count)

    # ------------------------------------------------------------------------------ local queue
    def _enqueue(self, pending: _Pending) -> None:
        if self._closing or self._closed:
            raise StoreClosedError("the producer is closed", path=str(self.root))
        if self._broken is not None:
            self._fail_pending(pending, PutStatus.SERVICE_NOT_AVAILABLE, self._broken)
            return
        deadline = time.monotonic() + self._enqueue_timeout_s
        with self._cond:
            while (self._pending_bytes and
                   self._pending_bytes + pending.nbytes > self._max_pending_bytes):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    reason = (f"the store is behind: {self._pending_bytes} bytes have been queued "
                              f"in this producer for over {self._enqueue_timeout_s:g} s")
                    break
                self._cond.wait(remaining)
            else:
                reason = None
                self._queue.append(pending)
                self._pending_bytes += pending.nbytes
                self._cond.notify_all()
        if reason is not None:
            self._fail_pending(pending, PutStatus.OS_PAGE_CACHE_BUSY, reason)

    @staticmethod
    def _fail_pending(pending: _Pending, status: PutStatus, reason: str) -> None:
        indexes = pending.indexes[pending.cursor:]
        pending.deliver(indexes, [PutResult(status, reason=reason)] * len(indexes))

    def _take_batch(self) -> tuple[list[memoryview], int, list[tuple[_Pending, int, int]], bool] | None:
        """Block for queued records; take up to one request's worth with the same wait flag.

        Returns byte runs to send back to back, their record count, and where they came
        from: (pending, first, end) record cursors."""
        mb = self._mailbox
        with self._cond:
            while not self._queue and not self._closing:
                self._cond.wait()
            if not self._queue:
                return None
            wait = self._queue[0].wait
            pieces: list[memoryview] = []
            runs: list[tuple[_Pending, int, int]] = []
            count = nbytes = 0
            while self._queue and self._queue[0].wait == wait and count < mb.max_batch:
                pending = self._queue[0]
                first = pending.cursor
                last = min(pending.count, first + mb.max_batch - count)
                base = int(pending.starts[first])
                room = mb.data_bytes - nbytes
                end = first + int(np.searchsorted(pending.ends[first:last] - base, room, side="right"))
                if end == first:
                    break  # the next record does not fit this request
                stop = int(pending.ends[end - 1])
                pieces.append(memoryview(pending.blob)[base:stop])
                runs.append((pending, first, end))
                count += end - first
                nbytes += stop - base
                pending.cursor = end
                if end < pending.count:
                    break
                self._queue.popleft()
            self._pending_bytes -= nbytes
            self._cond.notify_all()
        return pieces, count, runs, wait

    # ------------------------------------------------------------------------------ sender
    def _send_loop(self) -> None:
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            pieces, count, runs, wait = batch
            try:
                results = self._request(pieces, count, wait)
            except Exception as exc:  # never leave a caller's Future unresolved
                log.exception("producer request failed")
                results = [PutResult(PutStatus.UNKNOWN_ERROR, reason=str(exc))] * count
            at = 0
            for pending, first, end in runs:
                pending.deliver(pending.indexes[first:end], results[at:at + end - first])
                at += end - first

    def _request(self, pieces: list[memoryview], count: int, wait: bool) -> list[PutResult]:
        if self._broken is not None:
            return [PutResult(PutStatus.SERVICE_NOT_AVAILABLE, reason=self._broken)] * count
        flags = RequestFlag.WAIT_FOR_FLUSH if wait else RequestFlag.NONE
        alive = self._ctl.supervisor_alive
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        try:
            seq = self._slot.write_request(data, count=count, flags=flags)
            answer = self._slot.wait_response(seq, self._response_timeout_s, alive)
        except ServiceNotAvailableError as exc:
            if alive():
                self._replace_slot()
                reason = (f"no answer within {self._response_timeout_s:g} s; the messages may "
                          f"still be stored ({exc})")
                return [PutResult(PutStatus.UNKNOWN_ERROR, reason=reason)] * count
            self._broken = f"the supervisor is gone: {exc}"
            return [PutResult(PutStatus.SERVICE_NOT_AVAILABLE, reason=self._broken)] * count
        except StoreError as exc:  # the supervisor refused the request as a whole
            return [PutResult(PutStatus.MESSAGE_ILLEGAL, reason=str(exc))] * count
        return [self._to_result(row) for row in answer.tolist()]

    def _to_result(self, row: tuple) -> PutResult:
        status, queue_id, commit_pos, queue_offset, store_ts_ms = row
        status = _STATUSES[status]
        if not status.is_stored:
            reason = {PutStatus.MESSAGE_ILLEGAL: "the supervisor refused the record",
                      PutStatus.SERVICE_NOT_AVAILABLE: "the store is stopping",
                      PutStatus.DISK_FULL: "the disk is full"}.get(status)
            return PutResult(status, reason=reason)
        return PutResult(status, commit_pos=commit_pos, queue_id=queue_id, queue_offset=queue_offset,
                         msg_id=f"{self._msg_id_prefix}{commit_pos:016X}", store_ts_ms=store_ts_ms)

    def _replace_slot(self) -> None:
        """After a timeout the old request is still in flight: take a fresh slot."""
        self._slot.release()
        self._slot = ProducerSlot.claim(self._mailbox, run_dir(self.root),
                                        alive=self._ctl.supervisor_alive,
                                        timeout_s=self._response_timeout_s)
