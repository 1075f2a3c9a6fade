"""Commitlog record codec: byte layout, stamping, verification levels, fillers, uniq keys."""

from __future__ import annotations

import os
import socket
import struct
import zlib

import crc32c
import pytest

from engine.errors import BadInputError, CorruptRecordError
from engine.formats import record as rec
from engine.formats.crc32c_property import CRC32C_PROP_SIZE
from engine.formats.java_hash import java_string_hash
from engine.formats.msg_id import make_msg_id
from engine.formats.record import (
    BLANK_MAGIC,
    FILLER_SIZE,
    MAGIC_V1,
    MAGIC_V2,
    RECORD_FIXED_SIZE,
    Filler,
    Record,
    RecordHeader,
    SysFlag,
    TxType,
    Verify,
    decode_header,
    decode_record,
    encode_filler,
    encode_record,
    stamp_record,
    store_ts_at,
    tx_type,
)
from engine.formats.uniq_key import new_uniq_key

BORN = ("127.0.0.1", 4242)
STORE = ("127.0.0.1", 10911)
MILLIS = "1632821159368"


def make(topic="FooBar", body=b"b" * 32, *, props=None, queue_id=3, queue_offset=7, commit_pos=0,
         store_ts_ms=1_700_000_000_123, **kwargs) -> bytearray:
    """An encoded and stamped record."""
    props = {"TAGS": "TAG1", "KEYS": MILLIS} if props is None else props
    buf = encode_record(topic, body, queue_id=queue_id, properties=props, born_ts_ms=1_700_000_000_000,
                        born_host=BORN, store_host=STORE, **kwargs)
    stamp_record(buf, 0, queue_offset=queue_offset, commit_pos=commit_pos, store_ts_ms=store_ts_ms)
    return buf


def rocketmq_v1_bytes(topic: bytes, body: bytes, props: bytes, *, queue_id: int, queue_offset: int,
                      commit_pos: int, born_ts_ms: int, store_ts_ms: int) -> bytes:
    """Reference §1.1 built by hand from literal field formats (an oracle independent of the codec)."""
    fixed = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + 4 + 1 + 2
    total = fixed + len(body) + len(topic) + len(props)
    return (struct.pack(">i", total) + struct.pack(">I", 0xDAA320A7)
            + struct.pack(">i", zlib.crc32(body) & 0x7FFFFFFF) + struct.pack(">i", queue_id)
            + struct.pack(">i", 0) + struct.pack(">q", queue_offset) + struct.pack(">q", commit_pos)
            + struct.pack(">i", 0) + struct.pack(">q", born_ts_ms)
            + socket.inet_aton(BORN[0]) + struct.pack(">i", BORN[1]) + struct.pack(">q", store_ts_ms)
            + socket.inet_aton(STORE[0]) + struct.pack(">i", STORE[1])
            + struct.pack(">i", 0) + struct.pack(">q", 0) + struct.pack(">i", len(body)) + body
            + struct.pack(">b", len(topic)) + topic + struct.pack(">h", len(props)) + props)


# ---------------------------------------------------------------- layout


def test_layout_constants_match_reference():
    assert (MAGIC_V1, MAGIC_V2, BLANK_MAGIC) == (0xDAA320A7, 0xDAA320AB, 0xCBD43194)
    assert (RECORD_FIXED_SIZE, FILLER_SIZE, CRC32C_PROP_SIZE) == (91, 8, 20)
    assert (rec.QUEUE_OFFSET_OFFSET, rec.PHYSICAL_OFFSET_OFFSET, rec.SYS_FLAG_OFFSET) == (20, 28, 36)
    assert (rec.STORE_TS_OFFSET, rec.BODY_LENGTH_OFFSET, rec.BODY_OFFSET) == (56, 84, 88)


def test_worked_example_total_size_is_158_plus_crc_property():
    buf = make()
    assert len(buf) == 178
    assert struct.unpack_from(">i", buf, 0)[0] == 178
    body_len = struct.unpack_from(">i", buf, rec.BODY_LENGTH_OFFSET)[0]
    topic_len = buf[rec.BODY_OFFSET + body_len]
    props_len = struct.unpack_from(">h", buf, rec.BODY_OFFSET + body_len + 1 + topic_len)[0]
    assert (body_len, topic_len, props_len) == (32, 6, 29 + CRC32C_PROP_SIZE)
    assert 178 - CRC32C_PROP_SIZE == 91 + 32 + 6 + 29 == 158


