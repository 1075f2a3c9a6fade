"""Shared words (heartbeats, states, seqlock sequence words) are never seen half-written.

struct.pack_into zeroes its destination before writing, so a reader in another process could
see a heartbeat of 0 and the supervisor killed a healthy child; store_word is one store."""

from __future__ import annotations

import mmap
import os
import struct
import time

from ipc.seqlock import store_word


def test_store_word_never_shows_zero_to_a_reader_in_another_process():
    region = mmap.mmap(-1, 64)
    buf = memoryview(region)
    store_word(buf, 8, 1, "q")
    pid = os.fork()
    if pid == 0:  # writer: stamp non-zero values as fast as possible
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            store_word(buf, 8, time.monotonic_ns(), "q")
        os._exit(0)
    zeros = reads = 0
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        (value,) = struct.unpack_from("<q", buf, 8)
        reads += 1
        zeros += value == 0
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert reads > 10_000
    assert zeros == 0


def test_store_word_refuses_a_misaligned_offset():
    buf = memoryview(bytearray(16))
    try:
        store_word(buf, 4, 1, "Q")
    except ValueError as exc:
        assert "aligned" in str(exc)
    else:
        raise AssertionError("a misaligned 8-byte store was accepted")
