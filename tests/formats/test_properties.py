"""The `key 0x01 value 0x02` properties codec, strict on encode, RocketMQ-lenient on decode."""

from __future__ import annotations

import pytest

from engine.errors import BadInputError
from engine.formats.properties import (
    PROP_CRC32C,
    PROP_KEYS,
    PROP_TAGS,
    PROP_UNIQ_KEY,
    PROP_WAIT,
    SEP_KV,
    SEP_PROP,
    decode_properties,
    encode_properties,
    split_keys,
)


def test_property_names_are_rocketmq_names():
    assert (PROP_TAGS, PROP_KEYS, PROP_UNIQ_KEY, PROP_WAIT, PROP_CRC32C) == (
        "TAGS", "KEYS", "UNIQ_KEY", "WAIT", "__CRC32C")
    assert (SEP_KV, SEP_PROP) == (b"\x01", b"\x02")


def test_encode_properties_byte_layout():
    raw = encode_properties({"TAGS": "TAG1", "KEYS": "1632821159368"})
    assert raw == b"TAGS\x01TAG1\x02KEYS\x011632821159368\x02"
    assert len(raw) == 29  # reference §1.2 worked example


def test_encode_properties_empty_mapping_is_empty_bytes():
    assert encode_properties({}) == b""


def test_encode_properties_utf8():
    assert encode_properties({"k": "é"}) == b"k\x01\xc3\xa9\x02"


@pytest.mark.parametrize("props", [
    {"": "v"},
    {"k": ""},
    {"k\x01": "v"},
    {"k": "v\x02"},
    {"k": "a\x01b"},
    {1: "v"},
    {"k": 2},
    {"k": "\ud800"},  # lone surrogate: not encodable as UTF-8
])
def test_encode_properties_rejects_unusable_text(props):
    with pytest.raises(BadInputError) as info:
        encode_properties(props)
    assert info.value.field == "properties"


@pytest.mark.parametrize(("raw", "expected"), [
    (b"", {}),
    (b"TAGS\x01TAG1\x02", {"TAGS": "TAG1"}),
    (b"TAGS\x01TAG1", {"TAGS": "TAG1"}),  # no trailing separator
    (b"a\x01b\x02", {"a": "b"}),  # exactly 3 characters
    (b"\x01ab\x02", {}),  # empty key
    (b"ab\x01\x02", {}),  # empty value
    (b"ab\x02", {}),  # no key/value separator
    (b"a\x02\x02k\x01v\x02", {"k": "v"}),  # short and empty segments skipped
    (b"k\x01v\x01w\x02", {"k": "v\x01w"}),  # the first 0x01 splits
    (b"k\x01one\x02k\x01two\x02", {"k": "two"}),  # a later duplicate wins
    (b"0\x01imagoodperson0\x02", {"0": "imagoodperson0"}),  # seen in RocketMQ's test store
])
def test_decode_properties_follows_rocketmq_parser(raw, expected):
    assert decode_properties(raw) == expected


def test_decode_properties_accepts_memoryview():
    assert decode_properties(memoryview(b"xxk\x01v\x02")[2:]) == {"k": "v"}


def test_decode_properties_non_utf8_raises_unicode_error():
    with pytest.raises(UnicodeDecodeError):
        decode_properties(b"k\x01\xff\xfe\x02")


def test_properties_round_trip_keeps_order():
    props = {"TAGS": "TAG1", "KEYS": "a b", "UNIQ_KEY": "0" * 32, "x": "ü"}
    decoded = decode_properties(encode_properties(props))
    assert decoded == props
    assert list(decoded) == list(props)


@pytest.mark.parametrize(("keys", "expected"), [
    (None, ()),
    ("", ()),
    ("k1", ("k1",)),
    ("k1 k2", ("k1", "k2")),
    ("k1  k2 ", ("k1", "k2")),  # empty tokens dropped, split on single spaces
])
def test_split_keys(keys, expected):
    assert split_keys(keys) == expected
