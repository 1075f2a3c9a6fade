"""engine.formats.record.structure: one set of structural rules, its scalar and vector forms agree.

For each rule a record breaking it: decode_record (the scalar form) names the rule, and
frame_many (the vector form) and verify_spans refuse the same record; v1, v2 and IPv6-host
records pass both.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from engine.errors import CorruptRecordError
from engine.formats.record import (
    BODY_LENGTH_OFFSET,
    BODY_OFFSET,
    MAGIC_OFFSET,
    MAGIC_V1,
    MAGIC_V2,
    PHYSICAL_OFFSET_OFFSET,
    SysFlag,
    Verify,
    decode_header,
    decode_record,
    encode_record,
    stamp_record,
)
from engine.formats.record.spans import verify_spans
from engine.formats.record.structure import frame_many
from tests.formats.test_record_scalar import hand_built

BASE_POS = 4096


def stamped(topic: str = "T1", body: bytes = b"hello") -> bytearray:
    raw = encode_record(topic, body, queue_id=1, properties={"KEYS": "k"}, born_ts_ms=1,
                        born_host=("127.0.0.1", 1), store_host=("127.0.0.1", 2))
    stamp_record(raw, 0, queue_offset=0, commit_pos=BASE_POS, store_ts_ms=5)
    return raw


def put(raw: bytearray, offset: int, fmt: str, value) -> bytearray:
    struct.pack_into(fmt, raw, offset, value)
    return raw


def topic_len_at(raw: bytearray) -> int:
    return BODY_OFFSET + struct.unpack_from(">i", raw, BODY_LENGTH_OFFSET)[0]


BROKEN = {  # rule: (how to break a stamped record, words of decode_record's reason)
    "TOTAL_SIZE": (lambda r: put(r, 0, ">i", len(r) + 1), "TOTALSIZE"),
    "MAGIC": (lambda r: put(r, MAGIC_OFFSET, ">I", 0x12345678), "magic"),
    "POSITION": (lambda r: put(r, PHYSICAL_OFFSET_OFFSET, ">q", BASE_POS + 1), "PHYSICALOFFSET"),
    "BODY_LENGTH negative": (lambda r: put(r, BODY_LENGTH_OFFSET, ">i", -1), "BODYLENGTH"),
    "BODY_LENGTH leaves no PROPERTIESLENGTH": (
        lambda r: put(r, BODY_LENGTH_OFFSET, ">i", len(r) - BODY_OFFSET - 2), "BODYLENGTH"),
    "TOPIC_LENGTH zero": (lambda r: put(r, topic_len_at(r), ">b", 0), "TOPICLENGTH 0 names no topic"),
    "TOPIC_LENGTH negative": (lambda r: put(r, topic_len_at(r), ">b", -3), "TOPICLENGTH"),
    "TOPIC_LENGTH too long": (lambda r: put(r, topic_len_at(r), ">b", 120), "TOPICLENGTH 120 does not fit"),
    "PROPERTIES_LENGTH": (lambda r: put(r, topic_len_at(r) + 3, ">h", 5), "PROPERTIESLENGTH 5 does not fit"),
}


@pytest.mark.parametrize("rule", sorted(BROKEN))
def test_each_rule_is_refused_by_both_forms(rule):
    breaks, words = BROKEN[rule]
    raw = bytes(breaks(stamped()))
    with pytest.raises(CorruptRecordError, match=words):
        decode_header(raw, 0, base_pos=BASE_POS)
    frame = frame_many(np.frombuffer(raw, dtype=np.uint8), np.array([0]), BASE_POS)
    assert not frame.framed[0]
    assert verify_spans(raw, np.array([0]), BASE_POS, Verify.STRUCTURE).count == 0


def test_a_sound_record_passes_both_forms():
    raw = bytes(stamped())
    assert decode_header(raw, 0, base_pos=BASE_POS).topic == "T1"
    frame = frame_many(np.frombuffer(raw, dtype=np.uint8), np.array([0]), BASE_POS)
    assert frame.framed[0] and int(frame.ends[0]) == len(raw)
    assert verify_spans(raw, np.array([0]), BASE_POS, Verify.MQSTORE).count == 1


@pytest.mark.parametrize("magic,flags", [
    (MAGIC_V1, 0), (MAGIC_V2, 0), (MAGIC_V1, SysFlag.BORNHOST_V6),
    (MAGIC_V2, SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6),
])
def test_v2_and_ipv6_records_frame_where_the_scalar_form_reads_them(magic, flags):
    born = ("::1", 7) if flags & SysFlag.BORNHOST_V6 else ("10.0.0.1", 7)
    store = ("fe80::1", 9) if flags & SysFlag.STOREHOST_V6 else ("10.0.0.2", 9)
    raw = hand_built(magic, int(flags), born, store, commit_pos=BASE_POS)
    got = decode_record(raw, 0, verify=Verify.ROCKETMQ, base_pos=BASE_POS)
    frame = frame_many(np.frombuffer(raw, dtype=np.uint8), np.array([0]), BASE_POS)
    assert frame.framed[0]
    assert int(frame.body_pos[0]) == len(raw) - len(got.body) - len(got.topic) - 2 - 8 - (
        2 if magic == MAGIC_V2 else 1)
    assert int(frame.topic_len[0]) == len(got.topic) and int(frame.body_len[0]) == len(got.body)


def test_a_record_without_a_topic_is_corrupt():
    """TOPICLENGTH 0 with lengths that add up: RocketMQ never writes one, and the supervisor
    refuses one from a producer; the reader refuses it too (it decoded it as topic '' before)."""
    raw = hand_built(MAGIC_V1, 0, ("10.0.0.1", 7), ("10.0.0.2", 9), commit_pos=BASE_POS, topic=b"")
    with pytest.raises(CorruptRecordError, match="TOPICLENGTH 0"):
        decode_record(raw, 0, verify=Verify.STRUCTURE, base_pos=BASE_POS)
    assert not frame_many(np.frombuffer(raw, dtype=np.uint8), np.array([0]), BASE_POS).framed[0]
