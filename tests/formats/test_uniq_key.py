"""UNIQ_KEYs: one generator for every path, distinct under threads, decodable to its layout."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from engine.errors import BadInputError
from engine.formats.uniq_key import (
    UNIQ_COUNTER_MASK,
    UNIQ_KEY_CHARS,
    UniqKeyBlock,
    decode_uniq_key,
    new_uniq_key,
    new_uniq_key_block,
    new_uniq_keys,
    reserve_uniq_keys,
)

THREADS = 8
ROUNDS = 300


def hammer(take) -> list[str]:
    """Every key `take()` returns from THREADS threads started together, switching often."""
    start = threading.Barrier(THREADS)
    out: list[list[str]] = [[] for _ in range(THREADS)]

    def run(slot: int) -> None:
        start.wait()
        for i in range(ROUNDS):
            out[slot] += take(i)

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # make a thread switch inside a reservation as likely as it gets
    try:
        threads = [threading.Thread(target=run, args=(slot,)) for slot in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(old_interval)
    return [key for keys in out for key in keys]


def reserved(count: int) -> list[str]:
    """The keys of a reserve_uniq_keys (a blocking send's path), as a block of them."""
    prefix, first = reserve_uniq_keys(count)
    return UniqKeyBlock(prefix, first, count).texts()


def mixed(i: int) -> list[str]:
    """Every way a key is made: one key, a list, a block (the Producer's path), a list of 50,
    one reserved without a block (a blocking send's)."""
    return [[new_uniq_key()], new_uniq_keys(7), new_uniq_key_block(13).texts(),
            new_uniq_keys(50), reserved(1)][i % 5]


def test_keys_from_eight_threads_are_all_distinct():
    keys = hammer(mixed)
    assert len(keys) == THREADS * ROUNDS // 5 * (1 + 7 + 13 + 50 + 1)
    assert len(set(keys)) == len(keys)


def test_blocks_from_eight_threads_reserve_disjoint_counter_ranges():
    blocks = hammer(lambda _: [new_uniq_key_block(64)])
    counters = [(b.first_counter + i) & UNIQ_COUNTER_MASK for b in blocks for i in range(b.count)]
    assert len(counters) == len(set(counters)) == THREADS * ROUNDS * 64


def test_key_decodes_to_pid_salt_time_and_consecutive_counters():
    before_ms = time.time_ns() // 1_000_000
    block = new_uniq_key_block(3)
    keys = [*block.texts(), new_uniq_key(), *new_uniq_keys(2), *reserved(1)]
    after_ms = time.time_ns() // 1_000_000
    assert all(len(key) == UNIQ_KEY_CHARS and key == key.upper() for key in keys)
    assert all(key[:14] == block.prefix[:14] for key in keys)  # pid and salt
    fields = [decode_uniq_key(key) for key in keys]
    assert {f.pid for f in fields} == {os.getpid() & 0xFFFFFFFF}
    assert len({f.salt for f in fields}) == 1  # one generator: record's and message's keys share it
    assert all(before_ms <= f.time_ms <= after_ms for f in fields)
    first = block.first_counter
    assert [f.counter for f in fields] == [(first + i) & UNIQ_COUNTER_MASK for i in range(7)]


def test_block_counter_wraps_at_24_bits_and_an_oversized_block_is_refused():
    block = new_uniq_key_block(0)._replace(first_counter=UNIQ_COUNTER_MASK - 1, count=3)
    assert [key[-6:] for key in block.texts()] == ["FFFFFE", "FFFFFF", "000000"]
    counter = new_uniq_key_block(1).first_counter
    with pytest.raises(BadInputError, match="2\\*\\*24"):
        new_uniq_key_block(UNIQ_COUNTER_MASK + 2)
    assert new_uniq_key_block(1).first_counter == (counter + 1) & UNIQ_COUNTER_MASK  # nothing taken


@pytest.mark.parametrize("bad", ["", "0" * 31, "0" * 33, "a" * 32, "G" * 32, "_" * 32, "\u0660" * 32,
                                 12, None])
def test_decode_refuses_what_is_not_32_uppercase_hex_digits(bad):
    with pytest.raises(BadInputError, match="uniq_key"):
        decode_uniq_key(bad)
