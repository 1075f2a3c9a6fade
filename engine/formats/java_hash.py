"""Java `String.hashCode()` and the two RocketMQ values built on it: tagsCode and the index key hash.

Java hashes UTF-16 code units: h = 31*h + unit, wrapping at 32 bits, read as a signed int.
Characters outside the BMP count as two units (a surrogate pair), as in Java.

    java_string_hash("hello") == 99162322
    index_key_hash(k)   == abs(java_string_hash(k)), or 0 when that is Integer.MIN_VALUE
    tags_code(tags)     == java_string_hash(tags), or 0 without tags (stored as a long)

Speed: the hash is evaluated as sum(unit_i * 31**(n-1-i)) mod 2**32 with a cached table of
powers of 31, so the per-unit work runs in C (map/sum) rather than in a Python loop.
"""

from __future__ import annotations

import sys
from array import array
from functools import lru_cache
from operator import mul

INT32_MIN = -(2**31)
_MASK32 = 0xFFFFFFFF
_UTF16_NATIVE = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"

_powers_of_31: list[int] = [1]  # _powers_of_31[k] == 31**k mod 2**32; grown on demand


def _powers_descending(unit_count: int) -> list[int]:
    """31**(n-1), ..., 31**0 (mod 2**32) for n = unit_count >= 1."""
    powers = _powers_of_31
    if unit_count > len(powers):
        last = powers[-1]
        for _ in range(max(unit_count, 2 * len(powers)) - len(powers)):
            last = (last * 31) & _MASK32
            powers.append(last)
    return powers[unit_count - 1 :: -1]


def java_string_hash(s: str) -> int:
    """Java String.hashCode(s) as a signed 32-bit int (UTF-16 code units, 32-bit wrap)."""
    if s.isascii():
        units: bytes | array = s.encode("ascii")
    else:
        units = array("H", s.encode(_UTF16_NATIVE, "surrogatepass"))
    unit_count = len(units)
    if unit_count == 0:
        return 0
    h = sum(map(mul, units, _powers_descending(unit_count))) & _MASK32
    return h - 0x100000000 if h & 0x80000000 else h


def index_key_hash(key: str) -> int:
    """RocketMQ IndexFile.indexKeyHashMethod: abs(hashCode), with Integer.MIN_VALUE mapped to 0."""
    return index_hash_of_unsigned(java_string_hash(key) & _MASK32)


def index_hash_of_unsigned(h: int) -> int:
    """index_key_hash's rule on a Java hash read as unsigned 32 bits (0 <= h < 2**32): abs of
    its signed value, Integer.MIN_VALUE (0x80000000) mapped to 0."""
    return h if h < 0x80000000 else (0 if h == 0x80000000 else 0x100000000 - h)


@lru_cache(maxsize=4096)
def tags_code(tags: str | None) -> int:
    """The consume-queue tagsCode of a tags string: its Java hash, 0 when there are no tags."""
    if not tags:
        return 0
    return java_string_hash(tags)
