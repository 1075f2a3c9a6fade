"""MessageStore: the whole store in one process (commitlog, consume queues, index, recovery).

It composes the engine's parts and holds little logic of its own: put encodes outside any
lock, appends, flushes by policy, then dispatches by tailing the log exactly as the
dispatcher process does, so both build identical files.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from engine.config import FlushPolicy, StoreConfig
from engine.delivery.scheduled import ScheduledDelivery, encode_deliveries
from engine.dispatch.record import dispatch_columns
from engine.errors import (
    BadInputError,
    DiskFullError,
    StoreClosedError,
)
from engine.files.filesystem import disk_usage_ratio
from engine.files.naming import validate_topic
from engine.files.store_dir import (
    StoreLock,
    mark_clean_stop,
)
from engine.filters.subscription import subscription_of
from engine.formats.checkpoint import Checkpoint
from engine.formats.index_file import shard_of
from engine.formats.msg_id import make_msg_id
from engine.formats.record import (
    FILLER_SIZE,
    Record,
    Verify,
    store_ts_at,
)
from engine.formats.record.encode_many import EncodedRecords, encode_records
from engine.formats.store_meta import MAX_QUEUE_COUNT
from engine.formats.uniq_key import new_uniq_keys
from engine.log.record_reads import read_key_records, read_subscribed_records
from engine.message import (
    Message,
    PutLimits,
    message_parts,
    normalize_keys,
)
from engine.queues.consume_queue import Boundary
from engine.recovery.checkpoint import write_checkpoint
from engine.recovery.durable_times import CheckpointTimes
from engine.recovery.recover import (
    RecoveryMode,
    RecoveryReport,
    StoreParts,
)
from engine.retention import expiry as retention
from engine.retention.segment_age import SegmentAges
from engine.status import GetResult, GetStatus, PutResult, PutStatus
from engine.store_open import Dispatch, close_parts, open_store
from engine.topics.live import LiveTopics
from engine.topics.table import TopicChange, TopicDefaults, TopicTable, TopicTableFile

DISK_CHECK_INTERVAL_MS = 1000
_log = logging.getLogger(__name__)

class _EncodedBatch(NamedTuple):
    """The accepted messages of a put_batch (indexes into it) and their encoded records."""

    accepted: list[int]
    topics: list[str]
    queue_ids: list[int]
    records: EncodedRecords


def _now_ms() -> int:
    return int(time.time() * 1000)


class MessageStore:
    """The in-process store; use `MessageStore.open(path)` and close it (or use `with`)."""

    def __init__(self, root: Path, config: StoreConfig, lock: StoreLock, parts: StoreParts,
                 report: RecoveryReport, topics: TopicTable):
        self.root = root
        self.config = config
        self.recovery_report = report
        self._lock = lock
        self._parts = parts
        self.commitlog = parts.commitlog
        self.queues = parts.queues
        self.shards = parts.shards
        self._next_offsets = {(q.topic, q.queue_id): q.max_offset for q in self.queues}
        self._dispatched_pos = self.commitlog.written_pos
        self._store_host = config.store_ip_port
        segment_bytes = self.commitlog.segment_bytes  # a record and the filler before it fit a segment
        # queue ids are bounded per topic by the topic table's rule (LiveTopics.route)
        self._put_limits = PutLimits(MAX_QUEUE_COUNT, config.max_body_bytes, segment_bytes - FILLER_SIZE,
                                     f"a commitlog segment of {segment_bytes} bytes",
                                     len(config.delay_levels_ms), config.timer_max_delay_s)
        self._topics = LiveTopics(TopicTableFile(root), topics,
                                  TopicDefaults(config.queue_count, config.auto_create_topic))
        self.delivery = ScheduledDelivery.load(root, config.delay_levels_ms, config.queue_count, _now_ms())
        self.delivery.recover_delivered(self.commitlog, self.queues)
        self._last_checkpoint_ms = self._flushed_at_ms = _now_ms()
        self._disk_checked_ms = 0
        self._disk_full = False
        self._dispatch_deferred = False  # a dispatch met a full disk; the next put retries it
        self._closed = False
        self._times = CheckpointTimes(self.commitlog, root, len(self.shards))
        self._segment_ages = SegmentAges()

    @classmethod
    def open(cls, path: str | Path, config: StoreConfig | None = None, *,
             recovery: RecoveryMode = RecoveryMode.ROUTINE,
             progress: Callable[[int, int], None] | None = None) -> MessageStore:
        """Open (creating if new) a store for writing; runs recovery before returning."""
        opened = open_store(path, config or StoreConfig(), writer="MessageStore.open",
                            dispatch=Dispatch.IN_PROCESS, recovery=recovery, progress=progress)
        try:
            return cls(opened.root, opened.config, opened.lock, opened.parts, opened.report, opened.topics)
        except BaseException:  # an unreadable delayOffset.json: the store is not left locked
            close_parts(opened.parts)
            opened.lock.release()
            raise

    # -- writing ---------------------------------------------------------------------------

    def put(self, topic: str, body: bytes, *, tags: str | None = None, keys=(), queue_id: int = 0,
            properties: dict[str, str] | None = None, delay_level: int | None = None,
            deliver_at_ms: int | None = None) -> PutResult:
        """Append one message; the result's status says whether it is stored (and durable).
        With `delay_level` or a future `deliver_at_ms` it waits in a system topic until
        `deliver_due` delivers it."""
        message = Message(topic, body, tags=tags, keys=keys, queue_id=queue_id,
                          properties=properties or {}, delay_level=delay_level, deliver_at_ms=deliver_at_ms)
        return self.put_batch([message])[0]

    def put_batch(self, messages: Iterable[Message]) -> list[PutResult]:
        """Append messages with one flush; bad ones get their own status, the rest are stored.

        PUT_OK means the record is in the commitlog (durable under SYNC flush), whatever its
        dispatch met: when the consume queues or index have no disk space, get_messages and
        query_by_key may miss the record until a later put (or close) finds space to dispatch it.
        """
        self._require_open()
        messages = list(messages)
        if self._is_disk_full():
            return [PutResult(PutStatus.DISK_FULL, reason="disk usage above "
                              f"{self.config.disk_full_ratio:.0%}") for _ in messages]
        results: list[PutResult | None] = [None] * len(messages)
        batch = self._encode_batch(messages, results)
        if batch is not None:
            self._append(batch, results)
        return results  # type: ignore[return-value]

    def _encode_batch(self, messages: list[Message], results: list) -> _EncodedBatch | None:
        """Validate each message (a bad one gets its status in `results`); encode the rest at once."""
        accepted, topics, bodies, props, queue_ids = [], [], [], [], []
        for i, (message, uniq_key) in enumerate(zip(messages, new_uniq_keys(len(messages)), strict=True)):
            try:
                limits = self._limits_of(message)
                topic_raw, body, props_raw, queue_id = message_parts(message, uniq_key, limits)
                queue_id = queue_id or 0  # a message naming no queue goes to queue 0 here
                stored_topic = topic_raw.decode("utf-8")
                if stored_topic != message.topic:  # delayed or timed: its real topic's rule holds now
                    self._topics.route(message.topic, message.queue_id or 0)
                self._topics.route(stored_topic, queue_id)
            except BadInputError as exc:
                results[i] = PutResult(exc.put_status, reason=str(exc))
                continue
            accepted.append(i)
            topics.append(topic_raw)
            bodies.append(body)
            props.append(props_raw)
            queue_ids.append(queue_id)
        if not accepted:
            return None
        records = encode_records(topics, bodies, props, queue_ids, born_ts_ms=_now_ms(),
                                 born_host=("127.0.0.1", _pid_port()), store_host=self._store_host)
        # the stored topic: SCHEDULE_TOPIC_XXXX for a delayed message, whose queue offsets it takes
        return _EncodedBatch(accepted, [topic.decode("utf-8") for topic in topics], queue_ids, records)

    def _limits_of(self, message: Message) -> PutLimits:
        """The put limits; for a delayed or timed message naming no queue, with its topic's write
        queues, among which its real queue is picked (every other queue id is the route's rule)."""
        waits = getattr(message, "delay_level", None) is not None or getattr(message, "deliver_at_ms", None)
        if not waits or getattr(message, "queue_id", 0) is not None:
            return self._put_limits
        try:
            topic = validate_topic(message.topic)
        except BadInputError:
            return self._put_limits  # message_parts says what is wrong with it
        count = self._topics.table.write_queue_count(topic, self._topics.defaults)
        return replace(self._put_limits, queue_count=count)

    def _append(self, batch: _EncodedBatch, results: list) -> None:
        offsets, next_offsets = [], {}
        keys = list(zip(batch.topics, batch.queue_ids, strict=True))
        for key in keys:
            offset = next_offsets.get(key, self._next_offsets.get(key, 0))
            next_offsets[key] = offset + 1
            offsets.append(offset)
        store_ts_ms = _now_ms()
        records = batch.records
        try:
            positions = self.commitlog.append_encoded(records.buf, records.starts, records.sizes,
                                                      offsets, store_ts_ms).tolist()
        except DiskFullError as exc:  # nothing was written; the offsets stay free
            for i in batch.accepted:
                results[i] = PutResult(PutStatus.DISK_FULL, reason=str(exc))
            return
        self._next_offsets.update(next_offsets)  # only once the records are in: no offset is lost
        self._flush_by_policy()
        self._dispatch_or_defer()
        id_prefix = make_msg_id(self._store_host, 0)[:-16]  # msgId ends with the position in hex
        for i, key, offset, pos in zip(batch.accepted, keys, offsets, positions, strict=True):
            results[i] = PutResult(PutStatus.PUT_OK, commit_pos=pos, queue_id=key[1],
                                   queue_offset=offset, msg_id=f"{id_prefix}{pos:016X}",
                                   store_ts_ms=store_ts_ms)
        self._maybe_checkpoint()

    def deliver_due(self, *, now_ms: int | None = None, max_count: int = 4096) -> int:
        """Put the delayed messages due at `now_ms` into their real topics (at most `max_count`);
        returns how many. In-process, nothing runs on its own: the caller decides when."""
        self._require_open()
        now_ms = _now_ms() if now_ms is None else now_ms
        plan = self.delivery.due(self.queues, self.commitlog.read_at,
                                 range(self.commitlog.min_pos, self._dispatched_pos), now_ms, max_count)
        if plan.deliveries:
            records = encode_deliveries(plan.deliveries, self._store_host)
            topics = [d.topic for d in plan.deliveries]
            queue_ids = [d.queue_id for d in plan.deliveries]
            results: list = [None] * len(topics)
            self._append(_EncodedBatch(list(range(len(topics))), topics, queue_ids, records), results)
            if results[0].status is not PutStatus.PUT_OK:
                raise DiskFullError(f"delivering delayed messages: {results[0].reason}", path=str(self.root))
            self.commitlog.flush()  # the progress file may count only flushed copies
        self.delivery.done(plan)
        if self.delivery.unsaved:
            self.delivery.save(self.commitlog.written_pos)
        return len(plan.deliveries)

    def _flush_by_policy(self) -> None:
        if self.config.flush is FlushPolicy.SYNC:
            self.commitlog.flush()
            return
        # FlushRealTimeService's rule, checked on put instead of by a timer thread: every
        # interval when enough pages are dirty, and everything every thorough interval.
        dirty = self.commitlog.written_pos - self.commitlog.flushed_pos
        since_ms = _now_ms() - self._flushed_at_ms
        if dirty and ((since_ms >= self.config.async_flush_interval_ms
                       and dirty >= self.config.async_flush_least_pages * 4096)
                      or since_ms >= self.config.async_flush_thorough_interval_ms):
            self.commitlog.flush()
            self._flushed_at_ms = _now_ms()

    def _dispatch_limit(self) -> int:
        """Under sync flush nothing past the flushed position is visible (RocketMQ #8239)."""
        if self.config.flush is FlushPolicy.SYNC:
            return self.commitlog.flushed_pos
        return self.commitlog.written_pos

    def _dispatch_or_defer(self) -> None:
        """Dispatch what is appended; on a full disk leave it for the next put (or close) to
        retry: the records are already in the commitlog, so their puts must not fail for it.
        Dispatch is idempotent (queues reconcile present entries, shards skip processed keys)."""
        try:
            self._dispatch_until(self._dispatch_limit())
        except DiskFullError as exc:
            if not self._dispatch_deferred:
                _log.warning("dispatch waits for disk space (records stay appended; retried on "
                             "the next put): %s", exc)
            self._dispatch_deferred = True
            return
        if self._dispatch_deferred:
            _log.info("dispatch resumed: queues and index caught up to %d", self._dispatched_pos)
        self._dispatch_deferred = False

    def _dispatch_until(self, end_pos: int) -> None:
        """Tail the log to end_pos as the dispatcher does, many records per step."""
        if end_pos <= self._dispatched_pos:
            return
        for run in self.commitlog.scan_batches(self._dispatched_pos, end_pos, Verify.STRUCTURE):
            dispatch_columns(self.queues, self.shards, run.columns())
        self._dispatched_pos = end_pos

    def _maybe_checkpoint(self) -> None:
        if _now_ms() - self._last_checkpoint_ms >= self.config.cq_flush_interval_ms:
            self.checkpoint()

    def checkpoint(self) -> Checkpoint:
        """Flush consume queues and index, then record every durable position atomically."""
        self._require_open()
        dispatched = self._dispatched_pos
        self.queues.flush_all()
        index_positions = tuple(shard.sync() for shard in self.shards)
        cp = self._times.checkpoint(self.commitlog.flushed_pos, dispatched, index_positions)
        write_checkpoint(self.root, cp)
        self._last_checkpoint_ms = _now_ms()
        return cp

    def _is_disk_full(self) -> bool:
        now = _now_ms()
        if now - self._disk_checked_ms >= DISK_CHECK_INTERVAL_MS:
            self._disk_checked_ms = now
            self._disk_full = disk_usage_ratio(self.root) >= self.config.disk_full_ratio
        return self._disk_full

    def clean_expired(self, *, now_ms: int | None = None,
                      kind: retention.PassKind = retention.PassKind.SCHEDULED) -> retention.RetentionReport:
        """Run one retention pass (by age at the delete hour or on demand, or by disk usage).

        The pass's DISK_FULL verdict is adopted at once (as RocketMQ's cleaner sets the bit),
        so puts refuse or resume without waiting for the next periodic disk check.
        """
        self._require_open()
        report = retention.run_retention(self._parts, self.config, now_ms=now_ms, kind=kind,
                                         ages=self._segment_ages,
                                         scheduled_pos=self.delivery.waiting_pos(self.queues))
        self._disk_full = report.disk_full
        self._disk_checked_ms = _now_ms()
        return report

    # -- topics ----------------------------------------------------------------------------

    @property
    def topics(self) -> TopicTable:
        """The topic table (config/topics.json) as this store applies it."""
        return self._topics.table

    def change_topic(self, change: TopicChange) -> TopicTable:
        """`mqstore topic create|update|delete` in this process (BadInputError, nothing changed,
        when it cannot apply). A delete drops the topic's consume queues; its records stay in
        the log until retention, below the tombstone no dispatch reads again."""
        self._require_open()
        table = self._topics.apply(change, self._next_offsets, self.commitlog.flush)
        self.queues.bury(table.tombstones)
        return table

    # -- reading ---------------------------------------------------------------------------

    def read_at(self, commit_pos: int) -> Record:
        """The record at a commit position (raises BadInputError outside the log)."""
        self._require_open()
        if commit_pos >= self._dispatch_limit():
            raise BadInputError("commit_pos", f"{commit_pos} is past the readable end "
                                f"{self._dispatch_limit()}")
        return self.commitlog.read_at(commit_pos, verify=Verify.MQSTORE)

    def get_messages(self, topic: str, queue_id: int, offset: int, max_count: int = 32, *,
                     tags: str | None = None, where: str | None = None) -> GetResult:
        """Up to max_count messages of one queue from a queue offset, with RocketMQ's statuses;
        with `tags` ('A || B') or `where` (a property filter) only those subscribed
        (engine.filters.subscription: next_offset passes what was filtered out, the scan is bounded)."""
        self._require_open()
        validate_topic(topic)
        subscription = subscription_of(tags, where)
        for name, value in (("queue_id", queue_id), ("offset", offset), ("max_count", max_count)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise BadInputError(name, f"must be a non-negative int, not {value!r}")
        queue = self.queues.get(topic, queue_id)
        if queue is None or queue.max_offset == 0:
            return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE)
        low, high = queue.min_offset, queue.max_offset
        status = _offset_status(offset, low, high)
        if status is not None:
            next_offset = {GetStatus.OFFSET_TOO_SMALL: low, GetStatus.OFFSET_OVERFLOW_ONE: offset,
                           GetStatus.OFFSET_OVERFLOW_BADLY: high}[status]
            return GetResult(status, next_offset=next_offset, min_offset=low, max_offset=high)
        entries = queue.entries(offset, subscription.scan_entries(max_count))
        read = read_subscribed_records(self.commitlog, queue, offset, entries, subscription, max_count)
        status = GetStatus.FOUND if read.records else GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, read.records, offset + read.examined, low, high, read.skipped)

    def query_by_key(self, topic: str, key: str, begin_ms: int = 0, end_ms: int | None = None,
                     max_count: int = 64) -> list[Record]:
        """Messages of `topic` with this key (or UNIQ_KEY), oldest first; collisions filtered out,
        a corrupt record skipped and logged at WARNING (engine.log.record_reads)."""
        self._require_open()
        validate_topic(topic)
        normalize_keys(key)  # a str, UTF-8, no separators: BadInputError rather than a codec error
        end_ms = 2**63 - 1 if end_ms is None else end_ms
        shard = self.shards[shard_of(topic, key, len(self.shards))]
        positions = shard.query(topic, key, begin_ms, end_ms, max_count)
        return read_key_records(self.commitlog, positions, topic, key, begin_ms, end_ms,
                                max_count=max_count, end_pos=self._dispatch_limit(),
                                tombstone_pos=self.topics.tombstone_of(topic)).records

    def offset_for_time(self, topic: str, queue_id: int, ts_ms: int,
                        boundary: Boundary = Boundary.LOWER) -> int:
        """The queue offset of the first (LOWER) or last (UPPER) message stored at ts_ms."""
        self._require_open()
        queue = self.queues.get(topic, queue_id)
        if queue is None:
            return 0
        return queue.offset_for_time(ts_ms, boundary, self._store_ts_of, self.commitlog.min_pos)

    def _store_ts_of(self, commit_pos: int, size: int) -> int:
        return store_ts_at(self.commitlog.read_bytes(commit_pos, size), 0)

    def min_offset(self, topic: str, queue_id: int) -> int:
        queue = self.queues.get(topic, queue_id)
        return 0 if queue is None else queue.min_offset

    def max_offset(self, topic: str, queue_id: int) -> int:
        queue = self.queues.get(topic, queue_id)
        return 0 if queue is None else queue.max_offset

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Flush everything, write the last checkpoint, remove `abort`, release the lock."""
        if self._closed:
            return
        self.commitlog.flush()
        self._dispatch_until(self.commitlog.written_pos)
        self.checkpoint()
        mark_clean_stop(self.root)
        self._closed = True
        close_parts(self._parts)
        self._lock.release()

    def _require_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the store is closed", path=str(self.root))

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _offset_status(offset: int, low: int, high: int) -> GetStatus | None:
    if offset < low:
        return GetStatus.OFFSET_TOO_SMALL
    if offset == high:
        return GetStatus.OFFSET_OVERFLOW_ONE
    if offset > high:
        return GetStatus.OFFSET_OVERFLOW_BADLY
    return None


def _pid_port() -> int:
    """BORNHOST carries 127.0.0.1 and the producer's pid as its port (DESIGN §3)."""
    return os.getpid() & 0x7FFFFFFF