def test_encoded_record_is_rocketmq_v1_byte_for_byte():
    buf = make(queue_offset=7, commit_pos=0, store_ts_ms=1_700_000_000_123)
    props = b"TAGS\x01TAG1\x02KEYS\x01" + MILLIS.encode() + b"\x02"
    crc_tail = b"__CRC32C\x01" + b"%010d" % crc32c.crc32c(bytes(buf[:-20])) + b"\x02"
    expected = rocketmq_v1_bytes(b"FooBar", b"b" * 32, props + crc_tail, queue_id=3, queue_offset=7,
                                 commit_pos=0, born_ts_ms=1_700_000_000_000, store_ts_ms=1_700_000_000_123)
    assert bytes(buf) == expected


def test_encode_leaves_stamp_fields_zero_and_reserves_crc():
    buf = encode_record("t", b"x", queue_id=0, born_ts_ms=1, born_host=BORN, store_host=STORE)
    assert struct.unpack_from(">qq", buf, rec.QUEUE_OFFSET_OFFSET) == (0, 0)
    assert struct.unpack_from(">q", buf, rec.STORE_TS_OFFSET)[0] == 0
    assert bytes(buf[-20:]) == b"__CRC32C\x01" + b"0" * 10 + b"\x02"


def test_stamp_writes_fields_and_crc32c_digits_most_significant_first():
    buf = make(queue_offset=11, commit_pos=4096, store_ts_ms=123456)
    assert struct.unpack_from(">qq", buf, rec.QUEUE_OFFSET_OFFSET) == (11, 4096)
    assert struct.unpack_from(">q", buf, rec.STORE_TS_OFFSET)[0] == 123456
    crc = crc32c.crc32c(bytes(buf[:-20]))
    assert bytes(buf[-11:-1]) == str(crc).zfill(10).encode()


def test_stamp_in_a_larger_buffer_at_a_position():
    one = encode_record("t", b"hello", queue_id=1, born_ts_ms=1, born_host=BORN, store_host=STORE)
    seg = bytearray(1000)
    seg[300 : 300 + len(one)] = one
    stamp_record(memoryview(seg), 300, queue_offset=2, commit_pos=10_300, store_ts_ms=5)
    got = decode_record(seg, 300, base_pos=10_000)
    assert (got.commit_pos, got.queue_offset, got.store_ts_ms, got.body) == (10_300, 2, 5, b"hello")


def test_stamp_refuses_a_record_without_reserved_tail():
    buf = make()
    buf[-20:-11] = b"XXXXXXXXX"
    with pytest.raises(BadInputError):
        stamp_record(buf, 0, queue_offset=0, commit_pos=0, store_ts_ms=0)


# ---------------------------------------------------------------- round trip


def test_decode_round_trips_every_field():
    buf = make("TopicA", b"\x00payload\xff", props={"TAGS": "tg", "KEYS": "k1 k2", "UNIQ_KEY": "U" * 32},
               queue_id=5, queue_offset=99, commit_pos=0, store_ts_ms=777, flag=-3, sys_flag=0x8,
               reconsume_times=2)
    got = decode_record(buf)
    assert isinstance(got, Record)
    assert got.total_size == len(buf) and got.magic == MAGIC_V1
    assert got.body_crc == zlib.crc32(b"\x00payload\xff") & 0x7FFFFFFF
    assert (got.queue_id, got.flag, got.queue_offset, got.commit_pos) == (5, -3, 99, 0)
    assert (got.sys_flag, got.born_ts_ms, got.born_host) == (0x8, 1_700_000_000_000, BORN)
    assert (got.store_ts_ms, got.store_host) == (777, STORE)
    assert (got.reconsume_times, got.prepared_tx_offset) == (2, 0)
    assert (got.body, got.topic) == (b"\x00payload\xff", "TopicA")
    assert got.properties == {"TAGS": "tg", "KEYS": "k1 k2", "UNIQ_KEY": "U" * 32}
    assert got.stored_crc32c == crc32c.crc32c(bytes(buf[:-20]))
    assert (got.tags, got.keys, got.uniq_key) == ("tg", ("k1", "k2"), "U" * 32)
    assert got.tags_code == java_string_hash("tg")
    assert got.end_pos == len(buf)
    assert got.msg_id == make_msg_id(STORE, 0)
    assert tx_type(got.sys_flag) is TxType.COMMIT


def test_record_helpers_without_properties():
    got = decode_record(make(props={}))
    assert (got.tags, got.keys, got.uniq_key, got.tags_code, got.properties) == (None, (), None, 0, {})


