"""engine.log.last_record, engine.retention.segment_age and the checkpoint's store times over it: the record
ending at a position is found for every record size, a producer's record-shaped bytes inside a
body never stand in for the real record, and a sealed segment's age is read without touching
the holes past its data.

Records are stamped by a fake store clock; a segment is sealed by a record that does not fit.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import time
from pathlib import Path

import pytest

from engine.check.fsck import check
from engine.config import StoreConfig
from engine.files.mapped_file import Access
from engine.files.naming import commitlog_dir
from engine.formats.record import (
    BODY_LENGTH_OFFSET,
    BODY_OFFSET,
    MAGIC_V1,
    PHYSICAL_OFFSET_OFFSET,
    RECORD_FIXED_SIZE,
    STORE_TS_OFFSET,
    TOTAL_SIZE_OFFSET,
    encode_record,
)
from engine.log.commitlog import CommitLog
from engine.log.last_record import MAX_CANDIDATES, record_starts_ending_at
from engine.log.walker import LogWindow
from engine.recovery.durable_times import store_ts_before
from engine.retention import expiry as retention
from engine.retention.segment_age import read_segment_age
from engine.store import MessageStore

DAY_MS = 86_400_000
NOW_MS = int(time.time() * 1000)
CLOCK_START_MS = NOW_MS - 10 * DAY_MS  # records stored 10 days ago; retention keeps 72 h
TOPIC = "T"
SEG = 256 << 10
CONFIG = StoreConfig(commitlog_file_size=SEG, queue_count=1, file_reserved_hours=72)
FAKE_STORE_TS_MS = 1234  # what a producer's fake header claims as its store time
LARGEST_SIZE_BYTES = 70_000


def record_overhead(store: MessageStore) -> int:
    """TOTALSIZE minus body length of this test's records (topic, properties, CRC32C tail)."""
    result = store.put(TOPIC, b"o")
    return store.read_at(result.commit_pos).total_size - 1


def seal_first_segment(store: MessageStore) -> None:
    """A record that does not fit in segment 0: the segment ends in a filler."""
    free = SEG - store.commitlog.written_pos
    assert store.put(TOPIC, b"z" * (free + 1)).ok
    assert store.commitlog.written_pos > SEG


# ------------------------------------------------------------------ every record size is found


@pytest.mark.slow
def test_every_record_size_is_found_across_the_search_rounds():
    """Each round of the backward search covers the starts the last one did not: sizes just past
    4 KiB, 16 KiB and 64 KiB (a round's span plus less than a fixed header) used to be missed."""
    lead = 100  # bytes before the record: a round's low end is not the window's start
    buf = bytearray(lead + LARGEST_SIZE_BYTES)
    for size in range(RECORD_FIXED_SIZE, LARGEST_SIZE_BYTES + 1):
        start, end = lead, lead + size
        struct.pack_into(">iI", buf, start + TOTAL_SIZE_OFFSET, size, MAGIC_V1)
        struct.pack_into(">q", buf, start + PHYSICAL_OFFSET_OFFSET, start)
        window = LogWindow(memoryview(buf)[:end], 0, len(buf))
        assert list(record_starts_ending_at(window, end)) == [start], size
        buf[start:start + RECORD_FIXED_SIZE] = bytes(RECORD_FIXED_SIZE)


@pytest.mark.parametrize("size", [4097, 4096 + RECORD_FIXED_SIZE - 1, 16385, 65537 + 40])
def test_a_segment_whose_last_record_is_just_past_a_search_round_has_its_age(tmp_path, clock, size):
    with MessageStore.open(tmp_path, CONFIG) as store:
        body = b"x" * (size - record_overhead(store))
        clock.advance(1000)
        last = store.put(TOPIC, body)
        assert store.read_at(last.commit_pos).total_size == size
        seal_first_segment(store)
        assert read_segment_age(store.commitlog, 0).last_store_ts_ms == clock.now_ms
        assert store_ts_before(store.commitlog, SEG) == clock.now_ms
        assert store_ts_before(store.commitlog, last.commit_pos + size) == clock.now_ms
        removed = store.clean_expired(now_ms=NOW_MS, kind=retention.PassKind.MANUAL).segments_removed
        assert removed == [f"{0:020d}"]
    assert check(tmp_path) == []


# ------------------------------------------------- record-shaped bytes inside a producer's body


def fake_header(size: int, commit_pos: int, body_bytes: int) -> bytes:
    """A record header a producer wrote into its body: TOTALSIZE reaching the real record's end,
    its own position, BODYLENGTH ending where the real body ends and its own store time."""
    header = encode_record(TOPIC, b"", queue_id=0, born_ts_ms=1, born_host=("127.0.0.1", 1),
                           store_host=("127.0.0.1", 1))[:BODY_OFFSET]
    struct.pack_into(">i", header, TOTAL_SIZE_OFFSET, size)
    struct.pack_into(">q", header, PHYSICAL_OFFSET_OFFSET, commit_pos)
    struct.pack_into(">q", header, STORE_TS_OFFSET, FAKE_STORE_TS_MS)
    struct.pack_into(">i", header, BODY_LENGTH_OFFSET, body_bytes)
    return bytes(header)


def put_with_fakes(store: MessageStore, clock, body_bytes: int, fake_at: list[int],
                   body_length_fits: bool) -> int:
    """Put a body holding a fake header at each offset of `fake_at`; the real record's store time."""
    overhead = record_overhead(store)
    pos = store.commitlog.written_pos
    end = pos + overhead + body_bytes
    body = bytearray(b"A" * body_bytes)
    for k in fake_at:
        start = pos + BODY_OFFSET + k
        fake_body = body_bytes - k - BODY_OFFSET if body_length_fits else 0x41414141
        body[k:k + BODY_OFFSET] = fake_header(end - start, start, fake_body)
    clock.advance(1000)
    result = store.put(TOPIC, bytes(body))
    assert result.commit_pos == pos and store.commitlog.written_pos == end
    return clock.now_ms


