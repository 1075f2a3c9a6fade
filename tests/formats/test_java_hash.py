"""Java String.hashCode, the index key hash (abs rule) and tagsCode."""

from __future__ import annotations

import pytest

from engine.formats.java_hash import (
    INT32_MIN,
    index_hash_of_unsigned,
    index_key_hash,
    java_string_hash,
    tags_code,
)


def slow_java_hash(s: str) -> int:
    """Reference: the Java loop over UTF-16 code units, one unit at a time."""
    raw = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(raw), 2):
        h = (31 * h + int.from_bytes(raw[i : i + 2], "big")) & 0xFFFFFFFF
    return h - 2**32 if h >= 2**31 else h


@pytest.mark.parametrize(("text", "expected"), [
    ("hello", 99162322),
    ("", 0),
    ("a", 97),
    ("TAG1", 2567159),
    ("polygenelubricants", -(2**31)),
])
def test_java_string_hash_known_values(text, expected):
    assert java_string_hash(text) == expected


@pytest.mark.parametrize("text", [
    "TAG1",
    "abc#1632821159368",
    "héllo wörld",
    "消息队列",
    "😀key",  # astral: a surrogate pair, two UTF-16 units
    "a😀b𝄞c",
    "\ud800",  # a lone surrogate, which Java strings may hold
    "x" * 5000,  # longer than any cached power table so far
])
def test_java_string_hash_matches_utf16_reference(text):
    assert java_string_hash(text) == slow_java_hash(text)


def test_java_string_hash_astral_counts_two_units():
    # U+1F600 is D83D DE00 in UTF-16: the hash is 31*0xD83D + 0xDE00.
    assert java_string_hash("\U0001F600") == 31 * 0xD83D + 0xDE00


def test_java_string_hash_wraps_to_signed_int32():
    h = java_string_hash("the quick brown fox jumps over the lazy dog")
    assert h == slow_java_hash("the quick brown fox jumps over the lazy dog")
    assert -(2**31) <= h < 2**31


def test_index_key_hash_min_value_maps_to_zero():
    assert java_string_hash("polygenelubricants") == INT32_MIN
    assert index_key_hash("polygenelubricants") == 0


def test_index_key_hash_is_abs_of_negative_hash():
    key = "topic#key-0"
    assert java_string_hash(key) == slow_java_hash(key) == -1818553362
    assert index_key_hash(key) == 1818553362


@pytest.mark.parametrize(("unsigned", "expected"), [
    (0, 0), (1, 1), (2**31 - 1, 2**31 - 1), (2**31, 0), (2**31 + 1, 2**31 - 1), (2**32 - 1, 1),
])
def test_index_hash_of_unsigned_is_abs_of_the_signed_value(unsigned, expected):
    assert index_hash_of_unsigned(unsigned) == expected


def test_index_key_hash_keeps_positive_hash():
    assert index_key_hash("hello") == 99162322


def test_tags_code_without_tags_is_zero():
    assert tags_code(None) == 0
    assert tags_code("") == 0


def test_tags_code_is_java_hash_of_tags():
    assert tags_code("TAG1") == 2567159
    assert tags_code("polygenelubricants") == -(2**31)  # a long in the entry keeps the sign
