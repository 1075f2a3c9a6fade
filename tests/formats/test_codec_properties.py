"""Hypothesis properties: every codec round-trips, and damage to a stamped record is always seen."""

from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import CheckpointError, CorruptRecordError
from engine.formats.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
from engine.formats.cq_entry import CqEntry, decode_cq_entries, decode_cq_entry, encode_cq_entry
from engine.formats.index_file import (
    IndexEntry,
    IndexHeader,
    decode_index_entry,
    decode_index_header,
    encode_index_entry,
    encode_index_header,
)
from engine.formats.java_hash import java_string_hash
from engine.formats.properties import decode_properties, encode_properties
from engine.formats.record import Record, Verify, decode_header, decode_record, encode_record, stamp_record

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
POS = st.integers(0, 2**62)
TOPICS = st.text(string.ascii_letters + string.digits + "_%|-", min_size=1, max_size=127)
PROP_CHARS = st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",))
PROP_TEXT = st.text(PROP_CHARS, min_size=1, max_size=30)
PROPS = st.dictionaries(PROP_TEXT.filter(lambda k: k != "__CRC32C"), PROP_TEXT, max_size=6)
HOSTS = st.tuples(st.ip_addresses(v=4).map(str), st.integers(0, 2**31 - 1))
FAST = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def rocketmq_string2properties(text: str) -> dict[str, str]:
    """MessageDecoder.string2messageProperties transcribed index by index (the Java oracle)."""
    out: dict[str, str] = {}
    index, length = 0, len(text)
    while index < length:
        new_index = text.find("\x02", index)
        if new_index < 0:
            new_index = length
        if new_index - index >= 3:
            kv_sep = text.find("\x01", index)
            if index < kv_sep < new_index - 1:
                out[text[index:kv_sep]] = text[kv_sep + 1 : new_index]
        index = new_index + 1
    return out


def slow_java_hash(s: str) -> int:
    raw = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(raw), 2):
        h = (31 * h + int.from_bytes(raw[i : i + 2], "big")) & 0xFFFFFFFF
    return h - 2**32 if h >= 2**31 else h


@st.composite
def stamped_records(draw):
    """(buffer, record position in it, base_pos, the inputs) for a random stamped record."""
    inputs = {
        "topic": draw(TOPICS), "body": draw(st.binary(max_size=4096)), "properties": draw(PROPS),
        "queue_id": draw(st.integers(0, 2**31 - 1)), "flag": draw(INT32),
        "born_ts_ms": draw(st.integers(0, 2**63 - 1)), "born_host": draw(HOSTS), "store_host": draw(HOSTS),
        "reconsume_times": draw(st.integers(0, 2**31 - 1)),
    }
    stamp = {"queue_offset": draw(INT64), "store_ts_ms": draw(INT64)}
    lead = draw(st.integers(0, 64))
    base_pos = draw(st.integers(0, 2**50))
    buf = bytearray(lead) + encode_record(inputs.pop("topic"), inputs.pop("body"), **inputs) + bytearray(
        draw(st.integers(0, 32)))
    stamp_record(buf, lead, commit_pos=base_pos + lead, **stamp)
    return buf, lead, base_pos


@FAST
@given(data=st.data(), topic=TOPICS, body=st.binary(max_size=4096), props=PROPS,
       queue_id=st.integers(0, 2**31 - 1), queue_offset=INT64, commit_pos=POS, store_ts_ms=INT64,
       born_ts_ms=st.integers(0, 2**63 - 1), born_host=HOSTS, store_host=HOSTS, flag=INT32)
