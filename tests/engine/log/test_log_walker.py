"""engine.log.walker: the one walk of records over a buffer and its stop rules in every form
(the scanners taking windows, not the CommitLog class, is held by tests/test_layers.py)."""

from __future__ import annotations

import pytest

from engine.errors import CorruptRecordError
from engine.formats.record import (
    RECORD_FIXED_SIZE,
    Filler,
    Record,
    RecordHeader,
    Verify,
    encode_filler,
    encode_record,
    stamp_record,
)
from engine.log.walker import (
    BadRegion,
    HopEnd,
    LogWindow,
    NeedBytes,
    OnBadBytes,
    Stop,
    header_decoder,
    hop_heads,
    is_filler_head,
    record_decoder,
    resync,
    step,
    step_run,
    walk,
)

SEG = 8192
BASE = 3 * SEG  # the segment's commit position: records hold it in PHYSICALOFFSET
CRC_TAIL = 20  # the __CRC32C property every record carries


def segment(sizes: list[int], filler: bool = False) -> tuple[bytearray, list[int]]:
    """A segment image holding records of `sizes` from its start (then a filler), and their
    commit positions."""
    buf = bytearray(SEG)
    pos, starts = 0, []
    for i, size in enumerate(sizes):
        rec = encode_record("T", b"x" * (size - RECORD_FIXED_SIZE - 1 - CRC_TAIL), queue_id=0,
                            born_ts_ms=1, born_host=("127.0.0.1", 1), store_host=("127.0.0.1", 2))
        buf[pos:pos + len(rec)] = rec
        stamp_record(buf, pos, queue_offset=i, commit_pos=BASE + pos, store_ts_ms=10 + i)
        starts.append(BASE + pos)
        pos += len(rec)
    if filler:
        buf[pos:pos + 8] = encode_filler(SEG - pos)
    return buf, starts


def whole(buf) -> LogWindow:
    return LogWindow(memoryview(buf), BASE, BASE + SEG, "seg")


def items(window: LogWindow, pos: int, end: int, on_bad=OnBadBytes.RAISE) -> list:
    return list(walk(window, pos, end, record_decoder(Verify.MQSTORE), Verify.MQSTORE, on_bad))


def test_walk_yields_records_then_the_filler_that_ends_the_segment():
    buf, starts = segment([200, 300, 250], filler=True)
    out = items(whole(buf), BASE, BASE + 10 * SEG)
    assert [r.commit_pos for r in out[:3]] == starts
    assert out[3] == Filler(starts[2] + 250, BASE + SEG - starts[2] - 250)
    assert len(out) == 4  # a filler hands the walk to the next segment


def test_walk_stops_at_zeros_and_before_a_record_crossing_the_end():
    buf, starts = segment([200, 300])
    assert items(whole(buf), BASE, BASE + SEG)[-1] is Stop.UNWRITTEN
    assert items(whole(buf), BASE, starts[1] + 299) == [*items(whole(buf), BASE, starts[1])[:1],
                                                       Stop.CROSSES_END]
    assert step(whole(buf), starts[1], starts[1], header_decoder) is Stop.END
    assert step(whole(buf), BASE + SEG, BASE + 2 * SEG, header_decoder) is Stop.SEGMENT_END


def test_a_filler_of_the_wrong_size_is_corrupt():
    buf, _ = segment([200])
    buf[200:208] = encode_filler(SEG - 200 - 8)
    with pytest.raises(CorruptRecordError, match="filler of") as info:
        step(whole(buf), BASE + 200, BASE + SEG, header_decoder)
    assert info.value.pos == BASE + 200


def test_a_pread_block_asks_for_more_bytes_where_a_record_runs_past_it():
    buf, starts = segment([200, 300, 250], filler=True)
    block = LogWindow(bytes(buf[200:400]), BASE + 200, BASE + SEG)  # the second record's first 200 bytes
    assert step(block, starts[1], BASE + SEG, header_decoder) == NeedBytes(starts[1], 300)
    tail = LogWindow(bytes(buf[500:504]), BASE + 500, BASE + SEG)  # not even a whole head
    assert step(tail, starts[2], BASE + SEG, header_decoder) == NeedBytes(starts[2], 8)
    reread = LogWindow(bytes(buf[200:500]), BASE + 200, BASE + SEG)
    assert isinstance(step(reread, starts[1], BASE + SEG, header_decoder), RecordHeader)
    buf[500:508] = b"\x00\x00\x10\x00GARB"  # garbage claiming 4096 bytes: reported, not read
    with pytest.raises(CorruptRecordError, match="unknown magic"):
        step(LogWindow(bytes(buf[500:520]), BASE + 500, BASE + SEG), starts[2], BASE + SEG, header_decoder)
    filler_only = LogWindow(bytes(buf[750:758]), BASE + 750, BASE + SEG)  # the filler's 8 bytes suffice
    assert step(filler_only, BASE + 750, BASE + 2 * SEG, header_decoder) == Filler(BASE + 750, SEG - 750)


def test_batch_and_record_forms_stop_at_the_same_place():
    buf, starts = segment([200] * 12 + [300], filler=True)
    window = whole(buf)
    for end in (BASE + SEG, starts[5], starts[12] + 299, starts[12] + 300):
        spans = step_run(window, BASE, end, Verify.MQSTORE, 1 << 20)
        records = [r for r in items(window, BASE, end) if isinstance(r, Record)]
        assert (BASE + spans.starts).tolist() == [r.commit_pos for r in records]
    assert step_run(window, starts[12] + 300, BASE + SEG, Verify.MQSTORE, 1 << 20) is None  # the filler


def test_resync_goes_past_bad_bytes_to_the_next_record():
    buf, starts = segment([200, 300, 250])
    buf[210] ^= 0xFF  # the second record's CRC fails; its TOTALSIZE still claims 300 bytes
    out = items(whole(buf), BASE, BASE + SEG, OnBadBytes.RESYNC)
    assert [type(x) for x in out] == [Record, BadRegion, Record, Stop]
    assert (out[1].start_pos, out[1].resume_pos) == (starts[1], starts[2])
    with pytest.raises(CorruptRecordError):
        items(whole(buf), BASE, BASE + SEG)
    buf[200:204] = b"\x7f\xff\x00\x00"  # a lying TOTALSIZE: found again by the next magic
    region = resync(whole(buf), starts[1], CorruptRecordError("x", pos=starts[1], size=0x7fff0000),
                    BASE + SEG, Verify.MQSTORE)
    assert region.resume_pos == starts[2]


def test_resync_without_a_record_after_runs_to_the_limit():
    buf, starts = segment([200, 300])
    buf[200:208] = b"\x01" * 8
    out = items(whole(buf), BASE, BASE + 2 * SEG, OnBadBytes.RESYNC)
    assert out[1] == BadRegion(starts[1], BASE + SEG, out[1].reason, "seg")
    assert out[-1] is Stop.SEGMENT_END


def test_hop_heads_follows_the_chain_across_blocks():
    buf, starts = segment([200, 300, 250, 400], filler=True)
    assert hop_heads(whole(buf), BASE, starts[2] + 1) == (starts[3], HopEnd.REACHED)
    assert hop_heads(whole(buf), BASE, BASE + SEG) == (starts[3] + 400, HopEnd.CHAIN_END)
    block = LogWindow(bytes(buf[:600]), BASE, BASE + SEG)
    assert hop_heads(block, BASE, BASE + SEG) == (starts[3], HopEnd.WINDOW_END)
    assert is_filler_head(whole(buf), starts[3] + 400) and not is_filler_head(whole(buf), BASE)