@pytest.mark.parametrize("body_length_fits", [False, True], ids=["shaped", "structural"])
def test_a_fake_header_in_a_body_is_passed_over_for_the_real_last_record(tmp_path, clock,
                                                                         body_length_fits):
    """The candidates are tried newest first and the first that reads with every check (CRCs
    included) is the last record: the segment has its age, the checkpoint the real store time."""
    with MessageStore.open(tmp_path, CONFIG) as store:
        real_ts_ms = put_with_fakes(store, clock, 1000, [600, 300], body_length_fits)
        end = store.commitlog.written_pos
        assert store_ts_before(store.commitlog, end) == real_ts_ms
        seal_first_segment(store)
        assert read_segment_age(store.commitlog, 0).last_store_ts_ms == real_ts_ms
        assert store_ts_before(store.commitlog, SEG) == real_ts_ms
        removed = store.clean_expired(now_ms=NOW_MS, kind=retention.PassKind.MANUAL).segments_removed
        assert removed == [f"{0:020d}"]
    assert check(tmp_path) == []


def test_fake_headers_filling_the_limit_age_the_segment_by_the_next_ones_first_record(tmp_path, clock):
    """At most MAX_CANDIDATES are read with every check (each costs a CRC over up to a record):
    past that the checkpoint time is 0, and the segment is aged by the next segment's first
    record, stored after all of it, so a producer's body cannot keep a segment forever."""
    fakes = [100 + 100 * i for i in range(MAX_CANDIDATES)]
    with MessageStore.open(tmp_path, CONFIG) as store:
        put_with_fakes(store, clock, 100 * MAX_CANDIDATES + 500, fakes, body_length_fits=True)
        end = store.commitlog.written_pos
        assert store_ts_before(store.commitlog, end) == 0
        seal_first_segment(store)
        next_first_ts_ms = store.commitlog.read_at(SEG).store_ts_ms
        age = read_segment_age(store.commitlog, 0)
        assert f"{MAX_CANDIDATES}" in age.problem and "next segment" in age.problem
        assert age.last_store_ts_ms == next_first_ts_ms
        kept_ms = next_first_ts_ms + CONFIG.file_reserved_hours * 3_600_000
        for now_ms, expected in ((kept_ms - 1, []), (kept_ms, [f"{0:020d}"])):  # never early
            removed = store.clean_expired(now_ms=now_ms, kind=retention.PassKind.MANUAL).segments_removed
            assert removed == expected
    assert check(tmp_path) == []


# ------------------------------------------------------------- the holes past a segment's data


def _tmpfs_dir() -> Path | None:
    """A fresh directory on the machine's /dev/shm when that is a writable tmpfs (where a read
    fault on a hole allocates the page); None otherwise."""
    with open("/proc/mounts") as fh:
        tmpfs = any(line.split()[1:3] == ["/dev/shm", "tmpfs"] for line in fh)
    if not tmpfs or not os.access("/dev/shm", os.W_OK):
        return None
    return Path(tempfile.mkdtemp(prefix="mqstore-last-record-", dir="/dev/shm"))


@pytest.fixture
def tmpfs_dir():
    directory = _tmpfs_dir()
    if directory is None:
        pytest.skip("/dev/shm is not a writable tmpfs")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_a_segment_age_read_allocates_no_block_past_the_data(tmpfs_dir, clock):
    """Only the data ranges (SEEK_DATA) are read: on tmpfs a read fault on a hole allocates its
    page, and on a full tmpfs kills the process with SIGBUS."""
    seg_bytes = 4 << 20
    config = CONFIG.replace(commitlog_file_size=seg_bytes)
    with MessageStore.open(tmpfs_dir, config) as store:
        stamp = put_with_fakes(store, clock, 1 << 20, [], body_length_fits=True)
        assert store.put(TOPIC, b"b" * (3 << 20)).ok  # does not fit: segment 0 ends in a filler
        segment_file = commitlog_dir(tmpfs_dir) / f"{0:020d}"
        blocks_before = os.stat(segment_file).st_blocks
        assert blocks_before * 512 < seg_bytes - (1 << 20)  # a hole of at least 1 MiB at its end
        assert read_segment_age(store.commitlog, 0).last_store_ts_ms == stamp
        assert store_ts_before(store.commitlog, seg_bytes) == stamp
        assert os.stat(segment_file).st_blocks == blocks_before
    assert check(tmpfs_dir) == []


def test_a_segment_removed_after_a_read_only_view_refreshed_has_no_last_record(tmp_path, clock):
    """The checkpoint's view reads a segment retention may remove meanwhile: the data ranges
    need its file, so a removed one has no last record (0, warned), never an error."""
    with MessageStore.open(tmp_path, CONFIG) as store:
        stamp = put_with_fakes(store, clock, 1000, [], body_length_fits=True)
        seal_first_segment(store)
        view = CommitLog.open(tmp_path, SEG, Access.READ_ONLY)
        assert store_ts_before(view, SEG) == stamp
        removed = store.clean_expired(now_ms=NOW_MS, kind=retention.PassKind.MANUAL).segments_removed
        assert removed == [f"{0:020d}"]
        assert store_ts_before(view, SEG) == 0
        assert store_ts_before(view, store.commitlog.written_pos) == clock.now_ms
        view.close()
    assert check(tmp_path) == []
