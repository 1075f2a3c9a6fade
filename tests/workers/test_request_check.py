
"""The supervisor's structural check of producer records: garbage never reaches the log."""

import random
import struct
from functools import partial

import numpy as np
import pytest

from engine.errors import BadInputError
from engine.formats.crc32c_property import CRC32C_PROP_SIZE
from engine.formats.record import (
    BODY_CRC_OFFSET,
    BODY_LENGTH_OFFSET,
    BODY_OFFSET,
    MAGIC_OFFSET,
    QUEUE_ID_OFFSET,
    SYS_FLAG_OFFSET,
    SysFlag,
    encode_record,
)
from engine.formats.record.stamp_many import check_stampable
from engine.refusal import Refusal
from engine.status import PutStatus
from engine.topics.system import system_topic_counts
from engine.topics.table import TopicConfig, TopicDefaults, TopicTable
from engine.tuning import STRUCT_PATH_MAX_RECORDS
from ipc.mailbox import Mailbox, ProducerSlot, RequestFlag
from ipc.run_info import run_dir
from tests.workers.store_harness import assert_check_clean, start_store
from workers.request_check import RecordChecker, merge_checked

# the store's own topics sit in the table beside the configured ones (engine.topics.system)
CHECKER = RecordChecker(max_body_bytes=1024, segment_bytes=65536, route=partial(
    TopicTable().with_system_topics(system_topic_counts(18)).put_route, defaults=TopicDefaults(4)))


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
    assert "queue_id" in str(checked.reasons[2]) and "BODYCRC" in str(checked.reasons[5])
    assert checked.sizes.tolist() == [len(r) for r in records]


def test_check_request_refuses_broken_framing():
    data = bytearray(record() + b"\x00\x00\x00\x09garbage!")
    with pytest.raises(BadInputError, match="framing"):
        CHECKER.check_request(data, 2)
    with pytest.raises(BadInputError, match="framing"):
        CHECKER.check_request(bytearray(record()), 2)
    assert CHECKER.check_few(memoryview(data), 0, len(data), 2) is None
    whole = bytearray(record())
    assert CHECKER.check_few(memoryview(whole), 0, len(whole), 2) is None
    assert CHECKER.check_few(memoryview(whole + b"x"), 0, len(whole) + 1, 1) is None
    assert CHECKER.check_few(memoryview(whole), 0, len(whole), 1) == [(0, len(whole), "T1", 1)]


# ---------------------------------------------------------------- whole requests, both paths

BIG = STRUCT_PATH_MAX_RECORDS + 8  # checked as a whole against its first record


def reference(data: bytearray, count: int):
    """What check_request must answer: the TOTALSIZE walk, then `check` on each record."""
    view, pos, rows = memoryview(data), 0, []
    for _ in range(count):
        if pos + 8 > len(data):
            return None
        size = struct.unpack_from(">i", data, pos)[0]
        if size < 8 or pos + size > len(data):
            return None
        try:
            rows.append((True, *CHECKER.check(view[pos:pos + size]), None))
        except BadInputError as exc:
            rows.append((False, None, -1, str(exc)))
        pos += size
    return rows if pos == len(data) else None


def assert_agrees(data: bytearray, count: int):
    expected = reference(bytearray(data), count)
    assert_few_agrees(data, count, expected)
    if expected is None:
        with pytest.raises(BadInputError, match="framing"):
            CHECKER.check_request(data, count)
        return None
    checked = CHECKER.check_request(data, count)
    got = [(bool(ok), topic, int(queue_id), str(checked.reasons[i]) if i in checked.reasons else None)
           for i, (ok, topic, queue_id) in enumerate(zip(checked.ok, checked.topics, checked.queue_ids,
                                                         strict=True))]
    assert got == expected
    assert checked.sizes.sum() == len(data) and checked.starts[0] == 0
    return checked


