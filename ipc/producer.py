"""Producer: puts messages into a running store from a co-located process.

    with Producer("./data") as producer:
        result = producer.send("orders", b"...", keys=("order-42",))
        assert result.ok, result
        results = producer.send_batch([Message("orders", body) for body in bodies])
        future = producer.send_async("orders", b"...")
        batch = producer.send_columns("orders", bodies, keys=order_ids)  # a BatchResult
        assert batch.ok, batch.status_counts()

The producer validates and encodes every record itself (engine.message's rules, the properties
through encode_message_properties, the records many at a time with
engine.formats.record.encode_many.encode_records, byte-identical to record.encode_record), so bad
input gets its status (MESSAGE_ILLEGAL, PROPERTIES_SIZE_EXCEEDED, with the reason) without a
round trip, and the supervisor only checks, stamps and copies. Records travel as bytes in the
producer's mailbox slot; results come back in the slot's numpy results array. Nothing is
pickled.

`send_columns` is the batch call for many messages of one topic given as columns (bodies, one
key each, one tags): no Message and no PutResult per message. It checks the columns as a whole
(BadInputError for the call, nothing sent), encodes with engine.formats.record.encode_many
(byte-identical records) and answers with an ipc.batch_result.BatchResult, numpy columns that
build PutResults only when asked. `send_batch` takes that path when its messages fit it (one
topic and tags, at most one key each, no user properties, WAIT) and the message-by-message path
otherwise, which gives each bad message its own status. A blocking send of one message
(`send_columns` of one, `send` without properties) is straight-line code: its record from
encode_many.encode_one, one request from the caller's thread (docs/DECISIONS.md#one-message-send).

Threads and batching (ipc.slot_sender): every send goes through one bounded local queue drained
by a single sender thread, which coalesces whatever is queued into one mailbox request (up to
the slot's record and byte limits, never mixing wait and no-wait messages), sends it and waits
for its answer while the next batch accumulates. Many threads calling send() therefore cost one
request per group, not one per message. A blocking call (send, send_batch, send_columns) that
finds nothing queued or in flight sends from its own thread instead, saving the hand-off to the
sender thread and back. The queue is bounded in bytes: when the store is
behind, send_async blocks up to `enqueue_timeout_s` and then answers OS_PAGE_CACHE_BUSY (not
stored) -- memory never grows without bound.

Restarts and forks: a producer outlives its supervisor. When the store is stopped and started
again, or its supervisor crashes and a new one starts, the next send waits up to
`reattach_timeout_s` (default 30 s; 0 = no wait) for a READY supervisor and sends there; the
constructor itself never waits. A request is sent again only when certainly not stored (see
ipc.slot_sender). In a child made by `os.fork()` the first call attaches on its own slot; the
inherited slot stays the parent's, untouched.

Failure statuses: SERVICE_NOT_AVAILABLE when no supervisor serves the store within the reattach
bound (never a hang); OUTCOME_UNKNOWN when the supervisor died with the request unanswered (may
or may not be stored, never sent twice); the supervisor's FLUSH_DISK_TIMEOUT (stored, not yet
durable); UNKNOWN_ERROR when a live supervisor gave no answer within sync_flush_timeout + 5 s
(the messages may still be stored). Async sends in flight at a crash get the same statuses:
the one published gets OUTCOME_UNKNOWN, those still queued go to the next supervisor. A
producer process killed mid-request leaves nothing: a request becomes visible only when complete.
"""

from __future__ import annotations

import itertools
import operator
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path

import numpy as np

