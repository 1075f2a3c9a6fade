"""The supervisor's check of the records a producer put in its mailbox slot, before any is appended.

Producers encode records themselves (encode_record), so the supervisor only stamps and copies;
this module is what stops a buggy or hostile producer from getting garbage into the log. A
record passes when it is structurally valid by the record codec's rules (structure: the lengths
chain to TOTALSIZE; PHYSICALOFFSET is exempt, as are QUEUEOFFSET and STORETIMESTAMP, which
stamp_record overwrites), its BODYCRC matches its body, its topic is valid and its properties
are UTF-8, and it meets what is asked of a producer's record here: TOTALSIZE the bytes it
occupies, magic v1 with IPv4 hosts, a queue id among its topic's write queues in a topic that
may be written (the topic table's rule, engine.topics.table), a body within the maximum, no
transaction PREPARED or ROLLBACK bit, a fit in one segment and the reserved __CRC32C slot ending
its properties. Anything else raises RecordRefusedError: the record gets MESSAGE_ILLEGAL and
never reaches the log, its answer row carrying the refusal's code (engine.refusal), so the
producer's error says why.

`check` is the rule, record by record (struct, structure's scalar form); `check_request` runs
it on each record of a small request (up to tuning.STRUCT_PATH_MAX_RECORDS, where numpy's
fixed cost per call would dominate: docs/DECISIONS.md#small-batches-scalar). A larger request
is checked as a whole against its first record, which must pass `check`: the producer's header
rules by one masked unsigned comparison, then TOPICLENGTH + topic equal to the first record's
and PROPERTIESLENGTH what TOTALSIZE leaves (so structure's length rules hold as they hold for
the first record), the __CRC32C slot as encoders reserve it, ASCII properties and the BODYCRC
(one zlib.crc32 per body, on a view of it). A record that differs in any of these (another
topic, non-ASCII properties, a mistake) is given to `check`, which accepts it or says why not:
the batch path only ever accepts records that `check` accepts, and refuses none that it accepts.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from engine.errors import BadInputError, CorruptRecordError, RecordRefusedError
from engine.files.naming import validate_topic
from engine.formats.crc32c_property import CRC32C_PREFIX, CRC32C_PROP_SIZE, CRC32C_RESERVED
from engine.formats.properties import SEP_PROP
from engine.formats.record.arrays import crc32_each, int_view
from engine.formats.record.layout import (
    BODY_CRC_MASK,
    BODY_LENGTH_OFFSET,
    BODY_OFFSET,
    FIELD_INDEX,
    FIELD_OFFSETS,
    FILLER_SIZE,
    HOSTS_V6,
    MAGIC_V1,
    PROPERTIES_LENGTH_SIZE,
    RECORD_FIXED_SIZE,
    TOPIC_LENGTH_SIZE_V1,
    V4_HEADER_FMT,
    V4_HEADER_SIZE,
)
from engine.formats.record.spans import walk_chain
from engine.formats.record.stamp_many import StampableRecords
from engine.formats.record.structure import locate_parts
from engine.formats.store_meta import MAX_QUEUE_COUNT
from engine.record_rules import HALF_OR_ROLLBACK_BIT
from engine.refusal import Refusal, refused
from engine.topics.system import TIMER_SLOTS, is_system_topic, is_written_by_delayed_sends
from engine.topics.table import TopicConfig
from engine.tuning import STRUCT_PATH_MAX_RECORDS

_HEADER = struct.Struct(V4_HEADER_FMT)
_I32 = struct.Struct(">i")  # BODYLENGTH
# The header fields both paths check: by struct index in `check`, by 32-bit word in the batch.
_WORD_FIELDS = ("total_size", "magic", "body_crc", "queue_id", "sys_flag", "body_length")
_F_TOTAL, _F_MAGIC, _F_BODY_CRC, _F_QUEUE_ID, _F_SYS_FLAG, _F_BODY_LENGTH = (
    FIELD_INDEX[name] for name in _WORD_FIELDS)
_MAX_TOPIC_CACHE = 4096
# a queue id any topic may have: a configured topic's bound, or the timer topic's wheel of slots;
# each topic's own count is the route's rule
_QUEUE_ID_BOUND = max(MAX_QUEUE_COUNT, TIMER_SLOTS)
_MIN_RECORD_BYTES = RECORD_FIXED_SIZE + CRC32C_PROP_SIZE  # room for the __CRC32C slot
_CRC32C_SEPARATOR = SEP_PROP[0]  # the byte that closes the __CRC32C property

# The producer's header rules, per header word (every V4 header field starts at a multiple of
# 4): each checked big-endian 32-bit word must satisfy (word & AND) - SUB <= LIMIT in uint32.
_WORD_BYTES = 4
_HEADER_WORDS = V4_HEADER_SIZE // _WORD_BYTES
_TAIL_VOID = f"V{CRC32C_PROP_SIZE}"
_RESERVED_TAIL = np.void(CRC32C_RESERVED)
_HEADER_VOID = f"V{V4_HEADER_SIZE}"
_CHECKED_WORDS = np.array([FIELD_OFFSETS[name] // _WORD_BYTES for name in _WORD_FIELDS])
_TOTAL_WORD, _MAGIC_WORD, _BODY_CRC_WORD, _QUEUE_ID_WORD, _SYS_FLAG_WORD, _BODY_LENGTH_WORD = range(
    len(_WORD_FIELDS))
assert V4_HEADER_SIZE % _WORD_BYTES == 0 and all(FIELD_OFFSETS[n] % _WORD_BYTES == 0 for n in _WORD_FIELDS)
_SIGN_BIT = 0x8000_0000
_ALL_BITS = 0xFFFF_FFFF


Route = Callable[[str, int], TopicConfig]  # the topic's config, or RecordRefusedError


class CheckedRequest(NamedTuple):
    """The records of one request: where each lies, which passed, and their routing."""

    starts: np.ndarray  # int64
    sizes: np.ndarray  # int64
    ok: np.ndarray  # bool
    topics: list[str | None]  # None where not ok
    queue_ids: np.ndarray  # int64, -1 where not ok
    reasons: dict[int, RecordRefusedError]  # why each rejected record was rejected

    @property
    def good_rows(self) -> np.ndarray | slice:
        """The rows of the records that passed (a slice of all when every one did)."""
        return np.flatnonzero(self.ok) if self.reasons else slice(None)


class MergedRecords(NamedTuple):
    """The good records of several checked requests as one append: the records, their routing,
    and each request's span [first, end) of them, in request order."""

    records: StampableRecords
    topics: list[str]
    queue_ids: np.ndarray  # int64
    spans: list[tuple[int, int]]

    @property
    def count(self) -> int:
        return len(self.queue_ids)


