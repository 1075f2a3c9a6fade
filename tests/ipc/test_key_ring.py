"""The key ring on real shared memory: blocks in order, wrap, overrun detection, restarts."""

from __future__ import annotations

import multiprocessing
import os
import time

import numpy as np
import pytest

from engine.errors import ServiceNotAvailableError, StoreError
from ipc.key_ring import (
    BLOCK_SLOT_SIZE,
    HEADER_SIZE,
    RING_HEADER_SIZE,
    KeyBlock,
    KeyRing,
    region_size_bytes,
)
from ipc.seqlock import store_word
from ipc.shm import SHM_DIR, issue_shm_token, region_name, unlink_stale_regions

SPAWN = multiprocessing.get_context("spawn")
GENERATION = 7
SPAN = 100  # commitlog bytes per test block


@pytest.fixture
def store_dir(tmp_path):
    issue_shm_token(tmp_path)  # what a supervisor does before creating its regions
    yield tmp_path
    unlink_stale_regions(tmp_path)


def block_keys(block_no: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The keys the tests publish as block `block_no` (1..7 keys, values tied to the number)."""
    count = block_no % 7 + 1
    i = np.arange(count, dtype=np.int64)
    return block_no * 1000 + i, block_no * SPAN + i, np.full(count, block_no, dtype=np.int64)


def publish(writer, block_no: int) -> bool:
    return writer.publish(block_no * SPAN, (block_no + 1) * SPAN, *block_keys(block_no))


def assert_block_is(block: KeyBlock, block_no: int) -> None:
    hashes, positions, times = block_keys(block_no)
    assert (block.start_pos, block.end_pos) == (block_no * SPAN, (block_no + 1) * SPAN)
    assert block.key_hash.tolist() == hashes.tolist()
    assert block.commit_pos.tolist() == positions.tolist()
    assert block.store_ts_ms.tolist() == times.tolist()


def test_blocks_come_back_in_order_with_their_columns(store_dir):
    ring = KeyRing.create(store_dir, 2, GENERATION, block_slots=8, key_slots=64)
    reader = KeyRing.attach(store_dir, GENERATION).reader(1)
    writer = ring.writer(1)
    assert reader.read(0) is None
    for block_no in range(3):
        assert publish(writer, block_no)
    for block_no in range(3):
        block = reader.read(0)
        assert block.block_no == block_no
        assert_block_is(block, block_no)
    assert reader.read(0) is None
    assert ring.reader(0).read(0) is None  # the other shard's ring is untouched
    assert reader.overruns == 0


def test_keys_wrap_around_the_end_of_the_ring(store_dir):
    ring = KeyRing.create(store_dir, 1, GENERATION, block_slots=4, key_slots=16)
    writer, reader = ring.writer(0), ring.reader(0)
    wrapped = 0
    for block_no in range(200):  # 4 keys per block on average: the keys wrap ~50 times
        first = writer.key_reserve
        assert publish(writer, block_no)
        wrapped += first % 16 + len(block_keys(block_no)[0]) > 16
        assert_block_is(reader.read(0), block_no)
    assert wrapped > 10
    assert reader.overruns == 0


def test_a_slow_reader_detects_overwritten_blocks_and_resumes_at_a_newer_one(store_dir):
    ring = KeyRing.create(store_dir, 1, GENERATION, block_slots=4, key_slots=64)
    writer, reader = ring.writer(0), ring.reader(0)
    for block_no in range(10):  # slots of blocks 0..5 are reused
        publish(writer, block_no)
    got = []
    while (block := reader.read(0)) is not None:
        assert_block_is(block, block.block_no)
        got.append(block.block_no)
    assert reader.overruns >= 1
    assert got and got[0] >= 6 and got == list(range(got[0], 10))


def test_overwritten_keys_are_detected_though_the_block_slot_survives(store_dir):
    ring = KeyRing.create(store_dir, 1, GENERATION, block_slots=64, key_slots=16)
    writer, reader = ring.writer(0), ring.reader(0)
    for block_no in (6, 6, 6, 6):  # 7 keys each: the fourth overwrites the first block's keys
        writer.publish(0, SPAN, *block_keys(block_no))
    blocks = []
    while (block := reader.read(0)) is not None:
        blocks.append(block)
    assert reader.overruns >= 1
    assert blocks and blocks[0].block_no >= 1  # block 0 (keys gone) was never handed out
    for block in blocks:
        assert block.key_hash.tolist() == block_keys(6)[0].tolist()


def test_a_block_bigger_than_half_the_ring_is_refused_and_leaves_a_gap(store_dir):
    ring = KeyRing.create(store_dir, 1, GENERATION, block_slots=8, key_slots=16)
    writer, reader = ring.writer(0), ring.reader(0)
    big = np.arange(9, dtype=np.int64)
    assert writer.max_block_keys == 8
    assert not writer.publish(0, SPAN, big, big, big)
    assert publish(writer, 1)
    assert_block_is(reader.read(0), 1)  # the reader sees a block starting past 0: a gap to scan


def test_read_skips_blocks_that_end_at_or_before_a_position(store_dir):
    ring = KeyRing.create(store_dir, 1, GENERATION, block_slots=16, key_slots=256)
    writer, reader = ring.writer(0), ring.reader(0)
    for block_no in range(6):
        publish(writer, block_no)
    block = reader.read(3 * SPAN)  # blocks 0..2 end at or before 300
    assert block.block_no == 3
    assert_block_is(block, 3)
    assert reader.read(3 * SPAN + 50).block_no == 4  # straddling blocks are handed out


def test_read_continuing_takes_only_a_block_that_continues_and_else_stays_put(store_dir):
    ring = KeyRing.create(store_dir, 1, GENERATION, block_slots=16, key_slots=256)
    writer, reader = ring.writer(0), ring.reader(0)
    for block_no in (0, 1, 2):
        publish(writer, block_no)
    writer.publish(5 * SPAN, 6 * SPAN, *block_keys(5))  # a gap: 300..500 was not handed on
    assert_block_is(reader.read(0), 0)
    assert_block_is(reader.read_continuing(SPAN, 3 * SPAN), 1)
    assert reader.read_continuing(2 * SPAN, 3 * SPAN - 1) is None  # block 2 ends past the limit
    assert reader.read_continuing(2 * SPAN + 1, 9 * SPAN) is None  # does not start there
    assert_block_is(reader.read_continuing(2 * SPAN, 3 * SPAN), 2)
    assert reader.read_continuing(3 * SPAN, 9 * SPAN) is None  # the gap
    assert reader.read(3 * SPAN).start_pos == 5 * SPAN  # still there for the next read
    assert reader.read_continuing(6 * SPAN, 9 * SPAN) is None and reader.overruns == 0


def test_empty_blocks_carry_only_a_range(store_dir):
    ring = KeyRing.create(store_dir, 1, GENERATION, block_slots=4, key_slots=16)
    writer, reader = ring.writer(0), ring.reader(0)
    empty = np.zeros(0, dtype=np.int64)
    assert writer.publish(500, 700, empty, empty, empty)
    block = reader.read(0)
    assert (block.start_pos, block.end_pos, len(block.key_hash)) == (500, 700, 0)


def test_a_writer_that_died_mid_block_is_resumed_by_the_next_one(store_dir):
    ring = KeyRing.create(store_dir, 1, GENERATION, block_slots=8, key_slots=64)
    writer, reader = ring.writer(0), ring.reader(0)
    for block_no in range(3):
        publish(writer, block_no)
    # what a SIGKILL between the two sequence stores of block 3 leaves: seq 2*3+1, no next_block
    slot_offset = HEADER_SIZE + RING_HEADER_SIZE + 3 * BLOCK_SLOT_SIZE
    store_word(ring.region.buf, slot_offset, 2 * 3 + 1)
    for block_no in range(3):
        assert reader.read(0).block_no == block_no
    assert reader.read(0) is None  # mid-write: not handed out
    adopted = KeyRing.open_writer(store_dir, 1, GENERATION, block_slots=8, key_slots=64)
    assert adopted.writer_pid == os.getpid()
    new_writer = adopted.writer(0)
    assert new_writer.next_block == 3  # the half-written block is written again
    for block_no in (3, 4):
        publish(new_writer, block_no)
    assert_block_is(reader.read(0), 3)
    assert_block_is(reader.read(0), 4)
    assert not ring.retired


def test_a_new_reader_starts_at_the_oldest_block_still_in_the_ring(store_dir):
    ring = KeyRing.create(store_dir, 1, GENERATION, block_slots=4, key_slots=256)
    writer = ring.writer(0)
    for block_no in range(10):
        publish(writer, block_no)
    reader = KeyRing.attach(store_dir, GENERATION).reader(0)  # a restarted builder
    first = reader.read(0)
    assert first.block_no in (6, 7)
    assert_block_is(first, first.block_no)


def test_open_writer_replaces_a_ring_of_another_geometry_and_retires_it(store_dir):
    old = KeyRing.create(store_dir, 1, GENERATION, block_slots=4, key_slots=16)
    new = KeyRing.open_writer(store_dir, 2, GENERATION, block_slots=8, key_slots=32)
    assert old.retired and not new.retired
    assert (new.shard_count, new.block_slots, new.key_slots) == (2, 8, 32)
    assert KeyRing.attach(store_dir, GENERATION).shard_count == 2


def test_attach_refuses_a_missing_ring_and_another_generation(store_dir):
    with pytest.raises(ServiceNotAvailableError):
        KeyRing.attach(store_dir, GENERATION)
    KeyRing.create(store_dir, 1, GENERATION, block_slots=4, key_slots=16)
    with pytest.raises(StoreError, match="generation"):
        KeyRing.attach(store_dir, GENERATION + 1)
    name = region_name(store_dir, "keyring")
    assert os.stat(SHM_DIR / name.lstrip("/")).st_mode & 0o777 == 0o600
    assert os.stat(SHM_DIR / name.lstrip("/")).st_size == region_size_bytes(1, 4, 16)


def test_bad_geometry_is_refused_and_creates_nothing(store_dir):
    with pytest.raises(ValueError, match="key ring needs"):
        KeyRing.create(store_dir, 1, GENERATION, block_slots=1, key_slots=16)
    assert not (SHM_DIR / region_name(store_dir, "keyring").lstrip("/")).exists()


def _create_and_exit(store_dir: str) -> None:
    ring = KeyRing.create(store_dir, 1, GENERATION, block_slots=4, key_slots=16)
    ring.close()


def test_a_builder_removes_the_ring_only_once_its_writer_is_gone(store_dir):
    ring = KeyRing.create(store_dir, 1, GENERATION, block_slots=4, key_slots=16)
    assert not ring.remove_if_writer_gone()  # this process, the writer, is alive
    ring.remove()
    proc = SPAWN.Process(target=_create_and_exit, args=(str(store_dir),))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0
    reader_side = KeyRing.attach(store_dir, GENERATION)
    assert reader_side.writer_pid == proc.pid
    assert reader_side.remove_if_writer_gone()
    with pytest.raises(ServiceNotAvailableError):
        KeyRing.attach(store_dir, GENERATION)


def _write_fast(store_dir: str, block_count: int) -> None:
    writer = KeyRing.attach(store_dir, GENERATION).writer(0)
    for block_no in range(block_count):
        publish(writer, block_no)


def test_a_reader_in_another_process_never_gets_a_torn_or_overwritten_block(store_dir):
    ring = KeyRing.create(store_dir, 1, GENERATION, block_slots=4, key_slots=16)
    reader = ring.reader(0)
    block_count = 20_000
    proc = SPAWN.Process(target=_write_fast, args=(str(store_dir), block_count))
    proc.start()
    got, last = 0, -1
    deadline = time.monotonic() + 60
    while last < block_count - 1 and time.monotonic() < deadline:
        block = reader.read(0)
        if block is None:
            if not proc.is_alive() and reader.read(0) is None:
                break
            continue
        assert block.block_no > last
        assert_block_is(block, block.block_no)  # every field and key from that one block
        last = block.block_no
        got += 1
    proc.join(30)
    assert proc.exitcode == 0
    assert last == block_count - 1  # the newest block always survives
    assert got > 1  # some while the writer ran (how many depends on the scheduler)