def assert_few_agrees(data: bytearray, count: int, expected: list | None) -> None:
    """check_few, on the request placed after another's bytes, accepts exactly the requests
    whose every record `check` accepts, with their places and routing; the others get None."""
    prefix = bytes(record(body=b"before"))
    placed = memoryview(bytearray(prefix + data))
    routes = CHECKER.check_few(placed, len(prefix), len(placed), count)
    if expected is None or not all(ok for ok, *_ in expected):
        assert routes is None
        return
    starts, at = [], len(prefix)
    for raw_size in split_sizes(data, count):
        starts.append(at)
        at += raw_size
    assert routes == [(start, size, topic, queue_id) for start, size, (_, topic, queue_id, _)
                      in zip(starts, split_sizes(data, count), expected, strict=True)]


def split_sizes(data: bytearray, count: int) -> list[int]:
    """Each record's TOTALSIZE along the chain (the framing holds)."""
    sizes, at = [], 0
    for _ in range(count):
        sizes.append(struct.unpack_from(">i", data, at)[0])
        at += sizes[-1]
    return sizes


def request(rnd: random.Random, count: int, topics=("T1",)) -> list[bytearray]:
    return [bytearray(record(topic=rnd.choice(topics), body=rnd.randbytes(rnd.randrange(300)),
                             queue_id=rnd.randrange(4),
                             props={"KEYS": f"k{i}", "UNIQ_KEY": f"{rnd.getrandbits(64):X}"}))
            for i in range(count)]


def put(raw: bytearray, offset: int, fmt: str, value) -> bytearray:
    struct.pack_into(fmt, raw, offset, value)
    return raw


def props_at(raw: bytearray) -> int:
    return raw.index(b"KEYS\x01")


