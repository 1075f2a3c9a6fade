"""Index keys many at a time: the Java hash and the CRC32C shard of `topic#key`, with numpy.

Keys are given as spans of one byte string (`blob[starts[i]:ends[i]]`, UTF-8, without the
`topic#` prefix) and the prefix of each as an index into a list of prefixes, so no per-key
Python object is made. The scalar references are `java_hash.index_key_hash` and
`index_file.shard_of`; the tests compare both.

For ASCII keys the UTF-16 units are the bytes, so with d = distance of a byte from the key's end
    java_hash(key)            = sum(byte * 31**d) mod 2**32
    java_hash(prefix + key)   = java_hash(prefix) * 31**len(key) + java_hash(key)  mod 2**32
CRC32C is affine in the message: for a fixed start value (the CRC of the prefix) and length L,
    crc32c(key, prefix_crc)   = crc32c(zeros(L), prefix_crc) XOR xor_j TABLE[d_j][byte_j]
where TABLE[d][b] is what byte b followed by d zero bytes adds (zero start, no final xor).
"""

from __future__ import annotations

import crc32c
import numpy as np

from engine.formats.java_hash import INT32_MIN, index_hash_of_unsigned, index_key_hash, java_string_hash
from engine.tuning import PADDED_KEY_MAX_BYTES, TABLE_KEY_MAX_BYTES

_MASK32 = 0xFFFFFFFF
_CRC32C_POLY = 0x82F63B78  # reflected Castagnoli polynomial
_powers_of_31 = np.ones(1, dtype=np.uint64)


def _byte_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(_CRC32C_POLY), table >> 1)
    return table


_BYTE_TABLE = _byte_table()
_crc_tables = _BYTE_TABLE[None, :]  # row d: what a byte adds when d zero bytes follow it


def _crc_table(max_len: int) -> np.ndarray:
    """(>= max_len, 256) uint32: row d is what a byte contributes when d zero bytes follow it."""
    global _crc_tables
    if len(_crc_tables) < max_len:
        rows = list(_crc_tables)
        while len(rows) < max(max_len, 2 * len(_crc_tables)):
            rows.append(_BYTE_TABLE[rows[-1] & 0xFF] ^ (rows[-1] >> 8))
        _crc_tables = np.stack(rows)
    return _crc_tables


def _powers(max_len: int) -> np.ndarray:
    """31**k mod 2**32 for k in 0..max_len."""
    global _powers_of_31
    if len(_powers_of_31) <= max_len:
        powers = [1]
        for _ in range(max_len):
            powers.append(powers[-1] * 31 & _MASK32)
        _powers_of_31 = np.array(powers, dtype=np.uint64)
    return _powers_of_31


class _KeyBytes:
    """The bytes of every key, each with its key number and its distance from the key's end."""

    def __init__(self, blob: bytes, starts: np.ndarray, ends: np.ndarray):
        self.lengths = ends - starts
        self.first = np.zeros(len(starts), dtype=np.int64)
        np.cumsum(self.lengths[:-1], out=self.first[1:])
        # byte k of the run of all keys is key i's byte k - first[i], at distance
        # first[i] + lengths[i] - 1 - k from its end
        ramp = np.arange(int(self.lengths.sum()))
        self.units = np.frombuffer(blob, dtype=np.uint8)[np.repeat(starts - self.first, self.lengths) + ramp]
        self.distance = np.repeat(self.first + self.lengths - 1, self.lengths) - ramp

    def is_plain(self) -> bool:
        """ASCII, no empty key: the whole-array formulas hold."""
        return bool(len(self.lengths)) and self.lengths.min() > 0 and int(self.units.max()) < 0x80


def index_key_values(prefixes: list[str], prefix_index: np.ndarray, blob: bytes, starts: np.ndarray,
                     ends: np.ndarray, shard_count: int) -> tuple[np.ndarray, np.ndarray]:
    """(index_key_hashes, index_key_shards) of the same keys, sharing the per-byte arrays."""
    keys = _KeyBytes(blob, starts, ends) if len(starts) else None
    return (index_key_hashes(prefixes, prefix_index, blob, starts, ends, keys),
            index_key_shards([p.encode() for p in prefixes], prefix_index, blob, starts, ends,
                             shard_count, keys))


