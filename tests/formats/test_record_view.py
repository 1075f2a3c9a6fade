"""engine.formats.record.view: columns gathered at record positions equal the reference decoder's
fields, a position is `framed` exactly where decode_record accepts a record's structure, and
entry_mismatches names the records that are not what their consume-queue entries say."""

from __future__ import annotations

import random

import numpy as np
import pytest

from engine.errors import CorruptRecordError
from engine.formats.record import (
    MAGIC_V1,
    MAGIC_V2,
    Filler,
    SysFlag,
    Verify,
    decode_record,
    encode_record,
    stamp_record,
)
from engine.formats.record.view import entry_mismatches, gather_records
from tests.formats.test_record_scalar import hand_built

BASE_POS = 1 << 20


def log_of(records: list[bytearray]) -> tuple[bytearray, np.ndarray]:
    """Encoded records end to end, stamped as at commit position BASE_POS; the buffer ends with
    the last record (no slack: gathers near the end must not fail)."""
    buf, starts = bytearray(), []
    for i, record in enumerate(records):
        starts.append(len(buf))
        buf += record
        stamp_record(buf, starts[-1], queue_offset=i, commit_pos=BASE_POS + starts[-1],
                     store_ts_ms=900 + i)
    return buf, np.array(starts, dtype=np.int64)


def v1(i: int, topic: str = "TopicA", queue_id: int = 3) -> bytearray:
    props = {"KEYS": f"k{i} j{i}", "TAGS": "tag", "UNIQ_KEY": f"U{i:030d}"} if i % 3 else None
    return encode_record(topic, bytes([i % 251]) * (i * 7 % 300), queue_id=queue_id, properties=props,
                         born_ts_ms=10 + i, born_host=("10.1.2.3", 4000 + i), store_host=("10.9.9.9", 10911),
                         flag=i - 5, sys_flag=(i % 2) * int(SysFlag.MULTI_TAGS))


def test_columns_equal_the_reference_decoder():
    buf, starts = log_of([v1(i) for i in range(300)])
    view = gather_records(bytes(buf), starts, BASE_POS)
    assert view.framed.all() and view.count == 300
    records = view.to_records(Verify.MQSTORE)
    for i, record in enumerate(records):
        assert bytes(view.body(i)) == record.body
        assert view.properties(i) == record.properties and view.topic(i) == record.topic
        row = [int(getattr(view, name)[i]) for name in ("commit_pos", "total_size", "queue_id",
                                                        "queue_offset", "store_ts_ms", "born_ts_ms",
                                                        "flag", "sys_flag")]
        assert row == [record.commit_pos, record.total_size, record.queue_id, record.queue_offset,
                       record.store_ts_ms, record.born_ts_ms, record.flag, record.sys_flag]
        assert int(view.body_len[i]) == len(record.body)
    rows, heads = view.body_prefix(4)
    assert rows.tolist() == [i for i, r in enumerate(records) if len(r.body) >= 4]
    assert [bytes(h) for h in heads] == [records[i].body[:4] for i in rows]


def test_v2_and_ipv6_records_are_located_like_the_reference():
    flags_v6 = SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6
    parts = [log_of([v1(1)])[0]]
    parts.append(hand_built(MAGIC_V2, flags_v6, ("::1", 7), ("fe80::1", 10911),
                            commit_pos=BASE_POS + len(parts[0])))
    at = len(parts[0]) + len(parts[1])
    parts.append(hand_built(MAGIC_V1, SysFlag.STOREHOST_V6, ("10.0.0.1", 1), ("2001:db8::9", 2),
                            commit_pos=BASE_POS + at))
    buf = b"".join(parts)
    starts = np.array([0, len(parts[0]), at], dtype=np.int64)
    view = gather_records(buf, starts, BASE_POS)
    assert view.framed.tolist() == [True, True, True]
    outside = gather_records(buf[len(parts[0]):], np.array([len(buf), -5, 0]), BASE_POS + len(parts[0]))
    assert outside.framed.tolist() == [False, False, True]  # an IPv6 record at 0 says nothing of them
    for i, record in enumerate(view.to_records(Verify.STRUCTURE)):
        assert (bytes(view.body(i)), view.topic(i), view.properties(i)) == (record.body, record.topic,
                                                                           record.properties)
        assert (int(view.store_ts_ms[i]), int(view.born_ts_ms[i])) == (record.store_ts_ms, record.born_ts_ms)


