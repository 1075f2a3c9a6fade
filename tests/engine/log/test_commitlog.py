"""CommitLog: append with end-of-file filler and roll (AppendCallbackTest), read, scan, cut."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import BadInputError, CorruptRecordError
from engine.files.mapped_file import Access
from engine.files.naming import offset_to_name
from engine.formats.record import (
    BLANK_MAGIC,
    FILLER_SIZE,
    RECORD_FIXED_SIZE,
    Filler,
    Verify,
    decode_record,
    encode_record,
)
from engine.formats.record.stamp_many import check_stampable
from engine.log.commitlog import CommitLog
from engine.tuning import STRUCT_PATH_MAX_RECORDS
from tests.conftest import ROCKETMQ_SAMPLES

SEG = 4096
TOPIC = "TopicA"
CRC_TAIL = 20
BASE_SIZE = RECORD_FIXED_SIZE + len(TOPIC) + CRC_TAIL  # a record with an empty body


def record(size: int = 300, queue_id: int = 0, fill: int = 0x61) -> bytearray:
    """An encoded, unstamped record of exactly `size` bytes."""
    body = bytes([fill]) * (size - BASE_SIZE)
    out = encode_record(TOPIC, body, queue_id=queue_id, born_ts_ms=1_700_000_000_000,
                        born_host=("127.0.0.1", 4242), store_host=("127.0.0.1", 10911))
    assert len(out) == size
    return out


def open_log(tmp_path, access=Access.READ_WRITE) -> CommitLog:
    return CommitLog.open(tmp_path, SEG, access)


def seg_path(tmp_path, base: int):
    return tmp_path / "commitlog" / offset_to_name(base)


def disk_bytes(tmp_path, base: int) -> bytes:
    with open(seg_path(tmp_path, base), "rb") as f:
        return f.read()


def fill(log: CommitLog, count: int, size: int = 300) -> list[int]:
    return [log.append(record(size, fill=0x41 + i % 26), queue_offset=i, store_ts_ms=1000 + i)
            for i in range(count)]


# ------------------------------------------------------------------------------ append


def test_commitlog_fresh_store_creates_first_segment_lazily(tmp_path):
    log = open_log(tmp_path)
    assert (log.written_pos, log.flushed_pos, log.min_pos) == (0, 0, 0)
    assert not (tmp_path / "commitlog").exists()
    assert log.append(record(), queue_offset=0, store_ts_ms=1) == 0
    assert seg_path(tmp_path, 0).exists()
    assert seg_path(tmp_path, SEG).exists()  # the next one is preallocated
    assert log.segments.end_pos == SEG  # ... but not adopted


def test_commitlog_append_read_at_round_trips_stamped_fields(tmp_path):
    log = open_log(tmp_path)
    raw = record(400, queue_id=3)
    first = log.append(raw, queue_offset=7, store_ts_ms=1234)
    second = log.append(record(), queue_offset=8, store_ts_ms=1235)
    assert (first, second, log.written_pos) == (0, 400, 700)
    got = log.read_at(first)
    assert (got.commit_pos, got.queue_offset, got.store_ts_ms, got.queue_id) == (0, 7, 1234, 3)
    assert (got.topic, got.body, got.total_size) == (TOPIC, bytes(raw[88:88 + 400 - BASE_SIZE]), 400)
    assert log.read_at(second).queue_offset == 8
    assert bytes(raw[20:36]) == bytes(16)  # the caller's buffer is not stamped


def test_commitlog_no_room_writes_8_byte_filler_and_rolls(tmp_path):
    log = open_log(tmp_path)
    positions = fill(log, 13)  # 13 * 300 = 3900; 196 left, a 300-byte record needs 308
    space_left = SEG - log.written_pos
    assert space_left == 196
    rolled = log.append(record(), queue_offset=13, store_ts_ms=2000)
    assert rolled == SEG
    seg0 = log.segments.find(0).buf
    total, magic = struct.unpack_from(">iI", seg0, 3900)
    assert (total, magic) == (space_left, BLANK_MAGIC)
    assert bytes(seg0[3908:SEG]) == bytes(space_left - FILLER_SIZE)  # exactly 8 bytes written
    assert decode_record(seg0, 3900) == Filler(3900, space_left)
    assert [r.commit_pos for r in log.scan(0, log.written_pos)] == [*positions, SEG]
    assert seg_path(tmp_path, 2 * SEG).exists()  # preallocated after the roll


def test_commitlog_exact_fit_leaves_8_bytes_then_minimal_filler(tmp_path):
    log = open_log(tmp_path)
    log.append(record(1000), queue_offset=0, store_ts_ms=1)
    exact = SEG - 1000 - FILLER_SIZE  # record + 8 == space left: it still fits
    assert log.append(record(exact), queue_offset=1, store_ts_ms=1) == 1000
    assert SEG - log.written_pos == FILLER_SIZE
    assert log.append(record(), queue_offset=2, store_ts_ms=1) == SEG
    assert decode_record(log.segments.find(0).buf, SEG - 8) == Filler(SEG - 8, 8)


def test_commitlog_one_byte_short_rolls(tmp_path):
    log = open_log(tmp_path)
    log.append(record(1000), queue_offset=0, store_ts_ms=1)
    assert log.append(record(SEG - 1000 - FILLER_SIZE + 1), queue_offset=1, store_ts_ms=1) == SEG
    assert decode_record(log.segments.find(0).buf, 1000) == Filler(1000, SEG - 1000)


def test_commitlog_record_bigger_than_segment_raises_bad_input(tmp_path):
    log = open_log(tmp_path)
    with pytest.raises(BadInputError) as info:
        log.append(record(SEG - FILLER_SIZE + 1), queue_offset=0, store_ts_ms=1)
    assert info.value.field == "body"
    assert log.written_pos == 0 and not (tmp_path / "commitlog").exists()
    assert log.append(record(SEG - FILLER_SIZE), queue_offset=0, store_ts_ms=1) == 0


def test_commitlog_record_with_wrong_totalsize_is_refused(tmp_path):
    log = open_log(tmp_path)
    with pytest.raises(BadInputError):
        log.append(record()[:-1], queue_offset=0, store_ts_ms=1)
    assert log.written_pos == 0


def test_commitlog_batch_spanning_roll_has_consecutive_offsets_one_store_time(tmp_path):
    log = open_log(tmp_path)
    log.append(record(3000), queue_offset=0, store_ts_ms=1)
    batch = [record(250, fill=0x30 + i) for i in range(8)]  # 4 fit (1000 + 8 <= 1096), 4 roll
    positions = log.append_batch(batch, list(range(1, 9)), store_ts_ms=777)
    assert positions == [3000, 3250, 3500, 3750, SEG, SEG + 250, SEG + 500, SEG + 750]
    assert log.written_pos == SEG + 1000
    records = list(log.scan(0, log.written_pos))
    assert [r.queue_offset for r in records] == list(range(9))
    assert {r.store_ts_ms for r in records[1:]} == {777}
    assert [r.body[0] for r in records[1:]] == [0x30 + i for i in range(8)]
    assert decode_record(log.segments.find(0).buf, 4000) == Filler(4000, 96)


def test_commitlog_batch_writes_same_bytes_as_single_appends(tmp_path):
    sizes = [200, 1500, 900, 1400, 350, 2000, 120, 3000, 600]
    a, b = open_log(tmp_path / "a"), open_log(tmp_path / "b")
    singles = [a.append(record(s), queue_offset=i, store_ts_ms=5) for i, s in enumerate(sizes)]
    batched = b.append_batch([record(s) for s in sizes], list(range(len(sizes))), 5)
    assert singles == batched and a.written_pos == b.written_pos
    for seg_a, seg_b in zip(a.segments.segments, b.segments.segments, strict=True):
        assert bytes(seg_a.buf) == bytes(seg_b.buf)


@pytest.mark.parametrize("count", [3, STRUCT_PATH_MAX_RECORDS, STRUCT_PATH_MAX_RECORDS + 1, 40])
def test_commitlog_append_encoded_spanning_rolls_equals_single_appends(tmp_path, count):
    """Both stamp paths (struct for a few records, numpy for more): same bytes as append()."""
    sizes = [BASE_SIZE + (i * 97) % 700 for i in range(count)]
    a, b = open_log(tmp_path / "a"), open_log(tmp_path / "b")
    a.append(record(2500), queue_offset=0, store_ts_ms=5)
    b.append(record(2500), queue_offset=0, store_ts_ms=5)
    singles = [a.append(record(s, fill=0x41 + i % 26), queue_offset=i + 1, store_ts_ms=5)
               for i, s in enumerate(sizes)]
    blob = bytearray(b"".join(record(s, fill=0x41 + i % 26) for i, s in enumerate(sizes)))
    starts = np.cumsum([0, *sizes[:-1]]).astype(np.int64)
    positions = b.append_encoded(blob, starts, np.array(sizes, dtype=np.int64), range(1, count + 1), 5)
    assert positions.tolist() == singles and a.written_pos == b.written_pos
    assert len(b.segments.segments) >= 2 or count < 10
    for seg_a, seg_b in zip(a.segments.segments, b.segments.segments, strict=True):
        assert bytes(seg_a.buf) == bytes(seg_b.buf)
    assert [r.commit_pos for r in b.scan(0, b.written_pos)][1:] == singles


def test_commitlog_append_stampable_gives_final_positions_before_writing(tmp_path):
    """before_write sees every record's commit_pos, fillers and rolls included, while nothing of
    the batch is on disk yet: the appender registers a waiting request there (a write that hangs
    on a stalled disk must not hide it from its deadline)."""
    log = open_log(tmp_path)
    log.append(record(2500), queue_offset=0, store_ts_ms=5)
    sizes = [BASE_SIZE + (i * 97) % 700 for i in range(30)]  # rolls into two more segments
    blob = bytearray(b"".join(record(s, fill=0x41 + i % 26) for i, s in enumerate(sizes)))
    starts = np.cumsum([0, *sizes[:-1]]).astype(np.int64)
    seen = []

    def before_write(positions):
        seen.append((positions.copy(), log.written_pos, len(log.segments.segments),
                     bytes(log.segments.find(0).buf)))

    records = check_stampable(blob, starts, np.array(sizes, dtype=np.int64))
    positions = log.append_stampable(records, range(1, 31), 5, before_write=before_write)
    [(planned, written_then, segments_then, first_segment_then)] = seen
    assert planned.tolist() == positions.tolist()
    assert written_then == 2500 and segments_then == 1
    assert first_segment_then[2500:] == bytes(SEG - 2500)  # nothing of the batch written yet
    assert len(log.segments.segments) >= 3
    assert [r.commit_pos for r in log.scan(0, log.written_pos)][1:] == positions.tolist()


@pytest.mark.parametrize("first", [0, 2500, 3200, SEG - 8])  # none, fits, some roll, all roll
def test_commitlog_append_few_writes_what_single_appends_write(tmp_path, first):
    """The few-record path (lists, struct, one pwrite) and, where the records do not fit the
    active segment or none exists, its hand-over to append_stampable: the same bytes, positions
    and written_pos as append() record by record, before_write seeing the final positions."""
    sizes = [BASE_SIZE + 150, BASE_SIZE + 400, BASE_SIZE + 40]
    a, b = open_log(tmp_path / "a"), open_log(tmp_path / "b")
    if first:
        a.append(record(first - 8 if first == SEG - 8 else first), queue_offset=0, store_ts_ms=5)
        b.append(record(first - 8 if first == SEG - 8 else first), queue_offset=0, store_ts_ms=5)
    singles = [a.append(record(s, fill=0x41 + i), queue_offset=i + 1, store_ts_ms=9)
               for i, s in enumerate(sizes)]
    blob = bytearray(b"".join(record(s, fill=0x41 + i) for i, s in enumerate(sizes)))
    seen, before = [], b.written_pos
    positions = b.append_few(blob, sizes, [1, 2, 3], 9,
                             before_write=lambda planned: seen.append((list(planned), b.written_pos)))
    assert positions == singles and seen == [(singles, before)]  # nothing written before it
    assert b.written_pos == a.written_pos
    for seg_a, seg_b in zip(a.segments.segments, b.segments.segments, strict=True):
        assert bytes(seg_a.buf) == bytes(seg_b.buf)


def test_commitlog_append_few_refuses_sizes_that_do_not_cover_the_records(tmp_path):
    log = open_log(tmp_path)
    with pytest.raises(BadInputError, match="sizes"):
        log.append_few(bytearray(record(300)), [299], [0], 1, before_write=lambda _: None)
    assert log.written_pos == 0 and not log.segments.segments


@pytest.mark.parametrize("count", [2, STRUCT_PATH_MAX_RECORDS + 4])
def test_commitlog_append_encoded_refuses_a_bad_record_before_writing(tmp_path, count):
    log = open_log(tmp_path)
    log.append(record(), queue_offset=0, store_ts_ms=1)
    records = [record(200) for _ in range(count)]
    records[-1][-CRC_TAIL] ^= 0xFF  # no reserved __CRC32C slot
    blob = bytearray(b"".join(records))
    starts = np.arange(count, dtype=np.int64) * 200
    with pytest.raises(BadInputError, match="CRC32C"):
        log.append_encoded(blob, starts, np.full(count, 200), range(count), 1)
    with pytest.raises(BadInputError, match="TOTALSIZE"):
        log.append_encoded(blob, starts, np.full(count, 199), range(count), 1)
    assert log.written_pos == 300
    assert bytes(log.segments.find(0).read(300, 300)) == bytes(300)


def test_commitlog_batch_with_one_bad_record_writes_nothing(tmp_path):
    log = open_log(tmp_path)
    log.append(record(), queue_offset=0, store_ts_ms=1)
    with pytest.raises(BadInputError):
        log.append_batch([record(), record(SEG)], [1, 2], 1)
    with pytest.raises(BadInputError):
        log.append_batch([record()], [1, 2], 1)
    assert log.written_pos == 300
    assert bytes(log.segments.find(0).read(300, 300)) == bytes(300)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(BASE_SIZE, SEG - FILLER_SIZE), min_size=1, max_size=12),
       split=st.integers(0, 12))
def test_commitlog_any_appends_scan_back_whole_within_segments(tmp_path_factory, sizes, split):
    log = open_log(tmp_path_factory.mktemp("log"))
    head, tail = sizes[:split], sizes[split:]
    positions = [log.append(record(s), queue_offset=i, store_ts_ms=9) for i, s in enumerate(head)]
    if tail:
        positions += log.append_batch([record(s) for s in tail], list(range(len(head), len(sizes))), 9)
    scanned = list(log.scan(0, log.written_pos))
    assert [r.commit_pos for r in scanned] == positions
    assert [r.total_size for r in scanned] == sizes
    assert all(p // SEG == (p + s - 1) // SEG for p, s in zip(positions, sizes, strict=True))
    log.close()


# ------------------------------------------------------------------------------- flush


def test_commitlog_flush_moves_flushed_pos_and_bytes_are_in_the_file(tmp_path):
    log = open_log(tmp_path)
    fill(log, 13)
    last = log.append(record(fill=0x7A), queue_offset=13, store_ts_ms=1)
    assert log.flushed_pos == 0
    assert log.flush() == log.written_pos == log.flushed_pos == SEG + 300
    assert disk_bytes(tmp_path, 0)[3900:3908] == struct.pack(">iI", 196, BLANK_MAGIC)
    assert disk_bytes(tmp_path, SEG)[:300] == bytes(log.read_bytes(last, 300))
    assert log.flush() == SEG + 300  # nothing new: no-op


def test_commitlog_flush_errors_propagate(tmp_path, monkeypatch):
    log = open_log(tmp_path)
    fill(log, 1)

    def fail(start_pos, end_pos):
        raise OSError(5, "EIO")

    monkeypatch.setattr(log.segments, "sync_range", fail)
    with pytest.raises(OSError):
        log.flush()
    assert log.flushed_pos == 0


# -------------------------------------------------------------------------------- read


def test_commitlog_read_at_outside_log_or_at_filler_raises_bad_input(tmp_path):
    log = open_log(tmp_path)
    fill(log, 14)
    for pos in (-1, log.written_pos, log.written_pos + 5, 10 * SEG):
        with pytest.raises(BadInputError) as info:
            log.read_at(pos)
        assert info.value.field == "commit_pos"
    with pytest.raises(BadInputError, match="filler"):
        log.read_at(3900)


def test_commitlog_read_at_corrupt_bytes_raises_corrupt_record(tmp_path):
    log = open_log(tmp_path)
    positions = fill(log, 3)
    log.segments.find(0).buf[positions[1] + 100] ^= 0xFF  # a body byte
    with pytest.raises(CorruptRecordError) as info:
        log.read_at(positions[1])
    assert info.value.pos == positions[1]
    assert log.read_at(positions[1], verify=Verify.STRUCTURE).commit_pos == positions[1]


def test_commitlog_read_bytes_is_zero_copy_within_one_segment(tmp_path):
    log = open_log(tmp_path)
    fill(log, 14)
    view = log.read_bytes(SEG, 300)
    assert isinstance(view, memoryview) and struct.unpack_from(">i", view)[0] == 300
    log.segments.find(SEG).buf[SEG // 2] = 0  # outside the view: no effect
    log.segments.find(SEG).buf[299] = 0x55
    assert view[299] == 0x55
    with pytest.raises(BadInputError):
        log.read_bytes(3900, 300)  # crosses into the next segment
    view.release()


def test_commitlog_read_only_view_adopts_new_segments(tmp_path):
    writer = open_log(tmp_path)
    fill(writer, 2)
    reader = open_log(tmp_path, Access.READ_ONLY)
    fill(writer, 14)
    assert reader.read_at(SEG).commit_pos == SEG
    assert [r.commit_pos for r in reader.scan(0, writer.written_pos)][-1] == SEG + 300 * 2


# -------------------------------------------------------------------------------- scan


def test_commitlog_scan_follows_fillers_and_reports_where_it_stopped(tmp_path):
    log = open_log(tmp_path)
    positions = fill(log, 30)  # three segments, 13 + 13 + 4 records
    scanner = log.scan(0, log.written_pos)
    assert [r.commit_pos for r in scanner] == positions
    assert (scanner.pos, scanner.fillers) == (log.written_pos, 2)
    headers = log.scan_headers(positions[5], log.written_pos)
    assert [(h.commit_pos, h.queue_offset, h.topic) for h in headers] == \
        [(p, i + 5, TOPIC) for i, p in enumerate(positions[5:])]
    assert headers.pos == log.written_pos


def test_commitlog_scan_to_segment_end_raises_at_unwritten_bytes(tmp_path):
    log = open_log(tmp_path)
    positions = fill(log, 5)
    scanner = log.scan(0)
    seen = []
    with pytest.raises(CorruptRecordError) as info:
        seen.extend(r.commit_pos for r in scanner)
    assert seen == positions
    assert info.value.pos == scanner.pos == log.written_pos


def test_commitlog_scan_stops_before_record_crossing_end_pos(tmp_path):
    log = open_log(tmp_path)
    positions = fill(log, 5)
    scanner = log.scan(positions[1], positions[3] + 10)
    assert [r.commit_pos for r in scanner] == positions[1:3]
    assert scanner.pos == positions[3]
    assert list(log.scan(positions[2], positions[2])) == []


def test_commitlog_corrupt_byte_stops_scan_at_that_records_commit_pos(tmp_path):
    log = open_log(tmp_path)
    positions = fill(log, 30)
    bad = positions[17]
    segment = log.segments.find(bad)
    segment.buf[bad - log.segments.base_of(segment) + 150] ^= 0x01
    scanner = log.scan(0, log.written_pos)
    seen = []
    with pytest.raises(CorruptRecordError) as info:
        seen.extend(r.commit_pos for r in scanner)
    assert info.value.pos == scanner.pos == bad
    assert seen == positions[:17]
    assert len(list(log.scan_headers(0, log.written_pos))) == 30  # no CRC on the header path


def test_commitlog_scan_rejects_filler_of_wrong_size(tmp_path):
    log = open_log(tmp_path)
    fill(log, 14)
    struct.pack_into(">i", log.segments.find(0).buf, 3900, 100)
    with pytest.raises(CorruptRecordError) as info:
        list(log.scan(0, log.written_pos))
    assert info.value.pos == 3900


def test_commitlog_next_segment_pos(tmp_path):
    log = open_log(tmp_path)
    assert [log.next_segment_pos(p) for p in (0, 1, SEG - 1, SEG, 3 * SEG + 7)] == \
        [SEG, SEG, SEG, 2 * SEG, 4 * SEG]


# -------------------------------------------------------------------- reopen, cut, retain


def test_commitlog_reopen_reset_positions_continue_into_loaded_segment(tmp_path):
    log = open_log(tmp_path)
    fill(log, 12)
    end = log.written_pos
    log.close()
    log = open_log(tmp_path)
    assert log.written_pos == log.flushed_pos == 2 * SEG  # all loaded bytes, until recovery
    log.reset_positions(end, end)
    positions = fill(log, 3)
    assert positions == [end, SEG, SEG + 300]  # the preallocated, loaded segment is reused
    assert [r.queue_offset for r in log.scan(0, log.written_pos)] == [*range(12), 0, 1, 2]


def test_commitlog_reset_positions_refuses_no_room_for_filler(tmp_path):
    log = open_log(tmp_path)
    with pytest.raises(BadInputError):
        log.reset_positions(SEG - 4, 0)
    with pytest.raises(BadInputError):
        log.reset_positions(100, 200)


def test_commitlog_truncate_to_zeroes_tail_and_removes_later_segments(tmp_path):
    log = open_log(tmp_path)
    positions = fill(log, 30)  # segments 0, 1, 2 (+ 3 preallocated)
    cut = positions[16]  # inside segment 1
    assert SEG < cut < 2 * SEG
    tail = log.tail_bytes(cut, log.written_pos)
    assert tail[:300] == bytes(log.read_bytes(cut, 300)) and len(tail) == log.written_pos - cut
    log.truncate_to(cut)
    assert (log.written_pos, log.flushed_pos) == (cut, cut)
    assert sorted(os.listdir(tmp_path / "commitlog")) == [offset_to_name(0), offset_to_name(SEG)]
    on_disk = disk_bytes(tmp_path, SEG)
    assert on_disk[cut - SEG:] == bytes(2 * SEG - cut)
    assert on_disk[:cut - SEG] == disk_bytes(tmp_path, SEG)[:cut - SEG]
    assert on_disk[cut - SEG - 300:cut - SEG] != bytes(300)
    new = log.append(record(), queue_offset=99, store_ts_ms=1)
    assert new == cut
    assert [r.commit_pos for r in log.scan(0, log.written_pos)] == [*positions[:16], cut]


def test_commitlog_truncate_at_segment_base_keeps_it_empty(tmp_path):
    log = open_log(tmp_path)
    fill(log, 30)
    log.truncate_to(SEG)
    assert sorted(os.listdir(tmp_path / "commitlog")) == [offset_to_name(0), offset_to_name(SEG)]
    assert disk_bytes(tmp_path, SEG) == bytes(SEG)
    assert log.append(record(), queue_offset=0, store_ts_ms=1) == SEG
    with pytest.raises(BadInputError):
        log.truncate_to(100 * SEG)


def test_commitlog_remove_oldest_segment_never_the_active_one(tmp_path):
    log = open_log(tmp_path)
    fill(log, 5)
    with pytest.raises(BadInputError):
        log.remove_oldest_segment()
    fill(log, 40)
    assert log.remove_oldest_segment().name == offset_to_name(0)
    assert log.min_pos == SEG
    with pytest.raises(BadInputError):
        log.read_at(0)
    assert log.read_at(SEG).commit_pos == SEG


def test_commitlog_segments_info_lists_segments_oldest_first_and_loses_the_removed(tmp_path):
    log = open_log(tmp_path)
    fill(log, 60)  # segments 0..4
    infos = log.segments_info()
    assert [i.base_pos for i in infos] == [0, SEG, 2 * SEG, 3 * SEG, 4 * SEG]
    assert [i.path.name for i in infos] == [offset_to_name(i.base_pos) for i in infos]
    removed = [log.remove_oldest_segment().name for _ in range(2)]  # RocketMQ: from the front only
    assert removed == [offset_to_name(0), offset_to_name(SEG)]
    assert log.min_pos == log.segments_info()[0].base_pos == 2 * SEG


# ---------------------------------------------------------------- RocketMQ-written files

SAMPLES = str(ROCKETMQ_SAMPLES)


@pytest.mark.skipif(not os.path.isdir(SAMPLES), reason="RocketMQ sample files not present")
@pytest.mark.parametrize("store", ["store-2021", "store-2019"])
def test_commitlog_reads_rocketmq_written_segment_read_only(store):
    log = CommitLog.open(f"{SAMPLES}/{store}", 8192, Access.READ_ONLY)
    scanner = log.scan(0, verify=Verify.ROCKETMQ)
    records = list(scanner)
    assert (scanner.pos, scanner.fillers) == (8192, 1)  # RocketMQ's own end-of-file filler
    assert decode_record(log.segments.find(0).buf, 47 * 172) == Filler(8084, 8192 - 8084)
    assert [r.queue_offset for r in records] == list(range(47))
    assert {(r.topic, r.total_size, r.tags, r.body) for r in records} == \
        {("abc", 172, "TAG1", b"Once, there was a chance for me!")}
    assert log.read_at(172, verify=Verify.ROCKETMQ).commit_pos == 172
    with pytest.raises(CorruptRecordError):
        log.read_at(172)  # no __CRC32C property: not an mqstore record
    log.close()