def index_key_hashes(prefixes: list[str], prefix_index: np.ndarray, blob: bytes, starts: np.ndarray,
                     ends: np.ndarray, keys: _KeyBytes | None = None) -> np.ndarray:
    """index_key_hash(prefixes[prefix_index[i]] + key i) for every key (int64)."""
    if not len(starts):
        return np.zeros(0, dtype=np.int64)
    keys = keys or _KeyBytes(blob, starts, ends)
    if not keys.is_plain() or not all(map(str.isascii, prefixes)):
        return np.array([index_key_hash(prefixes[p] + blob[s:e].decode("utf-8")) for p, s, e
                         in zip(prefix_index.tolist(), starts.tolist(), ends.tolist(), strict=True)],
                        dtype=np.int64)
    powers = _powers(int(keys.lengths.max()))
    contributions = keys.units.astype(np.uint64) * powers[keys.distance]
    key_h = np.add.reduceat(contributions, keys.first) & _MASK32
    prefix_h = np.array([java_string_hash(p) & _MASK32 for p in prefixes], dtype=np.uint64)
    return _index_hashes_of_unsigned(prefix_h[prefix_index] * powers[keys.lengths] + key_h)


def _index_hashes_of_unsigned(sums: np.ndarray) -> np.ndarray:
    """java_hash.index_hash_of_unsigned of each Java hash given as a uint64 sum mod 2**32, in
    one pass for a whole batch (int64)."""
    h = (sums & _MASK32).astype(np.int64)
    h = np.where(h >= 0x80000000, h - 0x100000000, h)
    return np.where(h == INT32_MIN, 0, np.abs(h))


def index_key_shards(prefixes: list[bytes], prefix_index: np.ndarray, blob: bytes, starts: np.ndarray,
                     ends: np.ndarray, shard_count: int, keys: _KeyBytes | None = None) -> np.ndarray:
    """CRC32C(prefixes[prefix_index[i]] + key i) % shard_count for every key (int64)."""
    count = len(starts)
    if shard_count == 1 or not count:
        return np.zeros(count, dtype=np.int64)
    seeds = [crc32c.crc32c(p) for p in prefixes]
    lengths = ends - starts
    if lengths.min() == 0 or lengths.max() > TABLE_KEY_MAX_BYTES:
        crcs = [crc32c.crc32c(blob[s:e], seeds[p]) for p, s, e
                in zip(prefix_index.tolist(), starts.tolist(), ends.tolist(), strict=True)]
        return np.array(crcs, dtype=np.int64) % shard_count
    keys = keys or _KeyBytes(blob, starts, ends)
    table = _crc_table(int(lengths.max()))
    contributions = table.ravel()[(keys.distance << 8) | keys.units]  # rows of 256 byte values
    linear = np.bitwise_xor.reduceat(contributions, keys.first).astype(np.uint64)
    # the affine part: the CRC of zeros of each (prefix, length) pair, one call per distinct pair
    pairs, inverse = np.unique(prefix_index * (TABLE_KEY_MAX_BYTES + 1) + lengths, return_inverse=True)
    zeros_crc = np.array([crc32c.crc32c(bytes(int(pair) % (TABLE_KEY_MAX_BYTES + 1)),
                                        seeds[int(pair) // (TABLE_KEY_MAX_BYTES + 1)])
                          for pair in pairs], dtype=np.uint64)
    return ((zeros_crc[inverse.ravel()] ^ linear) & _MASK32).astype(np.int64) % shard_count


def padded_key_hashes(keys: list[bytes]) -> list[int]:
    """index_key_hash of each whole ASCII index key (`topic#key` as bytes): the keys, NUL-padded
    on the left to one length, are one matrix times the powers of 31 (a leading zero unit adds
    nothing to a Java hash). A few numpy calls for any number of keys: the small-step path's
    hash, where index_key_hashes' per-byte arrays cost more in fixed cost than they save."""
    width = max(map(len, keys), default=0)
    if width == 0:
        return [0] * len(keys)
    if width > PADDED_KEY_MAX_BYTES:
        return [index_key_hash(key.decode("ascii")) for key in keys]
    powers = _powers(width)[width - 1::-1]
    matrix = np.frombuffer(b"".join(key.rjust(width, b"\0") for key in keys), dtype=np.uint8)
    sums = (matrix.reshape(len(keys), width).astype(np.uint64) @ powers) & _MASK32
    return list(map(index_hash_of_unsigned, sums.tolist()))  # _index_hashes_of_unsigned: +4 us a step