def merge_checked(data: bytearray | memoryview, parts: list[tuple[int, CheckedRequest]]) -> MergedRecords:
    """The good records of requests checked in place in `data` (request i's records start at
    byte parts[i][0]), in order, ready for CommitLog.append_stampable (this check demands more
    of each record than stamp_many.check_stampable): `data` itself when the requests cover it
    end to end and every record passed, else a new buffer holding only the good ones."""
    spans: list[tuple[int, int]] = []
    starts, sizes, queue_ids, topics = [], [], [], []
    for base, checked in parts:
        good = checked.good_rows
        starts.append(base + checked.starts[good])
        sizes.append(checked.sizes[good])
        queue_ids.append(checked.queue_ids[good])
        topics.extend([topic for topic in checked.topics if topic is not None] if checked.reasons
                      else checked.topics)
        spans.append((spans[-1][1] if spans else 0, len(topics)))
    at, size_of, queue_of = np.concatenate(starts), np.concatenate(sizes), np.concatenate(queue_ids)
    if int(size_of.sum()) == len(data):  # all passed and nothing lies between: append in place
        return MergedRecords(StampableRecords(data, at, size_of), topics, queue_of, spans)
    with memoryview(data) as view:
        blob = bytearray().join([view[s:s + n] for s, n in zip(at.tolist(), size_of.tolist(), strict=True)])
    at = np.zeros(len(size_of), dtype=np.int64)
    np.cumsum(size_of[:-1], out=at[1:])
    return MergedRecords(StampableRecords(blob, at, size_of), topics, queue_of, spans)


