"""engine.message column checks and UNIQ_KEY blocks: the per-message rules, applied to columns."""

from __future__ import annotations

import os
import re
import threading

import numpy as np
import pytest

from engine.errors import BadInputError
from engine.formats.uniq_key import (
    UNIQ_COUNTER_MASK,
    UniqKeyBlock,
    new_uniq_key,
    new_uniq_key_block,
    new_uniq_keys,
)
from engine.message import body_column, key_bytes, key_column, normalize_keys, queue_id_column, tags_text

UNIQ_KEY = re.compile(r"[0-9A-F]{32}")


def test_key_column_encodes_utf8_one_key_each():
    assert key_column(["a", "é", "k%1", "漢字"], 4) == [b"a", "é".encode(), b"k%1", "漢字".encode()]
    assert key_column((), 0) == []


@pytest.mark.parametrize("keys, words", [
    (["a", "b c"], "key 1: 'b c': a key must be non-empty and hold no spaces"),
    (["a", ""], "key 1: '': a key must be non-empty"),
    (["a\x01b", "c"], "key 0: must not contain the bytes 0x01 or 0x02"),
    (["a", "b\x02"], "key 1: must not contain the bytes 0x01 or 0x02"),
    (["a", "bad\udcff"], "key 1: is not valid UTF-8 text"),
    (["a", 7], "key 1: must be a str, not int"),
    (["a"], "1 keys for 2 messages"),
    ("ab", "not a single str"),
    (5, "must be a sequence of str, not int"),
])
def test_key_column_names_the_bad_key(keys, words):
    with pytest.raises(BadInputError, match=re.escape(words)) as info:
        key_column(keys, 2)
    assert info.value.field == "keys"


def test_key_column_agrees_with_normalize_keys():
    for key in ["a", "a b", "", "x\x01", "é", "\x02", "tab\tok"]:
        try:
            expected = [normalize_keys((key,))[0].encode()]
        except BadInputError:
            expected = None
        try:
            got = key_column([key], 1)
        except BadInputError:
            got = None
        assert got == expected, key


class _Key(str):
    def encode(self, *args, **kwargs):  # a subclass that lies about its bytes
        return b"other"


@pytest.mark.parametrize("key, expected", [
    ("a", b"a"), ("é", "é".encode()), ("tab\tok", b"tab\tok"), (_Key("k1"), b"k1"),
    ("a b", None), ("", None), ("x\x01", None), ("\x02", None), ("bad\udcff", None), (7, None),
    (None, None),
])
def test_key_bytes_is_a_keys_utf8_or_none_as_normalize_keys_and_key_column_decide(key, expected):
    """The one-message send's check (ipc.one_message) and the checking paths': the same rule."""
    assert key_bytes(key) == expected
    try:
        assert key_column([key], 1) == [expected]
    except BadInputError:
        assert expected is None


def test_body_column():
    view = memoryview(b"mv")
    assert body_column([b"a", bytearray(b"b"), view]) == [b"a", b"b", b"mv"]
    bodies = [b"x", b"y"]
    assert body_column(bodies) == bodies and body_column(bodies) is not bodies
    with pytest.raises(BadInputError, match="body 1 must be bytes, not str"):
        body_column([b"ok", "text"])
    with pytest.raises(BadInputError, match="sequence of bytes, not int"):
        body_column(3)


def test_queue_id_column():
    assert queue_id_column(2, 5, 4) == 2
    assert queue_id_column([0, 3, 1], 3, 4) == [0, 3, 1]
    assert queue_id_column(np.array([1, 2], dtype=np.int32), 2, 4) == [1, 2]
    for bad, words in [([0, 4], "4 is outside 0..3"), ([-1, 0], "-1 is outside 0..3"),
                       ([0, True], "must be an int, not bool"), ([0, 1.0], "must be an int, not float"),
                       ([0], "1 queue ids for 2 messages"), (True, "not bool"), (4, "outside 0..3"),
                       ("01", "must be an int, not str")]:
        with pytest.raises(BadInputError, match=re.escape(words)):
            queue_id_column(bad, 2, 4)


def test_tags_text():
    assert tags_text(None) is None and tags_text("a b%é") == "a b%é".encode()
    for bad in ["", "x\x01", "bad\udcff", 3]:
        with pytest.raises(BadInputError, match="tags"):
            tags_text(bad)


def test_uniq_key_block_has_new_uniq_key_layout_and_counts_on():
    first, second = new_uniq_key_block(3), new_uniq_key_block(2)
    keys = first.texts() + second.texts()
    assert all(UNIQ_KEY.fullmatch(key) for key in keys) and len(set(keys)) == 5
    assert int(first.prefix[:8], 16) == os.getpid() & 0xFFFFFFFF
    assert second.first_counter == (first.first_counter + 3) & UNIQ_COUNTER_MASK
    # one generator: record.new_uniq_key(s) share the salt and count on from the same counter
    single, listed = new_uniq_key(), new_uniq_keys(1)[0]
    assert single[8:14] == listed[8:14] == first.prefix[8:14]
    assert int(single[-6:], 16) == (second.first_counter + 2) & UNIQ_COUNTER_MASK
    assert int(listed[-6:], 16) == (second.first_counter + 3) & UNIQ_COUNTER_MASK


def test_uniq_key_block_counter_wraps_at_24_bits():
    block = UniqKeyBlock("0" * 26, UNIQ_COUNTER_MASK - 1, 3)
    assert [key[-6:] for key in block.texts()] == ["FFFFFE", "FFFFFF", "000000"]
    with pytest.raises(BadInputError, match="2\\*\\*24"):
        new_uniq_key_block(UNIQ_COUNTER_MASK + 2)


def test_uniq_key_blocks_from_many_threads_never_overlap():
    blocks: list[UniqKeyBlock] = []

    def take():
        for _ in range(200):
            blocks.append(new_uniq_key_block(64))

    threads = [threading.Thread(target=take) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counters = [(b.first_counter + i) & UNIQ_COUNTER_MASK for b in blocks for i in range(b.count)]
    assert len(counters) == len(set(counters)) == 4 * 200 * 64


def test_uniq_key_salt_is_reseeded_in_a_forked_child():
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.close(read_fd)
        os.write(write_fd, f"{new_uniq_key_block(1).prefix} {new_uniq_key()}".encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as pipe:
        child_prefix, child_record_key = pipe.read().decode().split()
    os.waitpid(pid, 0)
    parent_prefix = new_uniq_key_block(1).prefix
    assert int(child_prefix[:8], 16) == pid & 0xFFFFFFFF
    assert child_prefix[8:14] == child_record_key[8:14]  # one generator, one salt
    assert child_prefix[8:14] != parent_prefix[8:14]  # a fresh salt (equal by chance: 1 in 2**24)