def test_framed_exactly_where_the_reference_accepts_the_structure():
    """Random byte flips: a position is framed iff decode_record (STRUCTURE) decodes a record there,
    or refuses only its text as not UTF-8 (the view decodes text when asked, not before)."""
    rng = random.Random(7)
    clean, starts = log_of([v1(i) for i in range(40)])
    for _ in range(300):
        buf = bytearray(clean)
        for _ in range(rng.choice((1, 2, 4))):
            buf[rng.randrange(len(buf))] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        positions = np.concatenate([starts, [len(buf) - 3, len(buf) + 50, -8, rng.randrange(len(buf))]])
        view = gather_records(bytes(buf), positions, BASE_POS)
        for i, pos in enumerate(positions.tolist()):
            try:
                got = decode_record(bytes(buf), pos, verify=Verify.STRUCTURE, base_pos=BASE_POS)
                accepted = pos >= 0 and not isinstance(got, Filler)
            except CorruptRecordError as exc:
                accepted = "not UTF-8" in exc.reason
            assert bool(view.framed[i]) == accepted, (pos, i)


def test_entry_mismatches_name_each_kind_of_difference():
    buf, starts = log_of([v1(i) for i in range(8)] + [v1(8, topic="TopicB"), v1(9, queue_id=2)])
    view = gather_records(bytes(buf), starts, BASE_POS)
    sizes = view.total_size.copy()
    offsets = np.arange(10)
    assert entry_mismatches(view, sizes, b"TopicA", 3, offsets).tolist() == [8, 9]
    sizes[2] += 1
    offsets[4] = 40
    assert entry_mismatches(view, sizes, b"TopicA", 3, offsets).tolist() == [2, 4, 8, 9]
    assert entry_mismatches(view, sizes, b"TopicAB", 3, offsets).tolist() == list(range(10))
    shifted = gather_records(bytes(buf), starts + 1, BASE_POS)
    assert not shifted.framed.any()
    assert "no sound record" in shifted.describe(0)
    assert "'TopicB'/3 offset 8" in view.describe(8)


@pytest.mark.parametrize("count", [0, 1])
def test_small_batches(count):
    buf, starts = log_of([v1(i) for i in range(count)])
    view = gather_records(bytes(buf) or bytes(1), starts, BASE_POS)
    assert view.count == count and view.framed.all()
    assert entry_mismatches(view, view.total_size, b"TopicA", 3, np.arange(count)).tolist() == []


def test_a_buffer_too_short_for_a_header_frames_nothing():
    view = gather_records(b"\x00" * 20, np.array([0, 5]), BASE_POS)
    assert view.framed.tolist() == [False, False]


@pytest.mark.parametrize("props", [
    b"TAGS\x01A\x02", b"KEYS\x01k\x02TAGS\x01BB\x02", b"TAGS\x01A\x02TAGS\x01Aa",
    b"TAGS\x01Aa\x02TAGS\x01A\x02", b"XTAGS\x01A\x02", b"KEYS\x01TAGS\x01A\x02",
    b"TAGS\x01A\x02TAGS\x01\x02", b"TAGS\x01\x02", b"",
    b"TAGS\x01AB\x02", b"UNIQ_KEY\x01u\x02TAGS\x01A",
    # a dangling name, completed by the next record's bytes: the match must not run past its record
    (b"TAGS\x01A\x02TAGS", b"\x01B\x02"), (b"TAGS\x01A\x02TAG", b"S\x01B\x02"),
])
def test_property_in_reads_tags_as_the_decoder_does(props):
    hosts = (("1.2.3.4", 5), ("1.2.3.4", 6))
    buf, starts = bytearray(), []
    for p in props if isinstance(props, tuple) else (props, b"TAGS\x01A"):
        starts.append(len(buf))
        buf += hand_built(MAGIC_V1, 0, *hosts, props=p, commit_pos=len(buf))
    view = gather_records(bytes(buf), np.array(starts, dtype=np.int64), 0)
    wanted = frozenset({b"A", b"B", b"BB"})
    decoded = [decode_record(bytes(buf), s, verify=Verify.STRUCTURE).tags for s in starts]
    expected = [t is not None and t.encode() in wanted for t in decoded]
    mask, undecodable = view.property_in(b"TAGS", wanted)
    assert mask.tolist() == expected and undecodable.tolist() == []


def test_property_in_reports_properties_it_cannot_decode():
    """A row the decoder must decide (its last TAGS has no value) whose bytes are not UTF-8 is
    reported, not raised: the other rows are still decided."""
    hosts = (("1.2.3.4", 5), ("1.2.3.4", 6))
    buf, starts = bytearray(), []
    for p in (b"TAGS\x01A\x02K\x01\xff\x02TAGS\x01\x02", b"TAGS\x01A"):
        starts.append(len(buf))
        buf += hand_built(MAGIC_V1, 0, *hosts, props=p, commit_pos=len(buf))
    view = gather_records(bytes(buf), np.array(starts, dtype=np.int64), 0)
    mask, undecodable = view.property_in(b"TAGS", frozenset({b"A"}))
    assert mask.tolist() == [False, True] and undecodable.tolist() == [0]