class RecordChecker:
    """Checks request records against one store's limits; caches validated topics."""

    def __init__(self, *, max_body_bytes: int, segment_bytes: int, route: Route):
        """`route`: the topic table's put rule (engine.topics.live.LiveTopics.route), which
        refuses a queue past the topic's write queues or a topic without write permission."""
        if max_body_bytes < 0:
            raise BadInputError("max_body_bytes", f"{max_body_bytes} body bytes")
        self.max_body_bytes = max_body_bytes
        self.max_record_bytes = segment_bytes - FILLER_SIZE
        self._route = route
        self._topics: dict[bytes, str] = {}
        self._word_rules = _header_word_rules(max_body_bytes, _QUEUE_ID_BOUND, self.max_record_bytes)

    def check(self, record: memoryview) -> tuple[str, int]:
        """(topic, queue_id) of a well-formed record; RecordRefusedError naming what is wrong."""
        return self._check_at(record, 0, len(record))

    def _check_at(self, view: memoryview, start: int, size: int) -> tuple[str, int]:
        """`check` of the record of `size` bytes at view[start:]."""
        if size < _MIN_RECORD_BYTES:
            raise refused(Refusal.TOO_SHORT, limit=_MIN_RECORD_BYTES, found=size)
        if size > self.max_record_bytes:
            raise refused(Refusal.SEGMENT_FIT, limit=self.max_record_bytes, found=size)
        fields = _HEADER.unpack_from(view, start)
        if fields[_F_TOTAL] != size:
            raise refused(Refusal.TOTAL_SIZE, limit=size, found=fields[_F_TOTAL])
        if fields[_F_MAGIC] != MAGIC_V1:
            raise refused(Refusal.MAGIC, found=fields[_F_MAGIC])
        sys_flag, queue_id, body_len = fields[_F_SYS_FLAG], fields[_F_QUEUE_ID], fields[_F_BODY_LENGTH]
        if sys_flag & HOSTS_V6 or sys_flag < 0:
            raise refused(Refusal.IPV6_HOSTS, found=sys_flag)
        # mqstore has no transactions: a PREPARED or ROLLBACK record, which RocketMQ keeps out of
        # consume queues, is refused (one acknowledged with an offset and kept out left a gap)
        if sys_flag & HALF_OR_ROLLBACK_BIT:
            raise refused(Refusal.TRANSACTION, found=sys_flag)
        if not 0 <= queue_id < _QUEUE_ID_BOUND:  # the topic's own count is the route's rule
            raise refused(Refusal.QUEUE_ID, limit=_QUEUE_ID_BOUND, found=queue_id)
        if not 0 <= body_len <= self.max_body_bytes:
            raise refused(Refusal.BODY_SIZE, limit=self.max_body_bytes, found=body_len)
        body_pos, end = start + BODY_OFFSET, start + size
        try:  # the codec's structural rules; PHYSICALOFFSET is stamped later, so it is not one
            body_end, topic_pos, props_pos = locate_parts(view, start, size, MAGIC_V1, body_pos,
                                                          body_len, start)
        except CorruptRecordError as exc:
            raise refused(Refusal.STRUCTURE, detail=exc.reason) from None
        crc_pos = end - CRC32C_PROP_SIZE
        if crc_pos < props_pos or view[crc_pos:crc_pos + len(CRC32C_PREFIX)] != CRC32C_PREFIX \
                or view[end - 1] != _CRC32C_SEPARATOR:
            raise refused(Refusal.CRC32C_SLOT)
        if zlib.crc32(view[body_pos:body_end]) & BODY_CRC_MASK != fields[_F_BODY_CRC]:
            raise refused(Refusal.BODY_CRC)
        try:
            str(view[props_pos:crc_pos], "utf-8")
        except UnicodeDecodeError:
            raise refused(Refusal.PROPERTIES_UTF8) from None
        topic = self._topic(bytes(view[topic_pos:props_pos - PROPERTIES_LENGTH_SIZE]))
        self._route(topic, queue_id)
        return topic, queue_id

    def check_request(self, data: bytearray | memoryview, count: int) -> CheckedRequest:
        """Check the `count` records laid end to end in `data` (BadInputError if the framing
        itself is broken: then no record can be trusted)."""
        starts, sizes = _frame(data, count)
        with memoryview(data) as view:
            if count > STRUCT_PATH_MAX_RECORDS:
                try:
                    return self._check_batch(data, view, starts, sizes)
                except BadInputError:  # the first record is bad: no template to check against
                    pass
            return self._check_each(view, starts, sizes)

    def check_few(self, view: memoryview, start: int, end: int, count: int
                  ) -> list[tuple[int, int, str, int]] | None:
        """check_request of a request of a few records laid in view[start:end], all of which
        pass: (start, size, topic, queue_id) per record, in lists and tuples, no numpy. None when
        the framing is broken or a record fails; check_request then says which and why."""
        try:
            starts, sizes = _frame_span(view, start, end, count)
        except BadInputError:
            return None
        routes = []
        for at, size in zip(starts, sizes, strict=True):
            try:
                topic, queue_id = self._check_at(view, at, size)
            except BadInputError:
                return None
            routes.append((at, size, topic, queue_id))
        return routes

    def _check_each(self, view: memoryview, starts: list[int], sizes: list[int]) -> CheckedRequest:
        """check_request record by record."""
        topics: list[str | None] = []
        queue_ids: list[int] = []
        reasons: dict[int, RecordRefusedError] = {}
        for i, (start, size) in enumerate(zip(starts, sizes, strict=True)):
            try:
                topic, queue_id = self._check_at(view, start, size)
            except RecordRefusedError as exc:
                reasons[i] = exc
                topic, queue_id = None, -1
            topics.append(topic)
            queue_ids.append(queue_id)
        return CheckedRequest(np.array(starts, dtype=np.int64), np.array(sizes, dtype=np.int64),
                              np.array([t is not None for t in topics], dtype=bool), topics,
                              np.array(queue_ids, dtype=np.int64), reasons)

    def _check_batch(self, data: bytearray | memoryview, view: memoryview, starts: list[int], sizes: list[int]
                     ) -> CheckedRequest:
        """check_request with whole-array operations, against the first record (which must pass
        `check`: BadInputError if not). Records that do not match it go to `check`.

        The structural rules hold for a record that has the first record's TOPICLENGTH + topic
        and a PROPERTIESLENGTH equal to what TOTALSIZE leaves after its body: that equality is
        checked here instead of the length rules' vector form (structure.frame_many), which
        costs more than this whole check for a request's few dozen records."""
        topic, first_queue_id = self._check_at(view, starts[0], sizes[0])
        write_queues = self._route(topic, first_queue_id).write_queue_count
        topic_piece = _topic_piece(view, starts[0])  # TOPICLENGTH + topic of the first record
        n = len(starts)
        u8 = np.frombuffer(data, dtype=np.uint8)
        start_at = np.array(starts, dtype=np.int64)
        size_of = np.array(sizes, dtype=np.int64)
        ends = start_at + size_of
        # A header of a record shorter than that may run past the data: read the first record's
        # instead; its TOTALSIZE then leaves no room for properties (props_len below) and it fails.
        short = min(sizes) < _MIN_RECORD_BYTES
        heads_at = np.where(size_of >= _MIN_RECORD_BYTES, start_at, starts[0]) if short else start_at
        words = int_view(u8, _HEADER_VOID)[heads_at].view(">u4").reshape(n, _HEADER_WORDS)
        fields = words[:, _CHECKED_WORDS].astype(np.uint32)
        and_, sub, limit = self._word_rules
        ok = (((fields & and_) - sub) <= limit).all(axis=1)
        body_len = fields[:, _BODY_LENGTH_WORD].astype(np.int64)
        props_len = size_of - (RECORD_FIXED_SIZE + len(topic_piece) - TOPIC_LENGTH_SIZE_V1) - body_len
        ok &= props_len >= CRC32C_PROP_SIZE  # then every position below lies inside its record
        body_pos = start_at + BODY_OFFSET
        topic_len_pos = np.where(ok, body_pos + body_len, starts[0] + BODY_OFFSET + int(body_len[0]))
        props_len_pos = topic_len_pos + len(topic_piece)
        ok &= int_view(u8, f"V{len(topic_piece)}")[topic_len_pos] == np.void(topic_piece)
        ok &= int_view(u8, ">i2")[props_len_pos] == props_len
        crc_pos = ends - CRC32C_PROP_SIZE
        ok &= int_view(u8, _TAIL_VOID)[crc_pos] == _RESERVED_TAIL  # as encoders leave it: digits 0
        props_pos = props_len_pos + PROPERTIES_LENGTH_SIZE
        bounds = np.empty(2 * n, dtype=np.int64)
        bounds[0::2] = props_pos
        bounds[1::2] = np.where(ok, crc_pos, props_pos)
        ok &= np.maximum.reduceat(u8, bounds)[0::2] < 0x80  # ASCII properties are UTF-8
        ok &= (crc32_each(data, body_pos, topic_len_pos) & BODY_CRC_MASK) == fields[:, _BODY_CRC_WORD]
        topics: list[str | None] = [topic] * len(starts)
        queue_ids = fields[:, _QUEUE_ID_WORD].astype(np.int64)
        ok &= queue_ids < write_queues  # the first record's topic is every accepted record's
        reasons: dict[int, RecordRefusedError] = {}
        if not ok.all():
            self._recheck(view, starts, sizes, np.flatnonzero(~ok).tolist(), ok, topics, queue_ids,
                          reasons)
        return CheckedRequest(start_at, size_of, ok, topics, queue_ids, reasons)

    def _recheck(self, view: memoryview, starts: list[int], sizes: list[int], rows: list[int],
                 ok: np.ndarray, topics: list[str | None], queue_ids: np.ndarray,
                 reasons: dict[int, RecordRefusedError]) -> None:
        """`check` the records the batch path did not accept: each is accepted after all or
        refused with its reason."""
        for i in rows:
            try:
                topics[i], queue_ids[i] = self._check_at(view, starts[i], sizes[i])
                ok[i] = True
            except RecordRefusedError as exc:
                topics[i], queue_ids[i] = None, -1
                reasons[i] = exc

    def _topic(self, raw: bytes) -> str:
        """A topic a producer may write: valid, and no system topic but SCHEDULE_TOPIC_XXXX and
        the timer topic, which engine.message writes delayed and timed messages to (the store's
        own records come through Appender.append_store_made, unchecked)."""
        topic = self._topics.get(raw)
        if topic is None:
            try:
                topic = validate_topic(raw.decode("utf-8"))
            except UnicodeDecodeError:
                raise refused(Refusal.TOPIC, detail="is not valid UTF-8") from None
            except BadInputError as exc:
                raise refused(Refusal.TOPIC, detail=exc.reason) from None
            if is_system_topic(topic) and not is_written_by_delayed_sends(topic):
                raise refused(Refusal.TOPIC, detail=f"{topic!r} is a system topic, written by the store only")
            if len(self._topics) >= _MAX_TOPIC_CACHE:
                self._topics.clear()
            self._topics[raw] = topic
        return topic


