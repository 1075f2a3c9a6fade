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

import numpy as np

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
    h = java_string_hash(key)
    return 0 if h == INT32_MIN else abs(h)


@lru_cache(maxsize=4096)
def tags_code(tags: str | None) -> int:
    """The consume-queue tagsCode of a tags string: its Java hash, 0 when there are no tags."""
    if not tags:
        return 0
    return java_string_hash(tags)


def index_key_hashes(prefixes: list[str], prefix_index: np.ndarray, keys: list[bytes]) -> np.ndarray:
    """index_key_hash(prefixes[prefix_index[i]] + keys[i]) for UTF-8 keys (int64), whole-array
    when all are ASCII.

    For ASCII text the UTF-16 units are the bytes, so the hash of a key is
    sum(byte_j * 31**(len - 1 - j)) mod 2**32 (one product and one reduceat over all keys) and
    hash(prefix + key) = hash(prefix) * 31**len(key) + hash(key) mod 2**32.
    """
    count = len(keys)
    if not count:
        return np.zeros(0, dtype=np.int64)
    blob = b"".join(keys)
    lengths = np.fromiter(map(len, keys), dtype=np.int64, count=count)
    if not blob.isascii() or lengths.min() == 0 or not all(map(str.isascii, prefixes)):
        return np.array([index_key_hash(prefixes[p] + key.decode("utf-8"))
                         for p, key in zip(prefix_index.tolist(), keys, strict=True)], dtype=np.int64)
    _powers_descending(int(lengths.max()) + 1)  # grow the table
    powers = np.array(_powers_of_31[: int(lengths.max()) + 1], dtype=np.uint64)
    starts = np.zeros(count, dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    exponent = np.repeat(starts + lengths - 1, lengths) - np.arange(len(blob))
    units = np.frombuffer(blob, dtype=np.uint8).astype(np.uint64)
    key_h = np.add.reduceat(units * powers[exponent], starts) & _MASK32
    prefix_h = np.array([java_string_hash(p) & _MASK32 for p in prefixes], dtype=np.uint64)
    h = ((prefix_h[prefix_index] * powers[lengths] + key_h) & _MASK32).astype(np.int64)
    h = np.where(h >= 0x80000000, h - 0x100000000, h)
    return np.where(h == INT32_MIN, 0, np.abs(h))