TOPIC_LEN_AT = BODY_OFFSET  # of a record with an empty body
MUTATIONS = {  # name: (how to break a record, words of the reason; None: still a good record)
    "BODYCRC": (lambda r: put(r, BODY_CRC_OFFSET, ">i", 12345), "BODYCRC"),
    "magic": (lambda r: put(r, MAGIC_OFFSET, ">I", 0xDAA320AB), "magic"),
    "ipv6": (lambda r: put(r, SYS_FLAG_OFFSET, ">i", int(SysFlag.STOREHOST_V6)), "IPv6"),
    "negative sysflag": (lambda r: put(r, SYS_FLAG_OFFSET, ">i", -1 << 20), "IPv6"),
    "transaction prepared": (lambda r: put(r, SYS_FLAG_OFFSET, ">i", int(SysFlag.TRANSACTION_PREPARED)),
                             "PREPARED"),
    "transaction rollback": (lambda r: put(r, SYS_FLAG_OFFSET, ">i", int(SysFlag.TRANSACTION_ROLLBACK)),
                             "PREPARED"),
    "transaction commit": (lambda r: put(r, SYS_FLAG_OFFSET, ">i", int(SysFlag.TRANSACTION_COMMIT)), None),
    "other sysflag bits": (lambda r: put(r, SYS_FLAG_OFFSET, ">i", 0x7C3), None),
    "queue id": (lambda r: put(r, QUEUE_ID_OFFSET, ">i", 4), "queue_id"),
    "negative queue id": (lambda r: put(r, QUEUE_ID_OFFSET, ">i", -1), "queue_id"),
    "body too long": (lambda r: put(r, BODY_LENGTH_OFFSET, ">i", 1025), "BODYLENGTH"),
    "negative body": (lambda r: put(r, BODY_LENGTH_OFFSET, ">i", -5), "BODYLENGTH"),
    "body past end": (lambda r: put(r, BODY_LENGTH_OFFSET, ">i", len(r) - BODY_OFFSET - 2), "BODYLENGTH"),
    "topic length": (lambda r: put(r, TOPIC_LEN_AT, ">b", 3), "PROPERTIESLENGTH"),
    "zero topic length": (lambda r: put(r, TOPIC_LEN_AT, ">b", 0), "TOPICLENGTH"),
    "negative topic length": (lambda r: put(r, TOPIC_LEN_AT, ">b", -2), "TOPICLENGTH"),
    "bad topic": (lambda r: put(r, TOPIC_LEN_AT + 1, ">c", b"/"), "topic"),
    "other topic": (lambda r: put(r, TOPIC_LEN_AT + 2, ">c", b"9"), None),
    "props length": (lambda r: put(r, props_at(r) - 2, ">h", 19), "PROPERTIESLENGTH"),
    "no crc slot": (lambda r: put(r, len(r) - CRC32C_PROP_SIZE, ">c", b"x"), "__CRC32C"),
    "no crc separator": (lambda r: put(r, len(r) - 1, ">c", b"\x01"), "__CRC32C"),
    "crc digits set": (lambda r: put(r, len(r) - 11, ">10s", b"1234567890"), None),
    "not utf-8": (lambda r: put(r, props_at(r) + 5, ">B", 0xFF), "UTF-8"),
    "non-ascii utf-8": (lambda r: put(r, props_at(r) + 5, ">H", 0xC3A9), None),
    "tiny": (lambda r: bytearray(b"\x00\x00\x00\x0c") + bytes(8), "too short"),
    "short": (lambda r: bytearray(struct.pack(">i", 100)) + bytes(96), "too short"),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_check_request_batch_refuses_each_kind_of_bad_record_like_check(name, where):
    """A request of BIG records (the whole-array path) with one broken record: that record alone
    gets the reason `check` gives, the others pass; framing still holds."""
    mutate, words = MUTATIONS[name]
    records = [bytearray(record(body=b"", queue_id=i % 4, props={"KEYS": f"k{i:02d}"})) for i in range(BIG)]
    at = {"first": 0, "middle": BIG // 2, "last": BIG - 1}[where]
    records[at] = mutate(records[at])
    checked = assert_agrees(bytearray(b"".join(records)), BIG)
    assert checked.ok.sum() == BIG - (words is not None)
    if words is not None:
        assert set(checked.reasons) == {at} and words in str(checked.reasons[at])
        assert checked.topics[at] is None and checked.queue_ids[at] == -1
    else:
        assert checked.topics[at] == ("T9" if name == "other topic" else "T1")


@pytest.mark.parametrize("seed", range(6))
def test_check_request_agrees_with_check_under_random_damage(seed):
    """Random byte flips and field writes in requests of 1..60 records (both paths, every kind of
    damage, framing included): check_request answers exactly what `check` answers per record."""
    rnd = random.Random(seed)
    for _ in range(40):
        records = request(rnd, rnd.choice([1, 5, STRUCT_PATH_MAX_RECORDS, BIG, 60]), ("T1", "T1", "T2"))
        for _ in range(rnd.randrange(4)):
            i = rnd.randrange(len(records))
            if rnd.random() < 0.3:
                records[i] = MUTATIONS[rnd.choice(sorted(MUTATIONS))][0](records[i])
            else:
                records[i][rnd.randrange(len(records[i]))] ^= 1 << rnd.randrange(8)
        assert_agrees(bytearray(b"".join(records)), len(records))


def test_merged_good_records_of_one_request_are_the_accepted_records_end_to_end():
    rnd = random.Random(3)
    records = request(rnd, BIG)
    for i in (2, 9, BIG - 1):
        records[i] = MUTATIONS["BODYCRC"][0](records[i])
    data = bytearray(b"".join(records))
    checked = CHECKER.check_request(data, len(records))
    good = merge_checked(data, [(0, checked)]).records
    assert bytes(good.buf) == b"".join(r for i, r in enumerate(records) if i not in (2, 9, BIG - 1))
    assert good.sizes.tolist() == [len(r) for i, r in enumerate(records) if i not in (2, 9, BIG - 1)]
    assert good.starts.tolist() == [0, *np.cumsum(good.sizes)[:-1].tolist()]
    check_stampable(*good)
    clean = bytearray(b"".join(request(rnd, 3)))
    assert merge_checked(clean, [(0, CHECKER.check_request(clean, 3))]).records.buf is clean


def test_the_topic_rule_refuses_queues_past_a_topics_write_queues_in_every_path():
    """The supervisor's check runs the topic table's put rule (engine.topics.table) on each record,
    one by one and in the batch path: a queue past the topic's write queues, or a topic without
    write permission, is refused with its own refusal code; other topics pass."""
    table = TopicTable().with_topic(TopicConfig("Solo", 1, 1)).with_topic(TopicConfig("Ro", 2, 2, perm=4))
    checker = RecordChecker(max_body_bytes=1024, segment_bytes=65536,
                            route=partial(table.put_route, defaults=TopicDefaults(4)))
    for count in (3, BIG):  # scalar, then batch against the first record
        records = [record(topic="Solo", queue_id=0) for _ in range(count - 2)]
        records += [record(topic="Solo", queue_id=1), record(topic="Ro", queue_id=0)]
        checked = checker.check_request(bytearray(b"".join(records)), count)
        assert checked.ok.tolist() == [True] * (count - 2) + [False, False]
        past, read_only = checked.reasons[count - 2], checked.reasons[count - 1]
        assert (past.refusal, past.limit, past.found) == (Refusal.WRITE_QUEUE, 1, 1)
        assert read_only.refusal == Refusal.TOPIC_NOT_WRITABLE and "perm 4" in str(read_only)
    assert checker.check(memoryview(record(topic="Other", queue_id=3)))[1] == 3  # default count


def test_check_request_batch_topics_and_queue_ids_per_record():
    rnd = random.Random(7)
    records = request(rnd, 40, ("T1", "T2", "T3"))
    checked = assert_agrees(bytearray(b"".join(records)), len(records))
    assert checked.ok.all() and set(checked.topics) == {"T1", "T2", "T3"}


@pytest.mark.slow
def test_supervisor_appends_only_the_good_records_of_a_large_request(tmp_path):
    """End to end through the real supervisor: a request checked as a whole with bad records in
    it; each bad record is MESSAGE_ILLEGAL, exactly the good ones reach the log, which stays clean."""
    running = start_store(tmp_path / "store")
    try:
        records = [bytearray(record(topic="E2E", body=bytes([i]) * i, queue_id=i % 4,
                                    props={"KEYS": f"k{i}"})) for i in range(BIG + 10)]
        bad = {3: "BODYCRC", 11: "queue id", 20: "not utf-8", BIG + 9: "tiny"}
        for i, name in bad.items():
            records[i] = MUTATIONS[name][0](records[i])
        good_bytes = sum(len(r) for i, r in enumerate(records) if i not in bad)
        with running.ctl() as ctl:
            mailbox = Mailbox.attach(running.root)
            slot = ProducerSlot.claim(mailbox, run_dir(running.root), alive=ctl.supervisor_alive)
            try:
                before = ctl.written_pos
                seq = slot.write_request(b"".join(records), count=len(records),
                                         flags=RequestFlag.WAIT_FOR_FLUSH)
                results = slot.wait_response(seq, 10, ctl.supervisor_alive)
                assert [PutStatus(s) for s in results["status"]] == [
                    PutStatus.MESSAGE_ILLEGAL if i in bad else PutStatus.PUT_OK for i in range(len(records))]
                assert ctl.written_pos == before + good_bytes
                ok = results[results["status"] == PutStatus.PUT_OK]
                assert ok["commit_pos"].tolist() == sorted(ok["commit_pos"].tolist())
                assert sorted(ok["queue_offset"][ok["queue_id"] == 1].tolist()) == list(range(
                    sum(1 for i in range(len(records)) if i % 4 == 1 and i not in bad)))
            finally:
                slot.release()
                mailbox.close()
    finally:
        assert running.stop() == 0
    assert_check_clean(running.root)


def test_check_request_of_large_bodies_agrees_with_check_on_a_view():
    """Bodies of tens of KiB, damaged in places, in a memoryview (what the appender passes): the
    batch path answers exactly what `check` answers per record."""
    checker = RecordChecker(max_body_bytes=1 << 17, segment_bytes=1 << 24,
                            route=partial(TopicTable().put_route, defaults=TopicDefaults(4)))
    rnd = random.Random(21)
    records = [bytearray(record(body=rnd.randbytes(rnd.randrange(20000, 70000)), queue_id=i % 4))
               for i in range(BIG)]
    records[5][BODY_OFFSET + 30000] ^= 0x01  # inside the body: BODYCRC
    records[BIG - 1][BODY_OFFSET + 1] ^= 0x80
    data = bytearray(b"".join(records) + bytes(100))
    checked = checker.check_request(memoryview(data)[:-100], len(records))
    expected = [i not in (5, BIG - 1) for i in range(BIG)]
    assert checked.ok.tolist() == expected
    assert "BODYCRC" in str(checked.reasons[5]) and "BODYCRC" in str(checked.reasons[BIG - 1])
    for i, start in enumerate(checked.starts.tolist()):
        view = memoryview(data)[start:start + int(checked.sizes[i])]
        if expected[i]:
            assert checker.check(view) == ("T1", i % 4)
        else:
            with pytest.raises(BadInputError, match="BODYCRC"):
                checker.check(view)


def test_merge_checked_appends_in_place_only_when_every_byte_is_a_good_record():
    first, second = [record(body=b"x" * i, queue_id=i % 4) for i in range(3)], [record(topic="T2")]
    clean = bytearray(b"".join(first + second))
    size_a = sum(len(r) for r in first)
    parts = [(0, CHECKER.check_request(memoryview(clean)[:size_a], 3)),
             (size_a, CHECKER.check_request(memoryview(clean)[size_a:], 1))]
    merged = merge_checked(memoryview(clean), parts)
    assert merged.records.buf.obj is clean and merged.spans == [(0, 3), (3, 4)]
    assert merged.topics == ["T1", "T1", "T1", "T2"] and merged.queue_ids.tolist() == [0, 1, 2, 1]
    # a bad record, and the bytes of a request left out (malformed): only the good ones, copied
    damaged = bytearray(b"garbage!" + b"".join(first + second))
    damaged[8 + len(first[0]) + BODY_OFFSET] ^= 0x01  # record 1's body: BODYCRC
    parts = [(8, CHECKER.check_request(memoryview(damaged)[8:8 + size_a], 3)),
             (8 + size_a, CHECKER.check_request(memoryview(damaged)[8 + size_a:], 1))]
    merged = merge_checked(memoryview(damaged), parts)
    assert merged.spans == [(0, 2), (2, 3)] and merged.topics == ["T1", "T1", "T2"]
    assert bytes(merged.records.buf) == first[0] + first[2] + second[0]
    assert merged.records.starts.tolist() == [0, len(first[0]), len(first[0]) + len(first[2])]


# ---------------------------------------------------------------- system topics

@pytest.mark.parametrize("topic", ["%RETRY%g", "%DLQ%g"])
def test_a_record_to_a_system_topic_is_refused(topic):
    with pytest.raises(BadInputError, match="system topic"):
        CHECKER.check(memoryview(record(topic=topic)))


def test_schedule_topic_has_a_queue_per_delay_level_other_topics_queue_count():
    """queue_count 4, 18 levels: SCHEDULE_TOPIC_XXXX takes queues 0..17, the timer topic one a
    minute of its wheel (engine.topics.system.TIMER_SLOTS), other topics 0..3, on both paths."""
    assert CHECKER.check(memoryview(record(topic="SCHEDULE_TOPIC_XXXX", queue_id=17))) == (
        "SCHEDULE_TOPIC_XXXX", 17)
    for topic, queue_id in (("SCHEDULE_TOPIC_XXXX", 18), ("T1", 4), ("T1", 17)):
        with pytest.raises(BadInputError, match="queue_id"):
            CHECKER.check(memoryview(record(topic=topic, queue_id=queue_id)))
    assert CHECKER.check(memoryview(record(topic="rmq_sys_wheel_timer", queue_id=10081)))[1] == 10081
    for topic, good, bad in (("SCHEDULE_TOPIC_XXXX", 17, 18), ("T1", 3, 17),
                             ("rmq_sys_wheel_timer", 10081, 10082)):
        records = [record(topic=topic, queue_id=good)] * BIG + [record(topic=topic, queue_id=bad)]
        checked = CHECKER.check_request(bytearray(b"".join(records)), len(records))
        assert checked.ok.tolist() == [True] * BIG + [False]
        assert "queue_id" in str(checked.reasons[BIG])
