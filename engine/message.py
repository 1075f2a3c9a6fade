"""A message as callers give it, and its validation into record properties.

`message_parts` is the one validator of the in-process store and the co-located Producer, so
both refuse the same bad input with the same error before anything reaches the log; the error
carries the put status (PROPERTIES_SIZE_EXCEEDED or MESSAGE_ILLEGAL). The column checks
(`body_column`, `key_column`, `tags_text`) apply the same rules to a batch given as columns
(Producer.send_columns), with one C-level pass per column instead of a call per message;
its UNIQ_KEYs are one block (engine.formats.uniq_key.new_uniq_key_block).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.delivery.levels import DEFAULT_DELAY_LEVELS_MS, validate_delay_level
from engine.delivery.timer import timer_slot, validate_deliver_at
from engine.errors import BadInputError
from engine.files.naming import validate_topic
from engine.formats.crc32c_property import CRC32C_PROP_SIZE
from engine.formats.properties import (
    PROP_CRC32C,
    PROP_KEYS,
    PROP_TAGS,
    PROP_UNIQ_KEY,
    PROP_WAIT,
    encode_properties,
)
from engine.formats.record.layout import MAX_PROPERTIES_BYTES, RECORD_FIXED_SIZE, check_properties_bytes
from engine.formats.uniq_key import new_uniq_key
from engine.topics.system import (
    PROP_DELAY,
    PROP_REAL_QID,
    PROP_REAL_TOPIC,
    PROP_TIMER_DELIVER_MS,
    SCHEDULE_TOPIC,
    STORE_SET_PROPERTIES,
    TIMER_TOPIC,
    refuse_system_topic,
)

# Set by the store, or by an argument: a producer giving them as properties is refused
# (DELAY is the exception: it is delay_level, as RocketMQ's clients send it).
RESERVED_PROPERTIES = frozenset({PROP_CRC32C, PROP_TAGS, PROP_KEYS, PROP_UNIQ_KEY}) | STORE_SET_PROPERTIES


@dataclass(frozen=True, slots=True)
class Message:
    """One message to put: body bytes plus routing and lookup metadata."""

    topic: str
    body: bytes
    tags: str | None = None
    keys: tuple[str, ...] = ()
    queue_id: int | None = None
    properties: Mapping[str, str] = field(default_factory=dict)
    wait: bool = True
    delay_level: int | None = None  # delivered after the level's delay (engine.delivery.levels)
    deliver_at_ms: int | None = None  # delivered at this time, ms since the epoch (engine.delivery.timer)


def _require_text(field_name: str, value: object) -> str:
    if not isinstance(value, str):
        raise BadInputError(field_name, f"must be a str, not {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInputError(field_name, "is not valid UTF-8 text") from None
    if "\x01" in value or "\x02" in value:
        raise BadInputError(field_name, "must not contain the bytes 0x01 or 0x02")
    return value


def normalize_keys(keys: str | Iterable[str]) -> tuple[str, ...]:
    """Keys as a tuple; a str is one key. Keys may not hold spaces (KEYS is space-separated)."""
    try:
        items = (keys,) if isinstance(keys, str) else tuple(keys)
    except TypeError:
        raise BadInputError("keys", f"must be a str or an iterable of str, not "
                            f"{type(keys).__name__}") from None
    for key in items:
        if key_bytes(key) is None:
            _require_text("keys", key)
            raise BadInputError("keys", f"{key!r}: a key must be non-empty and hold no spaces")
    return items


def key_bytes(key: object) -> bytes | None:
    """One key's UTF-8, or None when it breaks a key's rules: a non-empty str holding no space
    (KEYS is space-separated), no 0x01 or 0x02 (the property separators), valid UTF-8."""
    if not isinstance(key, str) or not key or " " in key or "\x01" in key or "\x02" in key:
        return None
    try:
        return str.encode(key, "utf-8")  # a subclass's own encode is not the key's text
    except UnicodeEncodeError:
        return None


def validate_queue_id(queue_id: object, queue_count: int) -> int:
    if not isinstance(queue_id, int) or isinstance(queue_id, bool):
        raise BadInputError("queue_id", f"must be an int, not {type(queue_id).__name__}")
    if not 0 <= queue_id < queue_count:
        raise BadInputError("queue_id", f"{queue_id} is outside 0..{queue_count - 1}")
    return queue_id


def validate_body(body: object) -> bytes:
    if not isinstance(body, bytes | bytearray | memoryview):
        raise BadInputError("body", f"must be bytes, not {type(body).__name__}")
    return bytes(body)


def build_properties(message: Message, *, uniq_key: str | None = None) -> dict[str, str]:
    """Validated record properties: user properties, then TAGS, KEYS, UNIQ_KEY (and WAIT)."""
    validate_topic(message.topic)
    props: dict[str, str] = {}
    for name, value in (message.properties or {}).items():
        _require_text("property name", name)
        _require_text(f"property {name!r}", value)
        if name in RESERVED_PROPERTIES:
            raise BadInputError("properties", f"{name!r} is set by the store; use the argument"
                                if name not in STORE_SET_PROPERTIES else f"{name!r} is set by the store only")
        props[name] = value
    if message.tags is not None:
        tags = _require_text("tags", message.tags)
        if not tags:
            raise BadInputError("tags", "must not be empty (pass None for no tags)")
        props[PROP_TAGS] = tags
    keys = normalize_keys(message.keys)
    if keys:
        props[PROP_KEYS] = " ".join(keys)
    props[PROP_UNIQ_KEY] = new_uniq_key() if uniq_key is None else uniq_key
    if not message.wait:
        props[PROP_WAIT] = "false"
    return props


def encode_message_properties(message: Message, uniq_key: str) -> bytes:
    """encode_properties(build_properties(message, uniq_key=...)), cheaply for the common message
    (no user properties, str tags and keys of plain text); anything else takes that exact path,
    which also raises the right BadInputError."""
    tags, keys = message.tags, message.keys
    if message.properties or not message.wait or type(keys) is not tuple \
            or (tags is not None and (type(tags) is not str or not tags)) \
            or not all(type(key) is str and key for key in keys):
        return encode_properties(build_properties(message, uniq_key=uniq_key))
    joined = " ".join(keys)
    text = (f"{PROP_TAGS}\x01{tags}\x02" if tags is not None else "") \
        + (f"{PROP_KEYS}\x01{joined}\x02" if keys else "") + f"{PROP_UNIQ_KEY}\x01{uniq_key}\x02"
    plain = joined.count(" ") == len(keys) - 1 if keys else True
    if not plain or "\x01" in joined or "\x02" in joined or (tags is not None and (
            "\x01" in tags or "\x02" in tags)) or not text.isascii():
        return encode_properties(build_properties(message, uniq_key=uniq_key))
    return text.encode("ascii")


# ---------------------------------------------------------------- the one message validator


@dataclass(frozen=True, slots=True)
class PutLimits:
    """What bounds a message where it is put: queue ids, body bytes, and the room a whole
    record must fit (`record_room` names it in the error: a commitlog segment, a mailbox slot)."""

    queue_count: int
    max_body_bytes: int
    max_record_bytes: int
    record_room: str
    delay_level_count: int = len(DEFAULT_DELAY_LEVELS_MS)  # levels 1..count (message_delay_level)
    timer_max_delay_s: int = 3 * 24 * 3600  # how far ahead deliver_at_ms may be


_TOPIC_BYTES: dict[str, bytes] = {}  # validated topics, UTF-8
_MAX_TOPIC_CACHE = 4096


def topic_bytes(topic: object) -> bytes:
    """The UTF-8 of a valid topic a producer may write (BadInputError otherwise: a system topic
    is the store's, engine.topics.system); valid topics are cached."""
    raw = _TOPIC_BYTES.get(topic) if type(topic) is str else None
    if raw is None:
        refuse_system_topic(validate_topic(topic))
        raw = topic.encode("utf-8")
        if len(_TOPIC_BYTES) < _MAX_TOPIC_CACHE:
            _TOPIC_BYTES[topic] = raw
    return raw


def message_parts(message: Message, uniq_key: str,
                  limits: PutLimits) -> tuple[bytes, bytes, bytes, int | None]:
    """(topic UTF-8, body, properties without the CRC32C tail, queue id) of a valid message,
    the queue id None when the message leaves it to the caller. The rules of the store and of
    the Producer alike; a BadInputError carries the put status the message gets."""
    if not isinstance(message, Message):
        raise BadInputError("message", f"not a Message: {type(message).__name__}")
    queue_id = message.queue_id
    if queue_id is not None:
        validate_queue_id(queue_id, limits.queue_count)
    topic_raw = topic_bytes(message.topic)
    body = validate_body(message.body)
    if len(body) > limits.max_body_bytes:
        raise BadInputError("body", f"{len(body)} bytes exceeds the maximum of {limits.max_body_bytes}")
    timed = message.deliver_at_ms is not None and _is_ahead(message, limits)
    if message.delay_level is not None or PROP_DELAY in (message.properties or {}):
        if message.deliver_at_ms is not None:
            raise BadInputError("deliver_at_ms", "a message has a delay level or a delivery time, not both")
        topic_raw, props_raw, queue_id = _scheduled_parts(message, uniq_key, limits)
    elif timed:
        topic_raw, props_raw, queue_id = _timed_parts(message, uniq_key, limits)
    else:
        props_raw = encode_message_properties(message, uniq_key)
    if len(props_raw) + CRC32C_PROP_SIZE > MAX_PROPERTIES_BYTES:
        check_properties_bytes(len(props_raw) + CRC32C_PROP_SIZE)
    size = RECORD_FIXED_SIZE + len(body) + len(topic_raw) + len(props_raw) + CRC32C_PROP_SIZE
    if size > limits.max_record_bytes:
        raise BadInputError("body", f"the record of {size} bytes does not fit {limits.record_room}")
    return topic_raw, body, props_raw, queue_id


def _scheduled_parts(message: Message, uniq_key: str, limits: PutLimits) -> tuple[bytes, bytes, int]:
    """A delayed message as RocketMQ stores it: topic SCHEDULE_TOPIC_XXXX, queue level - 1, the
    real topic and queue in REAL_TOPIC and REAL_QID, the level in DELAY."""
    user_props = dict(message.properties or {})
    given = user_props.pop(PROP_DELAY, None)
    if message.delay_level is not None and given is not None and str(message.delay_level) != given:
        raise BadInputError("delay_level", f"{message.delay_level} but the DELAY property says {given!r}")
    level = validate_delay_level(message.delay_level if given is None else given, limits.delay_level_count)
    props = _real_route(message, uniq_key, limits, user_props)
    props[PROP_DELAY] = str(level)
    return SCHEDULE_TOPIC.encode("ascii"), encode_properties(props), level - 1


def _is_ahead(message: Message, limits: PutLimits) -> bool:
    """Whether a message's deliver_at_ms lies ahead (BadInputError past timer_max_delay_s); one
    already past is delivered at once, as RocketMQ does."""
    now_ms = time.time_ns() // 1_000_000
    return validate_deliver_at(message.deliver_at_ms, now_ms, limits.timer_max_delay_s) > now_ms


def _timed_parts(message: Message, uniq_key: str, limits: PutLimits) -> tuple[bytes, bytes, int]:
    """A timed message: the timer topic, the queue of its minute (engine.delivery.timer), the real
    topic and queue in REAL_TOPIC and REAL_QID, the time in TIMER_DELIVER_MS."""
    props = _real_route(message, uniq_key, limits)
    props[PROP_TIMER_DELIVER_MS] = str(message.deliver_at_ms)
    return TIMER_TOPIC.encode("ascii"), encode_properties(props), timer_slot(message.deliver_at_ms)


def _real_route(message: Message, uniq_key: str, limits: PutLimits, user_props: dict | None = None
                ) -> dict[str, str]:
    """The message's properties plus REAL_TOPIC and REAL_QID (a queue left open is picked from
    the UNIQ_KEY's hash, so a producer's delayed messages spread as round robin would)."""
    real_qid = message.queue_id if message.queue_id is not None else \
        zlib.crc32(uniq_key.encode("utf-8")) % limits.queue_count
    props = build_properties(Message(message.topic, b"", message.tags, message.keys, None,
                                     message.properties if user_props is None else user_props,
                                     message.wait), uniq_key=uniq_key)
    props.update({PROP_REAL_TOPIC: message.topic, PROP_REAL_QID: str(real_qid)})
    return props


# ---------------------------------------------------------------- columns


def body_column(bodies: Sequence[object]) -> list:
    """The bodies of a batch as a list of bytes-like objects (bytes kept as they are; bytearray
    and memoryview copied to bytes); BadInputError naming the first one that is not bytes."""
    try:
        items = list(bodies)
    except TypeError:
        raise BadInputError("bodies", f"must be a sequence of bytes, not {type(bodies).__name__}") from None
    if set(map(type, items)) <= {bytes}:
        return items
    for i, body in enumerate(items):
        if not isinstance(body, bytes | bytearray | memoryview):
            raise BadInputError("bodies", f"body {i} must be bytes, not {type(body).__name__}")
    return [body if type(body) is bytes else bytes(body) for body in items]


def key_column(keys: Sequence[object], count: int) -> list[bytes]:
    """One key per message as UTF-8 (KEYS of one key each): `normalize_keys`'s rules checked on
    the joined text at once; BadInputError naming the first bad key."""
    if isinstance(keys, str | bytes):
        raise BadInputError("keys", "must be a sequence of one str per message, not a single "
                            f"{type(keys).__name__}")
    try:
        items = list(keys)
    except TypeError:
        raise BadInputError("keys", f"must be a sequence of str, not {type(keys).__name__}") from None
    if len(items) != count:
        raise BadInputError("keys", f"{len(items)} keys for {count} messages")
    if not items:
        return []
    try:
        joined = _KEY_JOIN.join(items)  # TypeError for a non-str item
        if all(items) and joined.count(_KEY_JOIN) == count - 1 and " " not in joined \
                and "\x02" not in joined:
            return joined.encode("utf-8").split(_KEY_JOIN_BYTES)
    except (TypeError, UnicodeEncodeError):
        pass
    for i, key in enumerate(items):  # name the first offender
        try:
            normalize_keys((key,))
        except BadInputError as exc:
            raise BadInputError("keys", f"key {i}: {exc.reason}") from None
    raise AssertionError("key_column: a bad key was not found")  # pragma: no cover


def queue_id_column(queue_ids: object, count: int, queue_count: int) -> int | list[int]:
    """One queue id for all messages (an int) or one per message (a list), each checked as
    `validate_queue_id` checks it."""
    if isinstance(queue_ids, int) and not isinstance(queue_ids, bool):
        return validate_queue_id(queue_ids, queue_count)
    try:
        items = list(queue_ids)
    except TypeError:
        raise BadInputError("queue_ids", "must be an int or a sequence of int, not "
                            f"{type(queue_ids).__name__}") from None
    if len(items) != count:
        raise BadInputError("queue_ids", f"{len(items)} queue ids for {count} messages")
    if not set(map(type, items)) <= {int}:
        items = [validate_queue_id(q if type(q) is int else _plain_int(q), queue_count) for q in items]
    if items and not (min(items) >= 0 and max(items) < queue_count):
        for queue_id in items:
            validate_queue_id(queue_id, queue_count)
    return items


def _plain_int(value: object) -> object:
    """A numpy integer as int; anything else unchanged (validate_queue_id then refuses it)."""
    return int(value) if isinstance(value, np.integer) else value


def tags_text(tags: object) -> bytes | None:
    """TAGS as UTF-8 by build_properties' rules (None: no tags)."""
    if tags is None:
        return None
    _require_text("tags", tags)
    if not tags:
        raise BadInputError("tags", "must not be empty (pass None for no tags)")
    return tags.encode("utf-8")


_KEY_JOIN = "\x01"  # a key may not hold it, so the joined keys split back exactly
_KEY_JOIN_BYTES = _KEY_JOIN.encode("ascii")