def _frame(data: bytearray | memoryview, count: int) -> tuple[list[int], list[int]]:
    """Start and size of each of the `count` records by the TOTALSIZE chain (spans.walk_chain),
    which must cover `data` exactly (BadInputError otherwise)."""
    return _frame_span(data, 0, len(data), count)


def _frame_span(buf, start: int, end: int, count: int) -> tuple[list[int], list[int]]:
    """_frame of the records laid in buf[start:end] (positions in `buf`): the one framing rule
    of check_request and check_few."""
    starts, sizes = walk_chain(buf, start, end, count)
    pos = starts[-1] + sizes[-1] if starts else start
    if len(starts) != count or not starts or pos != end:
        raise BadInputError("request", f"{count} records announced in {end - start} bytes, "
                            f"framing finds {len(starts)} ending at {pos - start}")
    return starts, sizes


def _topic_piece(view: memoryview, start: int) -> bytes:
    """TOPICLENGTH and topic bytes of the (checked) record at `start`."""
    topic_len_pos = start + BODY_OFFSET + _I32.unpack_from(view, start + BODY_LENGTH_OFFSET)[0]
    return bytes(view[topic_len_pos:topic_len_pos + TOPIC_LENGTH_SIZE_V1 + view[topic_len_pos]])


def _header_word_rules(max_body_bytes: int, queue_count: int, max_record_bytes: int
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(AND, SUB, LIMIT) per checked header word: the producer's rules of `check` (TOTALSIZE
    room for the slot and a fit in a segment, magic v1, _check_producer_fields), as unsigned
    comparisons (a negative queue id or BODYLENGTH is a huge unsigned number, and
    word - MAGIC <= 0 only where word == MAGIC)."""
    and_, sub, limit = (np.zeros(len(_CHECKED_WORDS), dtype=np.uint32) for _ in range(3))
    and_[:] = _ALL_BITS
    and_[_SYS_FLAG_WORD] = _SIGN_BIT | HOSTS_V6 | HALF_OR_ROLLBACK_BIT
    sub[_TOTAL_WORD] = _MIN_RECORD_BYTES
    limit[_TOTAL_WORD] = max(max_record_bytes - _MIN_RECORD_BYTES, 0)
    sub[_MAGIC_WORD] = MAGIC_V1
    limit[_QUEUE_ID_WORD] = queue_count - 1
    limit[_BODY_CRC_WORD] = _ALL_BITS  # compared with the body's CRC
    limit[_BODY_LENGTH_WORD] = min(max_body_bytes, _SIGN_BIT - 1)
    return and_, sub, limit
