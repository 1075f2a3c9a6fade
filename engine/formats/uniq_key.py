"""UNIQ_KEY: the unique id a producer gives each message (DESIGN: 32 hex chars), made in blocks.

One generator serves every path: a block reserves `count` consecutive counters under one lock
with one clock read, so threads never get overlapping ranges and a batch's keys cost one prefix
plus a counter range (Producer.send_columns passes exactly that to encode_many.encode_columns).

Layout: 16 bytes printed as 32 uppercase hex digits, most significant first

    chars  bytes  field
     0- 7      4  pid & 0xFFFFFFFF
     8-13      3  salt             random per process, drawn again in a forked child
    14-25      6  time ms & 0xFFFFFFFFFFFF (the block's clock read)
    26-31      3  counter          (first_counter + i) mod 2**24

The first 26 digits are a block's `prefix`. Unlike RocketMQ's MessageClientIDSetter id (IP,
pid, class-loader hash, time since the month began, counter), nothing here needs the host's IP;
both are 32 hex digits, which is all a RocketMQ reader of UNIQ_KEY assumes.
"""

from __future__ import annotations

import os
import threading
import time
from typing import NamedTuple

import numpy as np

from engine.errors import BadInputError
from engine.tuning import UNIQ_NUMPY_TEXTS_MIN

UNIQ_KEY_CHARS = 32
UNIQ_PREFIX_CHARS = 26
UNIQ_COUNTER_DIGITS = UNIQ_KEY_CHARS - UNIQ_PREFIX_CHARS
UNIQ_COUNTER_MASK = (1 << (4 * UNIQ_COUNTER_DIGITS)) - 1
_SALT_BYTES = 3
_TIME_MASK = (1 << 48) - 1


class UniqKeyFields(NamedTuple):
    """A UNIQ_KEY taken apart (decode_uniq_key)."""

    pid: int
    salt: int
    time_ms: int  # mod 2**48
    counter: int


class UniqKeyBlock(NamedTuple):
    """`count` UNIQ_KEYs: key i is prefix + the six uppercase hex digits of
    (first_counter + i) mod 2**24."""

    prefix: str  # UNIQ_PREFIX_CHARS hex digits: pid, salt, time ms
    first_counter: int
    count: int

    def texts(self) -> list[str]:
        """The UNIQ_KEYs as str, one per message. From UNIQ_NUMPY_TEXTS_MIN keys the counters' hex
        digits are made by numpy (one str per key is all that is left to Python)."""
        if self.count < UNIQ_NUMPY_TEXTS_MIN:
            return [f"{self.prefix}{(self.first_counter + i) & UNIQ_COUNTER_MASK:0{UNIQ_COUNTER_DIGITS}X}"
                    for i in range(self.count)]
        counters = (self.first_counter + np.arange(self.count, dtype=np.int64)) & UNIQ_COUNTER_MASK
        chars = np.empty((self.count, UNIQ_KEY_CHARS), dtype=np.uint32)
        chars[:, :UNIQ_PREFIX_CHARS] = np.frombuffer(self.prefix.encode("ascii"), dtype=np.uint8)
        chars[:, UNIQ_PREFIX_CHARS:] = _HEX_DIGITS[counters[:, None] >> _COUNTER_SHIFTS & 0xF]
        return chars.view(f"U{UNIQ_KEY_CHARS}").ravel().tolist()


_HEX_DIGITS = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8).astype(np.uint32)
_COUNTER_SHIFTS = np.arange(4 * (UNIQ_COUNTER_DIGITS - 1), -1, -4, dtype=np.int64)

_lock = threading.Lock()
_next_counter = 0
_pid_salt_hex = ""  # the prefix's first 14 digits: this process's pid and salt


def _reseed() -> None:
    """A fresh salt for this pid (and lock: a thread of the parent may have held it at the fork)."""
    global _lock, _pid_salt_hex
    _lock = threading.Lock()
    salt = int.from_bytes(os.urandom(_SALT_BYTES), "big")
    _pid_salt_hex = f"{os.getpid() & 0xFFFFFFFF:08X}{salt:06X}"


_reseed()
os.register_at_fork(after_in_child=_reseed)


def new_uniq_key_block(count: int) -> UniqKeyBlock:
    """`count` fresh UNIQ_KEYs: one clock read, `count` consecutive counters reserved atomically."""
    if not 0 <= count <= UNIQ_COUNTER_MASK + 1:
        raise BadInputError("count", f"{count} UNIQ_KEYs do not fit one block of 2**24 counters")
    return UniqKeyBlock(*reserve_uniq_keys(count), count)


def reserve_uniq_keys(count: int) -> tuple[str, int]:
    """new_uniq_key_block's (prefix, first_counter) without the block object or the range check
    (count must be 0..2**24): a blocking send's one key costs half as much this way."""
    global _next_counter
    now_ms = time.time_ns() // 1_000_000
    with _lock:
        first = _next_counter
        _next_counter = (first + count) & UNIQ_COUNTER_MASK
    return f"{_pid_salt_hex}{now_ms & _TIME_MASK:012X}", first


def new_uniq_key() -> str:
    """One fresh UNIQ_KEY (a block of one)."""
    prefix, counter = reserve_uniq_keys(1)
    return f"{prefix}{counter:0{UNIQ_COUNTER_DIGITS}X}"


def new_uniq_keys(count: int) -> list[str]:
    """`count` fresh UNIQ_KEYs as str (a block's texts)."""
    return new_uniq_key_block(count).texts()


def decode_uniq_key(text: str) -> UniqKeyFields:
    """The fields of a UNIQ_KEY made here; BadInputError unless 32 uppercase hex digits."""
    if not isinstance(text, str) or len(text) != UNIQ_KEY_CHARS or not _UPPER_HEX.issuperset(text):
        raise BadInputError("uniq_key", f"{text!r} is not {UNIQ_KEY_CHARS} uppercase hex digits")
    value = int(text, 16)
    return UniqKeyFields(pid=value >> 96, salt=value >> 72 & 0xFFFFFF, time_ms=value >> 24 & _TIME_MASK,
                         counter=value & UNIQ_COUNTER_MASK)


_UPPER_HEX = frozenset("0123456789ABCDEF")