from engine.errors import (
    BadInputError,
    ServiceNotAvailableError,
    StoreClosedError,
    StorePermissionError,
)
from engine.files.store_dir import StoreKind, inspect_store_dir, read_meta, refuse_foreign_store
from engine.formats.msg_id import make_msg_id
from engine.formats.record.encode_many import EncodedRecords, encode_columns, encode_records
from engine.formats.store_meta import MAX_QUEUE_COUNT
from engine.formats.uniq_key import new_uniq_key_block
from engine.message import (
    Message,
    PutLimits,
    body_column,
    key_column,
    message_parts,
    queue_id_column,
    tags_text,
    topic_bytes,
)
from engine.status import PutResult
from engine.topics.table import TopicDefaults, TopicFileError, TopicTableFile
from ipc.batch_result import BatchResult, BatchResultBuilder
from ipc.control_block import ControlBlock
from ipc.mailbox import Mailbox
from ipc.one_message import one_message, one_record
from ipc.reattach import (
    DEFAULT_REATTACH_TIMEOUT_S,
    SupervisorWatch,
    validate_reattach_timeout,
    wait_for_supervisor,
)
from ipc.run_info import RunInfo, read_run_info
from ipc.slot_sender import Pending, SlotSender, StoreLink

DEFAULT_MAX_PENDING_BYTES = 64 * 1024 * 1024
BORN_IP = "127.0.0.1"


def _after_fork_in_child() -> None:
    global _FORK_LOCK, _FORKS
    _FORK_LOCK = threading.Lock()
    _FORKS += 1


_FORK_LOCK = threading.Lock()  # one thread of a forked child adopts; new in every child
_FORKS = 0  # forks into this process's line: compared per send instead of a getpid() syscall
os.register_at_fork(after_in_child=_after_fork_in_child)


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
        refuse_foreign_store(root, "no supervisor runs on it to send to")
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


_TOPIC, _BODY, _TAGS, _KEYS = (operator.attrgetter(name) for name in ("topic", "body", "tags", "keys"))
_QUEUE_ID, _PROPERTIES, _WAIT = (operator.attrgetter(name) for name in ("queue_id", "properties", "wait"))
_FIRST = operator.itemgetter(0)


def _as_columns(messages: Sequence[Message]) -> tuple | None:
    """send_batch's messages as send_columns' (topic, bodies, keys, tags, queue_ids) when they
    fit: Messages of one topic and one tags, each with one key or each with none, no user
    properties, WAIT, no delay, queue ids all given or all None. None when they do not."""
    try:
        if not messages or set(map(type, messages)) != {Message} or len(set(map(_TOPIC, messages))) != 1 \
                or len(set(map(_TAGS, messages))) != 1 or any(map(_PROPERTIES, messages)) \
                or not all(map(_WAIT, messages)) \
                or any(m.delay_level is not None or m.deliver_at_ms is not None for m in messages):
            return None
        keys = list(map(_KEYS, messages))
        key_counts = set(map(len, keys))
    except TypeError:  # an unhashable topic or tags, keys without a length
        return None
    if key_counts not in ({0}, {1}):
        return None
    queue_ids = list(map(_QUEUE_ID, messages))
    nones = queue_ids.count(None)
    if 0 < nones < len(queue_ids):
        return None
    return (messages[0].topic, list(map(_BODY, messages)),
            list(map(_FIRST, keys)) if key_counts == {1} else None, messages[0].tags,
            None if nones else queue_ids)


def _message(topic: str, body: bytes, tags: str | None, keys: Iterable[str] | str, queue_id: int | None,
             properties: Mapping[str, str] | None, wait: bool, delay_level: int | None = None,
             deliver_at_ms: int | None = None) -> Message:
    if isinstance(keys, str):
        keys = (keys,)
    elif isinstance(keys, Iterable):
        keys = tuple(keys)
    # anything else (None, a number) goes as it is: the validator gives it MESSAGE_ILLEGAL
    return Message(topic, body, tags=tags, keys=keys, queue_id=queue_id, properties=dict(properties or {}),
                   wait=wait, delay_level=delay_level, deliver_at_ms=deliver_at_ms)


