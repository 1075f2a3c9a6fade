"""Record properties: RocketMQ's `key 0x01 value 0x02` string, UTF-8.

    +-----+------+-------+------+-----+------+-------+------+
    | key | 0x01 | value | 0x02 | key | 0x01 | value | 0x02 | ...
    +-----+------+-------+------+-----+------+-------+------+

Decoding follows RocketMQ's lenient MessageDecoder.string2messageProperties: split on 0x02,
skip segments shorter than 3 characters, keep a pair only when the first 0x01 lies strictly
inside the segment (non-empty key and value); a later duplicate key wins.

Encoding is strict, so that what is written reads back unchanged: keys and values must be
non-empty str without 0x01/0x02 (an empty value would be dropped by every RocketMQ reader).

Text is decoded strictly: `decode_properties` lets UnicodeDecodeError (a ValueError)
propagate, and the record decoder turns it into CorruptRecordError carrying the position.
"""

from __future__ import annotations

from collections.abc import Mapping

from engine.errors import BadInputError

SEP_KV = b"\x01"
SEP_PROP = b"\x02"
_SEP_KV_STR = "\x01"
_SEP_PROP_STR = "\x02"

PROP_TAGS = "TAGS"
PROP_KEYS = "KEYS"
PROP_UNIQ_KEY = "UNIQ_KEY"
PROP_WAIT = "WAIT"
PROP_CRC32C = "__CRC32C"

KEYS_SEPARATOR = " "


def _check_text(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise BadInputError("properties", f"{field} must be a str, not {type(value).__name__}")
    if not value:
        raise BadInputError("properties", f"{field} must not be empty")
    if _SEP_KV_STR in value or _SEP_PROP_STR in value:
        raise BadInputError("properties", f"{field} {value!r} holds a 0x01 or 0x02 separator byte")
    return value


def encode_properties(props: Mapping[str, str]) -> bytes:
    """Encode a mapping as `key 0x01 value 0x02 ...` UTF-8; raise BadInputError on unusable text."""
    parts: list[str] = []
    for key, value in props.items():
        _check_text("key", key)
        _check_text(f"value of {key!r}", value)
        parts.append(f"{key}{_SEP_KV_STR}{value}{_SEP_PROP_STR}")
    try:
        return "".join(parts).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadInputError("properties", f"not encodable as UTF-8: {exc.reason}") from None


def decode_properties(raw: bytes | bytearray | memoryview) -> dict[str, str]:
    """Parse properties the way RocketMQ does; strict UTF-8 (raises UnicodeDecodeError)."""
    text = str(raw, "utf-8")
    props: dict[str, str] = {}
    for segment in text.split(_SEP_PROP_STR):
        sep_at = segment.find(_SEP_KV_STR)
        if 0 < sep_at < len(segment) - 1:
            props[segment[:sep_at]] = segment[sep_at + 1 :]
    return props


def split_keys(keys: str | None) -> tuple[str, ...]:
    """The tokens of a KEYS value, split on single spaces, empty tokens dropped (RocketMQ)."""
    if not keys:
        return ()
    return tuple(token for token in keys.split(KEYS_SEPARATOR) if token)