def test_decode_header_matches_decode_record():
    buf = make(props={"TAGS": "tg", "KEYS": "a  b", "UNIQ_KEY": "U1"}, queue_offset=4, store_ts_ms=99)
    header = decode_header(buf)
    assert header == RecordHeader(total_size=len(buf), queue_id=3, queue_offset=4, commit_pos=0, sys_flag=0,
                                  store_ts_ms=99, topic="FooBar", tags_code=java_string_hash("tg"),
                                  keys=("a", "b"), uniq_key="U1")
    assert header.end_pos == len(buf)


def test_decode_header_skips_crc_but_checks_structure():
    buf = make()
    buf[rec.BODY_OFFSET] ^= 0xFF  # body damage: only the CRCs see it
    assert isinstance(decode_header(buf), RecordHeader)
    struct.pack_into(">i", buf, 0, len(buf) - 1)
    with pytest.raises(CorruptRecordError):
        decode_header(buf)


def test_store_ts_at_reads_ipv4_record():
    assert store_ts_at(make(store_ts_ms=31337), 0) == 31337


# ---------------------------------------------------------------- corruption


def test_every_single_byte_change_of_a_stamped_record_is_detected():
    buf = make()
    for pos in range(len(buf)):
        for xor in (0x01, 0x80, 0xFF):
            bad = bytearray(buf)
            bad[pos] ^= xor
            with pytest.raises(CorruptRecordError):
                decode_record(bad)


def test_single_byte_change_detected_inside_a_segment():
    seg = bytearray(512)
    one = make(commit_pos=1000 + 64)
    seg[64 : 64 + len(one)] = one
    assert decode_record(seg, 64, base_pos=1000).commit_pos == 1064
    for pos in range(64, 64 + len(one)):
        bad = bytearray(seg)
        bad[pos] ^= 0x10
        with pytest.raises(CorruptRecordError) as info:
            decode_record(bad, 64, base_pos=1000)
        assert info.value.pos == 1064


def test_rocketmq_verify_checks_crc32c_when_present():
    buf = make()
    buf[-25] ^= 0x01  # inside the KEYS value: BODYCRC cannot see it
    assert isinstance(decode_record(buf, verify=Verify.STRUCTURE), Record)
    with pytest.raises(CorruptRecordError, match="CRC32C"):
        decode_record(buf, verify=Verify.ROCKETMQ)


def test_body_damage_fails_bodycrc():
    buf = make()
    buf[rec.BODY_OFFSET + 3] ^= 0x01
    with pytest.raises(CorruptRecordError, match="BODYCRC"):
        decode_record(buf, verify=Verify.ROCKETMQ)


def test_missing_crc32c_is_corrupt_only_for_mqstore():
    buf = make()
    buf[-20:-11] = b"__CRC32X\x01"  # a different, ordinary property now
    assert isinstance(decode_record(buf, verify=Verify.ROCKETMQ), Record)
    with pytest.raises(CorruptRecordError, match="__CRC32C"):
        decode_record(buf, verify=Verify.MQSTORE)


def test_malformed_crc32c_property_is_corrupt_for_rocketmq_verify():
    buf = make()
    buf[-1:] = b"X"  # the tail no longer ends in 0x02, but the property is still there
    assert isinstance(decode_record(buf, verify=Verify.STRUCTURE), Record)
    with pytest.raises(CorruptRecordError, match="malformed __CRC32C"):
        decode_record(buf, verify=Verify.ROCKETMQ)


def test_physical_offset_must_equal_position():
    buf = make(commit_pos=500)
    assert decode_record(buf, base_pos=500).commit_pos == 500
    with pytest.raises(CorruptRecordError, match="PHYSICALOFFSET") as info:
        decode_record(buf, base_pos=0)
    assert info.value.pos == 0


def test_unwritten_zero_bytes_say_unwritten():
    with pytest.raises(CorruptRecordError, match="unwritten") as info:
        decode_record(bytes(64), 8, base_pos=100)
    assert info.value.pos == 108


def test_too_few_bytes_is_corrupt():
    with pytest.raises(CorruptRecordError):
        decode_record(b"\x00\x00\x00")


def test_torn_record_is_corrupt():
    buf = make()
    for cut in (8, 50, 100, len(buf) - 1):
        with pytest.raises(CorruptRecordError, match="TOTALSIZE"):
            decode_record(bytes(buf[:cut]), verify=Verify.STRUCTURE)


@pytest.mark.parametrize("total", [-5, 0, 90])
def test_bad_total_size_is_corrupt(total):
    buf = make()
    struct.pack_into(">i", buf, rec.TOTAL_SIZE_OFFSET, total)
    with pytest.raises(CorruptRecordError):
        decode_record(buf, verify=Verify.STRUCTURE)