def test_record_round_trip(data, topic, body, props, queue_id, queue_offset, commit_pos, store_ts_ms,
                           born_ts_ms, born_host, store_host, flag):
    buf = encode_record(topic, body, queue_id=queue_id, properties=props, born_ts_ms=born_ts_ms,
                        born_host=born_host, store_host=store_host, flag=flag)
    lead = data.draw(st.integers(0, min(commit_pos, 100)))
    seg = bytearray(lead) + buf
    stamp_record(seg, lead, queue_offset=queue_offset, commit_pos=commit_pos, store_ts_ms=store_ts_ms)
    got = decode_record(seg, lead, base_pos=commit_pos - lead)
    assert isinstance(got, Record)
    assert (got.topic, got.body, got.properties) == (topic, body, props)
    assert (got.queue_id, got.flag) == (queue_id, flag)
    assert (got.queue_offset, got.commit_pos, got.store_ts_ms) == (queue_offset, commit_pos, store_ts_ms)
    assert (got.born_ts_ms, got.born_host, got.store_host) == (born_ts_ms, born_host, store_host)
    header = decode_header(seg, lead, base_pos=commit_pos - lead)
    assert (header.topic, header.total_size, header.tags_code) == (topic, len(buf), got.tags_code)


@FAST
@given(case=stamped_records(), data=st.data())
def test_any_single_byte_change_is_detected(case, data):
    buf, lead, base_pos = case
    total = int.from_bytes(buf[lead : lead + 4], "big")
    at = lead + data.draw(st.integers(0, total - 1), label="byte")
    new_value = data.draw(st.integers(0, 255).filter(lambda v: v != buf[at]), label="value")
    buf[at] = new_value
    with pytest.raises(CorruptRecordError):
        decode_record(buf, lead, base_pos=base_pos, verify=Verify.MQSTORE)


@given(props=PROPS)
def test_properties_round_trip(props):
    assert decode_properties(encode_properties(props)) == props


@given(text=st.text(st.sampled_from("ab\x01\x02é"), max_size=40))
def test_properties_decoder_matches_rocketmq_parser(text):
    assert decode_properties(text.encode()) == rocketmq_string2properties(text)


@given(s=st.text(max_size=200))
def test_java_hash_matches_utf16_reference(s):
    assert java_string_hash(s) == slow_java_hash(s)


@given(cp=st.builds(Checkpoint, physic_msg_ts_ms=INT64, logics_msg_ts_ms=INT64, index_msg_ts_ms=INT64,
                    master_flushed_offset=INT64, confirm_commit_pos=INT64, commitlog_flushed_pos=INT64,
                    cq_durable_pos=INT64, index_durable_pos=st.lists(INT64, max_size=64).map(tuple)))
def test_checkpoint_round_trip(cp):
    raw = encode_checkpoint(cp)
    assert decode_checkpoint(raw) == cp


@given(cp=st.builds(Checkpoint, commitlog_flushed_pos=POS,
                    index_durable_pos=st.lists(POS, max_size=8).map(tuple)), data=st.data())
def test_checkpoint_damage_is_detected(cp, data):
    raw = bytearray(encode_checkpoint(cp))
    at = data.draw(st.integers(0, 96 + 8 * len(cp.index_durable_pos) + 3))
    raw[at] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CheckpointError):
        decode_checkpoint(bytes(raw))


@given(entries=st.lists(st.tuples(INT64, INT32, INT64), max_size=50))
def test_cq_entries_round_trip(entries):
    buf = b"".join(encode_cq_entry(*e) for e in entries)
    assert [decode_cq_entry(buf, i * 20) for i in range(len(entries))] == [CqEntry(*e) for e in entries]
    arr = decode_cq_entries(buf)
    assert list(zip(arr["commit_pos"].tolist(), arr["size"].tolist(), arr["tags_code"].tolist(),
                    strict=True)) == entries


@given(entry=st.builds(IndexEntry, INT32, INT64, INT32, INT32),
       header=st.builds(IndexHeader, INT64, INT64, INT64, INT64, INT32, INT32))
def test_index_round_trips(entry, header):
    assert decode_index_entry(encode_index_entry(entry), 0) == entry
    assert decode_index_header(encode_index_header(header)) == header
