"""mqstore's codecs read files that Apache RocketMQ itself wrote (shared/data/rocketmq-samples).

The sample files sit beside the repository; if they are missing these tests fail, they never skip.
"""

from __future__ import annotations

import struct
import zlib

import pytest

from engine.errors import CheckpointError, CorruptRecordError
from engine.formats import record as rec
from engine.formats.checkpoint import decode_checkpoint, decode_rocketmq_checkpoint, is_rocketmq_checkpoint
from engine.formats.crc32c_property import CRC32C_PROP_SIZE
from engine.formats.java_hash import java_string_hash
from engine.formats.record import (
    MAGIC_V1,
    Filler,
    Record,
    RecordHeader,
    Verify,
    decode_header,
    decode_record,
    encode_record,
    stamp_record,
)
from tests.conftest import ROCKETMQ_SAMPLES

SAMPLES = ROCKETMQ_SAMPLES
STORES = ["store-2021", "store-2019"]
BODY = b"Once, there was a chance for me!"
RECORD_SIZE = 172
RECORD_COUNT = 47
FILLER_POS = RECORD_COUNT * RECORD_SIZE  # 8084
SEGMENT_SIZE = 8192


def read_segment(store: str) -> bytes:
    data = (SAMPLES / store / "commitlog" / "00000000000000000000").read_bytes()
    assert len(data) == SEGMENT_SIZE
    return data


def scan(data: bytes) -> tuple[list[Record], Filler]:
    """Decode records from position 0 until the end-of-file filler."""
    records: list[Record] = []
    pos = 0
    while True:
        got = decode_record(data, pos, verify=Verify.ROCKETMQ)
        if isinstance(got, Filler):
            return records, got
        records.append(got)
        pos = got.end_pos


@pytest.mark.parametrize("store", STORES)
def test_sample_commitlog_decodes_47_records(store):
    records, _ = scan(read_segment(store))
    assert len(records) == RECORD_COUNT
    for n, got in enumerate(records):
        assert (got.topic, got.queue_id, got.queue_offset) == ("abc", 0, n)
        assert (got.total_size, got.commit_pos, got.magic) == (RECORD_SIZE, n * RECORD_SIZE, MAGIC_V1)
        assert got.body == BODY
        assert got.body_crc == zlib.crc32(BODY) & 0x7FFFFFFF
        assert got.tags == "TAG1" and got.tags_code == java_string_hash("TAG1")
        assert got.properties["0"] == "imagoodperson0"
        assert len(got.keys) == 1 and got.keys[0].isdigit() and len(got.keys[0]) == 13
        assert got.stored_crc32c is None  # RocketMQ writes no __CRC32C property
        assert got.store_host[1] == 8123 and got.born_host[0] == "127.0.0.1"
    assert [r.store_ts_ms for r in records] == sorted(r.store_ts_ms for r in records)


@pytest.mark.parametrize("store", STORES)
def test_sample_commitlog_ends_with_filler_then_zeros(store):
    data = read_segment(store)
    _, filler = scan(data)
    assert filler == Filler(pos=FILLER_POS, size=SEGMENT_SIZE - FILLER_POS)
    assert filler.end_pos == SEGMENT_SIZE
    with pytest.raises(CorruptRecordError, match="unwritten") as info:
        decode_record(data, FILLER_POS + rec.FILLER_SIZE, verify=Verify.ROCKETMQ)
    assert info.value.pos == FILLER_POS + rec.FILLER_SIZE


@pytest.mark.parametrize("store", STORES)
def test_sample_headers_match_records(store):
    data = read_segment(store)
    records, _ = scan(data)
    for got in records:
        header = decode_header(data, got.commit_pos)
        assert isinstance(header, RecordHeader)
        assert (header.topic, header.queue_offset, header.commit_pos, header.total_size) == (
            got.topic, got.queue_offset, got.commit_pos, got.total_size)
        assert (header.tags_code, header.keys) == (got.tags_code, got.keys)
        assert header.store_ts_ms == got.store_ts_ms
        assert rec.store_ts_at(data, got.commit_pos) == got.store_ts_ms
    assert isinstance(decode_header(data, FILLER_POS), Filler)


def test_sample_record_fails_mqstore_verify_without_crc32c():
    data = read_segment("store-2021")
    with pytest.raises(CorruptRecordError, match="__CRC32C"):
        decode_record(data, 0, verify=Verify.MQSTORE)


def test_sample_body_damage_is_caught_by_bodycrc():
    data = bytearray(read_segment("store-2021"))
    data[RECORD_SIZE + rec.BODY_OFFSET] ^= 0x01
    with pytest.raises(CorruptRecordError, match="BODYCRC"):
        decode_record(data, RECORD_SIZE, verify=Verify.ROCKETMQ)


@pytest.mark.parametrize("store", STORES)
def test_encoder_reproduces_rocketmq_bytes(store):
    """Re-encode a sample record's content: every byte matches except our 20-byte CRC32C tail."""
    data = read_segment(store)
    got = decode_record(data, RECORD_SIZE, verify=Verify.ROCKETMQ)
    ours = encode_record(got.topic, got.body, queue_id=got.queue_id, properties=got.properties,
                         born_ts_ms=got.born_ts_ms, born_host=got.born_host, store_host=got.store_host)
    stamp_record(ours, 0, queue_offset=got.queue_offset, commit_pos=got.commit_pos,
                 store_ts_ms=got.store_ts_ms)
    theirs = data[RECORD_SIZE : RECORD_SIZE + RECORD_SIZE]
    props_len_pos = RECORD_SIZE - 2 - 46  # 46 bytes of properties in the sample
    assert struct.unpack_from(">h", theirs, props_len_pos)[0] == 46
    assert struct.unpack_from(">i", ours, 0)[0] == RECORD_SIZE + CRC32C_PROP_SIZE
    assert ours[4:props_len_pos] == theirs[4:props_len_pos]
    assert struct.unpack_from(">h", ours, props_len_pos)[0] == 46 + CRC32C_PROP_SIZE
    assert ours[props_len_pos + 2 : RECORD_SIZE] == theirs[props_len_pos + 2 :]
    assert decode_record(ours, base_pos=RECORD_SIZE).properties == got.properties


def test_sample_checkpoint_rocketmq_fields():
    raw = (SAMPLES / "store-2019" / "checkpoint").read_bytes()
    assert is_rocketmq_checkpoint(raw)
    cp = decode_rocketmq_checkpoint(raw)
    assert cp.physic_msg_ts_ms > 1_500_000_000_000 and cp.logics_msg_ts_ms > 1_500_000_000_000
    assert cp.physic_msg_ts_ms == struct.unpack_from(">q", raw, 0)[0]
    assert cp.logics_msg_ts_ms == struct.unpack_from(">q", raw, 8)[0]
    assert cp.min_timestamp_ms == min(cp.physic_msg_ts_ms, cp.logics_msg_ts_ms) - 3000
    assert cp.index_durable_pos == () and cp.commitlog_flushed_pos == 0
    with pytest.raises(CheckpointError, match="RocketMQ"):
        decode_checkpoint(raw)