@pytest.mark.parametrize("delta", [-1, 1, 7])
def test_total_size_not_equal_to_sum_of_fields_is_corrupt(delta):
    buf = make() + bytes(16)  # room behind the record, so only the field sum can disagree
    struct.pack_into(">i", buf, rec.TOTAL_SIZE_OFFSET, len(buf) - 16 + delta)
    with pytest.raises(CorruptRecordError, match="TOTALSIZE") as info:
        decode_record(buf, verify=Verify.STRUCTURE)
    assert info.value.size == len(buf) - 16 + delta


def test_unknown_magic_is_corrupt():
    buf = make()
    struct.pack_into(">I", buf, rec.MAGIC_OFFSET, 0x12345678)
    with pytest.raises(CorruptRecordError, match="magic 0x12345678"):
        decode_record(buf, verify=Verify.STRUCTURE)


def test_body_length_inconsistent_with_total_size_is_corrupt():
    buf = make()
    struct.pack_into(">i", buf, rec.BODY_LENGTH_OFFSET, 33)
    with pytest.raises(CorruptRecordError, match="does not fit TOTALSIZE") as info:
        decode_record(buf, verify=Verify.STRUCTURE)
    assert info.value.size == len(buf)


def test_non_utf8_topic_is_corrupt():
    buf = make(topic="abc")
    topic_pos = rec.BODY_OFFSET + 32 + 1
    buf[topic_pos : topic_pos + 3] = b"\xff\xfe\xfd"
    with pytest.raises(CorruptRecordError, match="UTF-8"):
        decode_record(buf, verify=Verify.STRUCTURE)


# ---------------------------------------------------------------- v2 and IPv6


def hand_built(magic: int, sys_flag: int, born: tuple[str, int], store: tuple[str, int], *,
               commit_pos: int = 0, topic: bytes = b"t6", body: bytes = b"six",
               props: bytes = b"TAGS\x01v6\x02") -> bytes:
    """A record laid out field by field from reference §1.1 with the given hosts and magic."""
    def host(ip, port):
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        return socket.inet_pton(family, ip) + struct.pack(">i", port)

    topic_len = struct.pack(">b" if magic == MAGIC_V1 else ">h", len(topic))
    tail = (struct.pack(">q", 111) + host(*born) + struct.pack(">q", 222) + host(*store)
            + struct.pack(">iqi", 1, 0, len(body)) + body + topic_len + topic
            + struct.pack(">h", len(props)) + props)
    head = struct.pack(">Iiiiqqi", magic, zlib.crc32(body) & 0x7FFFFFFF, 9, 0, 3, commit_pos, sys_flag)
    return struct.pack(">i", 4 + len(head) + len(tail)) + head + tail


def test_decode_v2_magic_ipv6_hosts():
    flags = SysFlag.BORNHOST_V6 | SysFlag.STOREHOST_V6
    buf = hand_built(MAGIC_V2, flags, ("::1", 7), ("fe80::1", 10911))
    assert len(buf) == 91 + 1 + 12 + 12 + 3 + 2 + 8
    got = decode_record(buf, verify=Verify.ROCKETMQ)
    assert (got.magic, got.born_host, got.store_host) == (MAGIC_V2, ("::1", 7), ("fe80::1", 10911))
    assert (got.born_ts_ms, got.store_ts_ms, got.body, got.topic, got.tags) == (111, 222, b"six", "t6", "v6")
    assert (got.queue_id, got.queue_offset, got.reconsume_times) == (9, 3, 1)
    assert len(got.msg_id) == 56
    assert store_ts_at(buf, 0) == 222
    assert decode_header(buf).store_ts_ms == 222


@pytest.mark.parametrize("flags", [SysFlag.BORNHOST_V6, SysFlag.STOREHOST_V6])
def test_decode_v1_with_one_ipv6_host(flags):
    born = ("2001:db8::5", 1) if flags & SysFlag.BORNHOST_V6 else ("10.0.0.1", 1)
    store = ("2001:db8::9", 2) if flags & SysFlag.STOREHOST_V6 else ("10.0.0.2", 2)
    buf = hand_built(MAGIC_V1, flags, born, store, commit_pos=40)
    got = decode_record(buf, base_pos=40, verify=Verify.ROCKETMQ)
    assert (got.born_host, got.store_host, got.store_ts_ms, got.body) == (born, store, 222, b"six")
    assert store_ts_at(buf, 0) == 222


def test_v2_magic_with_v1_topic_length_is_corrupt():
    buf = bytearray(make())
    struct.pack_into(">I", buf, rec.MAGIC_OFFSET, MAGIC_V2)
    with pytest.raises(CorruptRecordError):
        decode_record(buf, verify=Verify.STRUCTURE)


