"""A hostile client beside the ledger producers: random and bit-flipped requests, every SYSFLAG
bit, lying record headers and slot headers, one rewritten after publishing. Nothing
acknowledged is lost, the store never stops or restarts a process, check is empty, and every
request the store answered PUT_OK is a message at its place."""

from __future__ import annotations

import random
import struct
from collections import Counter

import pytest

from engine.formats.record import SYS_FLAG_OFFSET
from tests.faults.fault_harness import assert_passed, run_torture, scaled
from tools.torture.hostile import MUTATIONS, hostile_request


@pytest.mark.slow
def test_hostile_rounds_lose_nothing_and_never_stop_the_store(tmp_path):
    figures = run_torture(tmp_path, target="hostile", rounds=scaled(2), acks_before_kill=(10, 100))
    assert_passed(figures)
    assert figures.kills["hostile"] == scaled(2) and figures.acked > 0
    answered = figures.hostile_statuses
    assert answered["requests"] == scaled(2) * 300
    assert min(answered["MESSAGE_ILLEGAL"], answered["PUT_OK"], answered["requests refused whole"]) > 0
    assert not figures.restarts  # no process of the store was lost or restarted


def test_requests_cover_every_sysflag_bit_and_every_lie():
    """The generator reaches what the round promises: each of the 32 SYSFLAG bits alone, each
    mutation, and each kind of lying slot header."""
    rng = random.Random(5)
    bits, kinds = set(), Counter()
    for _ in range(6000):
        request = hostile_request(rng, 4, 64, 65536)
        kinds.update(part for part in request.mutation.split(" + "))
        if request.mutation.startswith("sysflag one bit") and request.count == 1:
            (flag,) = struct.unpack_from(">I", request.data, SYS_FLAG_OFFSET)
            bits.add(flag.bit_length() - 1)
    assert bits == set(range(32))
    assert set(MUTATIONS) | {"lying count", "lying length", "header rewritten after publishing"} <= set(kinds)
