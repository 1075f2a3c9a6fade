"""The supervisor's structural check of producer records: garbage never reaches the log."""

import struct

import pytest

from engine.errors import BadInputError
from engine.formats.record import BODY_CRC_OFFSET, MAGIC_OFFSET, encode_record
from workers.request_check import RecordChecker

CHECKER = RecordChecker(max_body_bytes=1024, queue_count=4, segment_bytes=65536)


def record(topic="T1", body=b"hello", queue_id=1, props=None):
    return encode_record(topic, body, queue_id=queue_id, properties=props or {"KEYS": "k"},
                         born_ts_ms=1, born_host=("127.0.0.1", 1), store_host=("127.0.0.1", 2),
                         max_body_bytes=1 << 20)


def test_good_record_passes():
    assert CHECKER.check(memoryview(record())) == ("T1", 1)


def mutate(raw, offset, fmt, value):
    raw = bytearray(raw)
    struct.pack_into(fmt, raw, offset, value)
    return memoryview(raw)


@pytest.mark.parametrize("bad,what", [
    (lambda r: memoryview(r[:-1]), "TOTALSIZE"),
    (lambda r: mutate(r, MAGIC_OFFSET, ">I", 0xCBD43194), "magic"),
    (lambda r: mutate(r, BODY_CRC_OFFSET, ">i", 12345), "BODYCRC"),
    (lambda r: memoryview(bytes(len(r))), "TOTALSIZE"),
    (lambda r: memoryview(b"\x00\x00\x00\x08" + bytes(200)), "TOTALSIZE"),
    (lambda r: memoryview(r[:40]), "too short"),
])
def test_garbage_is_refused(bad, what):
    with pytest.raises(BadInputError, match=what):
        CHECKER.check(bad(record()))


def test_queue_id_out_of_range_is_refused():
    with pytest.raises(BadInputError, match="queue_id"):
        CHECKER.check(memoryview(record(queue_id=9)))


def test_body_too_large_is_refused():
    with pytest.raises(BadInputError, match="BODYLENGTH"):
        CHECKER.check(memoryview(record(body=b"x" * 2000)))


def test_bad_topic_is_refused():
    with pytest.raises(BadInputError, match="topic"):
        CHECKER.check(memoryview(record(topic="a/b")))


def test_non_utf8_properties_are_refused():
    raw = bytearray(record(props={"KEYS": "ab"}))
    at = raw.index(b"KEYS\x01ab") + 5
    raw[at] = 0xFF
    with pytest.raises(BadInputError, match="UTF-8"):
        CHECKER.check(memoryview(raw))


def test_check_request_batch_agrees_with_the_record_check():
    records = [record(), record(topic="T2", queue_id=3, props={"KEYS": "é-non-ascii"}),
               record(queue_id=9), record(topic="a/b"), record(body=b"y" * 2000)]
    broken = bytearray(record(body=b"z" * 10))
    broken[BODY_CRC_OFFSET] ^= 0xFF
    records.append(broken)
    data = bytearray(b"".join(records))
    checked = CHECKER.check_request(data, len(records))
    assert checked.ok.tolist() == [True, True, False, False, False, False]
    assert checked.topics[:2] == ["T1", "T2"] and checked.queue_ids[:2].tolist() == [1, 3]
    assert set(checked.reasons) == {2, 3, 4, 5}
    assert "queue_id" in checked.reasons[2] and "BODYCRC" in checked.reasons[5]
    assert checked.sizes.tolist() == [len(r) for r in records]


def test_check_request_refuses_broken_framing():
    data = bytearray(record() + b"\x00\x00\x00\x09garbage!")
    with pytest.raises(BadInputError, match="framing"):
        CHECKER.check_request(data, 2)
    with pytest.raises(BadInputError, match="framing"):
        CHECKER.check_request(bytearray(record()), 2)