def test_ipv6_flag_on_an_ipv4_record_is_corrupt():
    buf = make()
    struct.pack_into(">i", buf, rec.SYS_FLAG_OFFSET, int(SysFlag.STOREHOST_V6))
    with pytest.raises(CorruptRecordError):
        decode_record(buf, verify=Verify.STRUCTURE)


# ---------------------------------------------------------------- filler


def test_filler_encode_bytes():
    assert encode_filler(108) == bytes.fromhex("0000006c") + bytes.fromhex("cbd43194")


def test_filler_decodes_to_filler_with_commit_position():
    seg = bytearray(200)
    seg[92:100] = encode_filler(108)
    got = decode_record(seg, 92, base_pos=1 << 30)
    assert got == Filler(pos=(1 << 30) + 92, size=108)
    assert got.end_pos == (1 << 30) + 200
    assert decode_header(seg, 92) == Filler(pos=92, size=108)


def test_filler_larger_than_buffer_is_corrupt():
    seg = bytearray(encode_filler(108)) + bytes(50)
    with pytest.raises(CorruptRecordError, match="filler"):
        decode_record(seg)


@pytest.mark.parametrize("space_left", [7, 0, -1, 2**31, "8"])
def test_filler_bad_size_is_bad_input(space_left):
    with pytest.raises(BadInputError):
        encode_filler(space_left)


# ---------------------------------------------------------------- bad input


def encode_with(**overrides):
    args = {"topic": "t", "body": b"x", "queue_id": 0, "properties": None, "born_ts_ms": 1,
            "born_host": BORN, "store_host": STORE}
    args.update(overrides)
    return encode_record(args.pop("topic"), args.pop("body"), **args)


@pytest.mark.parametrize(("overrides", "field"), [
    ({"body": b"x" * 11, "max_body_bytes": 10}, "body"),
    ({"body": "text"}, "body"),
    ({"properties": {"k": "v" * (32767 - 20 - 2)}}, "properties"),  # one byte over with the CRC tail
    ({"properties": {"__CRC32C": "0"}}, "properties"),
    ({"properties": {"k": 1}}, "properties"),
    ({"properties": {2: "v"}}, "properties"),
    ({"properties": {"k": "a\x02b"}}, "properties"),
    ({"topic": "t" * 128}, "topic"),
    ({"topic": "é" * 64}, "topic"),  # 128 bytes of UTF-8
    ({"topic": ""}, "topic"),
    ({"topic": b"t"}, "topic"),
    ({"born_host": ("::1", 1)}, "born_host"),
    ({"store_host": ("fe80::1", 10911)}, "store_host"),
    ({"store_host": ("localhost", 10911)}, "store_host"),
    ({"born_host": "127.0.0.1:1"}, "born_host"),
    ({"born_host": ("127.0.0.1", -1)}, "born_host port"),
    ({"queue_id": -1}, "queue_id"),
    ({"queue_id": True}, "queue_id"),
    ({"flag": 2**31}, "flag"),
    ({"sys_flag": int(SysFlag.BORNHOST_V6)}, "sys_flag"),
    ({"reconsume_times": -1}, "reconsume_times"),
    ({"born_ts_ms": 1.5}, "born_ts_ms"),
])
def test_encode_rejects_bad_input(overrides, field):
    with pytest.raises(BadInputError) as info:
        encode_with(**overrides)
    assert info.value.field == field


def test_encode_accepts_limits_exactly():
    encode_with(body=b"x" * 10, max_body_bytes=10)
    buf = encode_with(properties={"k": "v" * (32767 - 20 - 3)}, topic="t" * 127)
    got = decode_record(buf, verify=Verify.STRUCTURE)
    assert (len(got.topic), len(got.properties["k"])) == (127, 32767 - 23)


# ---------------------------------------------------------------- uniq key


def test_new_uniq_key_format_and_uniqueness():
    keys = {new_uniq_key() for _ in range(20_000)}
    assert len(keys) == 20_000
    assert all(len(k) == 32 and k == k.upper() and int(k, 16) >= 0 for k in keys)


def test_new_uniq_key_differs_across_processes():
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: write its keys and leave without running pytest teardown
        try:
            os.write(write_fd, "".join(new_uniq_key() for _ in range(1000)).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    mine = {new_uniq_key() for _ in range(1000)}
    with os.fdopen(read_fd, "rb") as pipe:
        raw = pipe.read().decode()
    os.waitpid(pid, 0)
    theirs = {raw[i : i + 32] for i in range(0, len(raw), 32)}
    assert len(theirs) == 1000
    assert not mine & theirs