def _fits_columns(keys: Iterable[str] | str, properties: Mapping[str, str] | None, wait: bool) -> bool:
    """True when send()'s message has send_columns' shape: no user properties, WAIT, and one
    key (a str) or none."""
    if properties or wait is not True:
        return False
    return type(keys) is str or (type(keys) in (tuple, list) and len(keys) <= 1
                                 and all(type(key) is str for key in keys))


def _one_encoded(record: bytes) -> EncodedRecords:
    """One record from encode_one as the EncodedRecords a Pending carries."""
    return EncodedRecords(record, np.zeros(1, dtype=np.int64), np.array([len(record)], dtype=np.int64))


def _resolve(future: Future, convert: Callable[[BatchResult], object]) -> Callable[[BatchResult], None]:
    return lambda result: future.set_result(convert(result))


class Producer:
    """A co-located producer; one mailbox slot, one sender thread. Use as a context manager.

    It survives a restart of the store (ipc.reattach): after a `stop` + `start` or a crash the
    next send waits up to `reattach_timeout_s` for the new supervisor and goes on there. After
    `os.fork()` the child's first call gives the child a slot of its own and a sender thread
    (the parent's slot and queue stay the parent's); the parent is not disturbed."""

    def __init__(self, store_dir: str | os.PathLike, *,
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
                 enqueue_timeout_s: float | None = None,
                 reattach_timeout_s: float = DEFAULT_REATTACH_TIMEOUT_S):
        self.root = Path(store_dir)
        self._reattach_timeout_s = validate_reattach_timeout(reattach_timeout_s)
        self._max_pending_bytes = max_pending_bytes
        self._enqueue_timeout_s = enqueue_timeout_s
        self._sender = self._new_sender()
        self._forks = _FORKS  # _FORKS when this process's slot was claimed
        self._closed = False
        self._store_host = self.info.store_ip_port
        self._msg_id_prefix = make_msg_id(self._store_host, 0)[:-16]
        self._born_host = (BORN_IP, os.getpid() & 0x7FFFFFFF)
        self._round_robin: dict[str, int] = {}  # next queue id per topic
        self._round_robin_lock = threading.Lock()
        self._topic_file = TopicTableFile(self.root)

    def _new_sender(self) -> SlotSender:
        """Attach to the supervisor serving the store now (ServiceNotAvailableError at once when
        none does: only a producer that was attached waits for a restart)."""
        return SlotSender(self.root, self._connect, reattach_timeout_s=self._reattach_timeout_s,
                          max_pending_bytes=self._max_pending_bytes,
                          enqueue_timeout_s=self._enqueue_timeout_s)

    def _connect(self) -> StoreLink:
        ctl, info = attach_running_store(self.root)
        try:
            watch = SupervisorWatch(ctl.supervisor_pid)
            try:
                return StoreLink(ctl, info, Mailbox.attach(self.root), watch)
            except BaseException:
                watch.close()
                raise
        except BaseException:
            ctl.close()
            raise

    @property
    def info(self) -> RunInfo:
        """The run info of the supervisor last attached to."""
        return self._sender.info

    @property
    def _mailbox(self) -> Mailbox:
        return self._sender.mailbox

    def _live_sender(self) -> SlotSender:
        """The sender of this process: after a fork, the child's first call makes its own
        (ServiceNotAvailableError when no supervisor serves the store within the reattach bound)."""
        if self._forks != _FORKS:
            with _FORK_LOCK:
                if self._forks != _FORKS:
                    self._adopt_after_fork()
        return self._sender

    def _adopt_after_fork(self) -> None:
        """Let go of the parent's slot without touching it, then attach on our own. The locks
        are new: a parent thread may have held one at the fork, and it has no thread here."""
        self._sender.forget()
        self._round_robin_lock = threading.Lock()
        self._born_host = (BORN_IP, os.getpid() & 0x7FFFFFFF)
        if not self._closed:  # the bounded wait, as for a restart; then ServiceNotAvailableError
            self._sender = wait_for_supervisor(self.root, self._new_sender, self._reattach_timeout_s)
        self._forks = _FORKS

    # ------------------------------------------------------------------------------ public API
    def send(self, topic: str, body: bytes, *, tags: str | None = None, keys: Iterable[str] | str = (),
             queue_id: int | None = None, properties: Mapping[str, str] | None = None,
             wait: bool = True, delay_level: int | None = None,
             deliver_at_ms: int | None = None) -> PutResult:
        """Put one message; blocks until the store answers (PUT_OK after the flush under sync).
        With `delay_level` N it is delivered to `topic` after level N's delay (its result names
        its place in SCHEDULE_TOPIC_XXXX queue N - 1, where it waits); with `deliver_at_ms` at
        that time (one already past: at once), waiting in the timer topic.

        One path per message: a valid message of send_columns' shape is checked and encoded once,
        straight-line (`_send_one_now`); any other, or a bad one, goes by the message path, whose
        validator (engine.message.message_parts) gives it its status and reason."""
        sender = self._live_sender()
        if delay_level is None and deliver_at_ms is None and _fits_columns(keys, properties, wait):
            result = self._send_one_now(sender, topic, body,
                                        keys if type(keys) is str else (keys[0] if keys else None),
                                        tags, queue_id)
            if result is not None:
                return result[0]
        message = _message(topic, body, tags, keys, queue_id, properties, wait, delay_level, deliver_at_ms)
        return self._send_one(message, sender.send_or_enqueue).result()

    def send_async(self, topic: str, body: bytes, *, tags: str | None = None,
                   keys: Iterable[str] | str = (), queue_id: int | None = None,
                   properties: Mapping[str, str] | None = None, wait: bool = True) -> Future:
        """Like send, returning a Future that resolves to the PutResult. A valid message of
        send_columns' shape is encoded once by encode_one, as `send` does; any other goes by
        the message path."""
        return self._submit_one(topic, body, tags, keys, queue_id, properties, wait,
                                self._live_sender().enqueue)

    def _submit_one(self, topic: str, body: bytes, tags: str | None, keys: Iterable[str] | str,
                    queue_id: int | None, properties: Mapping[str, str] | None, wait: bool,
                    submit: Callable[[list[Pending]], None]) -> Future:
        """send_async's Future, its records handed to `submit` (the sender's enqueue, or the
        asyncio producer's hand-over at the end of a loop turn)."""
        if _fits_columns(keys, properties, wait):
            record = self._one_record(topic, body, keys if type(keys) is str else (keys[0] if keys else None),
                                      tags, queue_id)
            if record is not None and len(record) <= self._mailbox.data_bytes:
                future: Future = Future()
                self._submit_columns(_one_encoded(record), _resolve(future, operator.itemgetter(0)), submit)
                return future
        return self._send_one(_message(topic, body, tags, keys, queue_id, properties, wait), submit)

    def _send_one(self, message: Message, submit: Callable[[list[Pending]], None]) -> Future:
        future: Future = Future()
        self._send_messages([message], _resolve(future, operator.itemgetter(0)), submit)
        return future

    def send_batch(self, messages: Sequence[Message]) -> list[PutResult]:
        """Put many messages (one request per slot-full); one result each, in order."""
        return self._send_batch(messages, self._live_sender().send_or_enqueue).result()

    def send_batch_async(self, messages: Sequence[Message]) -> Future:
        """Like send_batch, returning a Future of the result list."""
        return self._send_batch(messages, self._live_sender().enqueue)

    def _send_batch(self, messages: Sequence[Message], submit: Callable[[list[Pending]], None]) -> Future:
        """By send_columns when the messages fit it, else message by message."""
        future: Future = Future()
        done = _resolve(future, list)
        columns = _as_columns(messages)
        if columns is not None:
            try:
                self._send_columns(*columns, done, submit)
                return future
            except BadInputError:
                pass  # the message-by-message path gives each bad message its status
        self._send_messages(messages, done, submit)
        return future

    def send_columns(self, topic: str, bodies: Sequence[bytes], *, keys: Sequence[str] | None = None,
                     tags: str | None = None, queue_ids: Sequence[int] | int | None = None
                     ) -> BatchResult:
        """Put len(bodies) messages to `topic`: message i has body bodies[i], the one key
        keys[i] (keys=None: no keys), the TAGS `tags` (None: none) and goes to queue
        queue_ids[i] (one int: all to that queue; None: round robin). Blocks until every
        message is answered; the BatchResult holds one result per message, in order.

        Bad input (a body that is not bytes or too large, a bad key, columns of different
        lengths, ...) raises BadInputError naming it, and nothing of the call is sent."""
        sender = self._live_sender()
        one = one_message(bodies, keys, queue_ids)
        if one is not None:
            body, key, queue_id = one
            result = self._send_one_now(sender, topic, body, key, tags, queue_id)
            if result is not None:
                return result
        return self._send_columns_blocking(sender, topic, bodies, keys, tags, queue_ids)

    def _send_columns_blocking(self, sender: SlotSender, topic: str, bodies: Sequence[bytes],
                               keys: Sequence[str] | None, tags: str | None,
                               queue_ids: Sequence[int] | int | None) -> BatchResult:
        """send_columns by the general path: checked and encoded as columns, sent from this
        thread when the slot is idle, else queued and waited for."""
        encoded = self._encode_open(topic, bodies, keys, tags, queue_ids)
        count = len(encoded.starts)
        answer = sender.request_now(encoded.buf, count) if count else None
        if answer is not None:  # sent from this thread: the answer rows are the result
            rows, reason = answer
            reasons = {} if reason is None else dict.fromkeys(range(count), reason)
            return BatchResult(rows, reasons, self._msg_id_prefix)
        future: Future = Future()
        self._submit_columns(encoded, future.set_result, sender.send_or_enqueue)
        return future.result()

    def send_columns_async(self, topic: str, bodies: Sequence[bytes], *,
                           keys: Sequence[str] | None = None, tags: str | None = None,
                           queue_ids: Sequence[int] | int | None = None) -> Future:
        """Like send_columns, returning a Future of the BatchResult (BadInputError at once)."""
        return self._columns_future(topic, bodies, keys, tags, queue_ids, self._live_sender().enqueue)

    def _columns_future(self, topic: str, bodies: Sequence[bytes], keys: Sequence[str] | None,
                        tags: str | None, queue_ids: Sequence[int] | int | None,
                        submit: Callable[[list[Pending]], None]) -> Future:
        future: Future = Future()
        self._send_columns(topic, bodies, keys, tags, queue_ids, future.set_result, submit)
        return future

    def close(self) -> None:
        """Send what is queued, then give the mailbox slot back. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._forks != _FORKS:  # a forked child that never sent: the slot is the parent's
            with _FORK_LOCK:
                self._adopt_after_fork()
            return
        self._sender.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ------------------------------------------------------------------------------ one message
    def _send_one_now(self, sender: SlotSender, topic: object, body: object, key: object,
                      tags: object, queue_id: object) -> BatchResult | None:
        """A blocking one-message send in the common shape, as straight-line code: one record
        from encode_one, one request from this thread (queued behind the requests of other
        threads when the slot is busy). None, and nothing sent, when the message is not of that
        shape: the general path then checks it and names what is wrong
        (docs/DECISIONS.md#one-message-send)."""
        record = self._one_record(topic, body, key, tags, queue_id)
        if record is None or len(record) > self._mailbox.data_bytes:
            return None
        answer = sender.request_now(record, 1)
        if answer is None:  # the slot is busy: this record through the queue, not encoded again
            future: Future = Future()
            self._submit_columns(_one_encoded(record), future.set_result, sender.send_or_enqueue)
            return future.result()
        rows, reason = answer
        return BatchResult(rows, {} if reason is None else {0: reason}, self._msg_id_prefix)

    def _one_record(self, topic: object, body: object, key: object, tags: object,
                    queue_id: object) -> bytes | None:
        """ipc.one_message.one_record of a message to a valid topic, in a producer that is not
        closed; None otherwise (the general path names what is wrong)."""
        if self._closed or self._sender.closing:
            return None
        try:
            topic_raw = topic_bytes(topic)
        except BadInputError:
            return None
        info = self.info
        return one_record(topic, topic_raw, body, key, tags, queue_id, max_body_bytes=info.max_body_bytes,
                          queue_count=self.write_queue_count(topic), round_robin=self._take_round_robin,
                          born_host=self._born_host, store_host=self._store_host)

    # ------------------------------------------------------------------------------ columns
    def _send_columns(self, topic: str, bodies: Sequence[bytes], keys: Sequence[str] | None,
                      tags: str | None, queue_ids: Sequence[int] | int | None,
                      done: Callable[[BatchResult], None], submit: Callable[[list[Pending]], None]) -> None:
        """Check and encode the columns (BadInputError: nothing is sent), then submit them:
        SlotSender.enqueue, or send_or_enqueue for a caller that waits for the answer."""
        self._submit_columns(self._encode_open(topic, bodies, keys, tags, queue_ids), done, submit)

    def _encode_open(self, topic: str, bodies: Sequence[bytes], keys: Sequence[str] | None,
                     tags: str | None, queue_ids: Sequence[int] | int | None) -> EncodedRecords:
        """_encode_columns, in a producer that is not closed (StoreClosedError)."""
        if self._sender.closing or self._closed:
            raise StoreClosedError("the producer is closed", path=str(self.root))
        return self._encode_columns(topic, bodies, keys, tags, queue_ids)

    def _submit_columns(self, encoded: EncodedRecords, done: Callable[[BatchResult], None],
                        submit: Callable[[list[Pending]], None]) -> None:
        """Hand encoded columns to `submit` as one Pending; `done` gets their BatchResult."""
        builder = BatchResultBuilder(len(encoded.starts), self._msg_id_prefix, done)
        if not len(encoded.starts):
            builder.finish_if_complete()
            return
        submit([Pending(encoded, builder.put, True)])

    def _encode_columns(self, topic: str, bodies: Sequence[bytes], keys: Sequence[str] | None,
                        tags: str | None, queue_ids: Sequence[int] | int | None) -> EncodedRecords:
        topic_raw = topic_bytes(topic)
        bodies = body_column(bodies)
        n = len(bodies)
        keys_raw = key_column(keys, n) if keys is not None else None
        tags_raw = tags_text(tags)
        if queue_ids is not None:
            queue_ids = queue_id_column(queue_ids, n, self.write_queue_count(topic))
        if n and max(map(len, bodies)) > self.info.max_body_bytes:
            big = next(i for i, body in enumerate(bodies) if len(body) > self.info.max_body_bytes)
            raise BadInputError("bodies", f"body {big}: {len(bodies[big])} bytes exceeds the maximum "
                                f"of {self.info.max_body_bytes}")
        if queue_ids is None:
            queue_ids = self._round_robin_ids(topic, n)
        block = new_uniq_key_block(n)
        encoded = encode_columns(topic_raw, bodies, queue_ids, keys_raw=keys_raw, tags_raw=tags_raw,
                                 uniq_prefix=block.prefix, first_counter=block.first_counter,
                                 born_ts_ms=time.time_ns() // 1_000_000, born_host=self._born_host,
                                 store_host=self._store_host)
        # no record can be larger than the slot when all of them together fit in it
        slot_bytes = self._mailbox.data_bytes
        if len(encoded.buf) > slot_bytes and int(encoded.sizes.max()) > slot_bytes:
            raise BadInputError("bodies", f"a record of {int(encoded.sizes.max())} bytes is larger "
                                f"than a mailbox slot ({self._mailbox.data_bytes} bytes)")
        return encoded

    def _round_robin_ids(self, topic: str, count: int) -> list[int]:
        """The next `count` queue ids of `topic`'s round robin."""
        write_queues = self.write_queue_count(topic)
        first = self._take_round_robin(topic, count) % write_queues
        return list(itertools.islice(itertools.cycle(range(write_queues)), first, first + count))

    def _take_round_robin(self, topic: str, count: int) -> int:
        """The first of the next `count` queue ids of `topic`'s round robin over its write
        queues, which moves past them."""
        write_queues = self.write_queue_count(topic)
        with self._round_robin_lock:
            first = self._round_robin.get(topic, 0) % write_queues
            self._round_robin[topic] = (first + count) % write_queues
        return first

    def write_queue_count(self, topic: str) -> int:
        """How many write queues `topic` has by config/topics.json (one stat per call: the file
        is read again only when the supervisor replaced it), the store's default for a topic not
        created yet. The supervisor applies the same rule to what arrives, so a send this view
        let through after a change since is refused there, with the topic's count."""
        try:
            table = self._topic_file.current()
        except TopicFileError:  # someone edited it badly: the supervisor's rule still decides
            table = self._topic_file.table
        return max(table.write_queue_count(topic, TopicDefaults(self.info.queue_count)), 1)

    # ------------------------------------------------------------------------------ messages
    def _send_messages(self, messages: Sequence[Message], done: Callable[[BatchResult], None],
                       submit: Callable[[list[Pending]], None]) -> None:
        """Validate and encode message by message (a bad one gets its status), submit the rest."""
        builder = BatchResultBuilder(len(messages), self._msg_id_prefix, done)
        runs = self._encode_runs(messages, builder)
        if not runs:
            builder.finish_if_complete()
            return
        submit([Pending(encoded, builder.put, wait, np.array(indexes, dtype=np.int64))
                for encoded, indexes, wait in runs])

    def _encode_runs(self, messages: Sequence[Message], builder: BatchResultBuilder
                     ) -> list[tuple[EncodedRecords, list[int], bool]]:
        """Validate each message (a bad one gets its status from `builder.fail`) and encode the
        rest, many at once, in runs of equal `wait` (which never share a request)."""
        runs: list[tuple[bool, list[int], list[tuple[bytes, bytes, bytes, int]]]] = []
        limits: dict[str | None, PutLimits] = {}  # per topic: its write queues bound the queue ids
        for i, (message, uniq_key) in enumerate(zip(messages, new_uniq_key_block(len(messages)).texts(),
                                                    strict=True)):
            topic = getattr(message, "topic", None)
            topic = topic if type(topic) is str else None  # not a topic: message_parts says why
            if topic not in limits:
                limits[topic] = self._put_limits(topic)
            try:
                topic_raw, body, props_raw, queue_id = message_parts(message, uniq_key, limits[topic])
            except BadInputError as exc:
                builder.fail(i, exc.put_status, str(exc))
                continue
            if queue_id is None:
                queue_id = self._take_round_robin(message.topic, 1)
            parts = (topic_raw, body, props_raw, queue_id)
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

    def _put_limits(self, topic: str | None) -> PutLimits:
        """engine.message's limits of the supervisor attached to for a message to `topic`: its
        write queues (None, no topic: any queue count, as the topic is refused), and a record
        that fits a mailbox slot."""
        info, slot_bytes = self.info, self._mailbox.data_bytes
        queue_count = MAX_QUEUE_COUNT if topic is None else self.write_queue_count(topic)
        return PutLimits(queue_count, info.max_body_bytes, slot_bytes,
                         f"a mailbox slot of {slot_bytes} bytes", info.delay_level_count,
                         info.timer_max_delay_s)
