"""The batch codecs on large records (kilobytes of body), whose paths differ from small ones:
encode_columns joins pieces instead of one `%`, find_starts walks instead of searching every
byte, checksums run on views of the buffer. Same bytes and answers as the reference codec."""

from __future__ import annotations

import random

import numpy as np
import pytest

from engine.formats.record import (
    FILLER_SIZE,
    Verify,
    decode_header,
    encode_filler,
    encode_record,
    stamp_record,
)
from engine.formats.record.dispatch_columns import columns_from_headers, decode_dispatch
from engine.formats.record.encode_many import encode_columns, encode_records
from engine.formats.record.spans import find_starts, verify_spans, walk_starts
from engine.formats.record.stamp_many import stamp_records
from engine.formats.uniq_key import UniqKeyBlock
from engine.message import Message, encode_message_properties, key_column
from engine.tuning import JOIN_MIN_BODY_BYTES, STRUCT_PATH_MAX_RECORDS, WALK_FIRST_RECORDS, WALK_MIN_AVG_BYTES

BORN, STORE = ("127.0.0.1", 4242), ("10.1.2.3", 10911)
BASE_POS = 1 << 30
PREFIX = "0000ABCD" + "12F456" + "018BCDEF0123"


def body_sizes(rnd: random.Random, n: int) -> list[int]:
    """Mostly large bodies, a few tiny or empty, averaging more than both thresholds."""
    return [rnd.choice([0, 7, rnd.randrange(4096, 70000)]) if rnd.random() < 0.2
            else rnd.randrange(4096, 70000) for _ in range(n)]


def stamped_log(rnd: random.Random, n: int) -> tuple[bytearray, list[int]]:
    """n records encoded and stamped by the reference codec, end to end."""
    records = [encode_record(rnd.choice(["TopicA", "B"]), rnd.randbytes(size), queue_id=rnd.randrange(4),
                             properties={"KEYS": f"k{i} x{i}", "UNIQ_KEY": f"U{i}", "TAGS": "t"},
                             born_ts_ms=5, born_host=BORN, store_host=STORE, max_body_bytes=1 << 20)
               for i, size in enumerate(body_sizes(rnd, n))]
    buf, starts, pos = bytearray(b"".join(records)), [], 0
    for i, record in enumerate(records):
        stamp_record(buf, pos, queue_offset=i, commit_pos=BASE_POS + pos, store_ts_ms=1_700_000_000_000 + i)
        starts.append(pos)
        pos += len(record)
    return buf, starts


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("with_keys,tags", [(True, "tag%é"), (False, None)])
def test_encode_columns_joins_large_bodies_byte_identical_to_the_message_path(seed, with_keys, tags):
    rnd = random.Random(seed)
    n = rnd.randrange(1, 40)
    bodies = [rnd.randbytes(size) for size in body_sizes(rnd, n)]
    assert sum(map(len, bodies)) >= JOIN_MIN_BODY_BYTES * n  # the join path
    keys = [f"key{i}%é" * rnd.randrange(1, 3) for i in range(n)] if with_keys else None
    block = UniqKeyBlock(PREFIX, 0xFFFFFF - 5, n)
    got = encode_columns(b"Topic%A", bodies, 3, keys_raw=key_column(keys, n) if keys else None,
                         tags_raw=tags.encode() if tags else None, uniq_prefix=block.prefix,
                         first_counter=block.first_counter, born_ts_ms=77, born_host=BORN,
                         store_host=STORE)
    props = [encode_message_properties(Message("Topic%A", body, tags=tags, keys=(key,) if key else ()), uniq)
             for body, key, uniq in zip(bodies, keys or [None] * n, block.texts(), strict=True)]
    expected = encode_records([b"Topic%A"] * n, bodies, props, [3] * n, born_ts_ms=77, born_host=BORN,
                              store_host=STORE)
    assert got.buf == bytes(expected.buf)
    assert got.starts.tolist() == np.cumsum([0, *got.sizes.tolist()])[:-1].tolist()


@pytest.mark.parametrize("seed", range(4))
def test_find_starts_walks_large_records_like_walk_starts_and_decodes_like_the_reference(seed):
    rnd = random.Random(seed)
    buf, starts = stamped_log(rnd, rnd.randrange(WALK_FIRST_RECORDS, 3 * WALK_FIRST_RECORDS))
    assert len(buf) >= WALK_MIN_AVG_BYTES * len(starts)  # the walking path
    tail = rnd.choice(["filler", "torn", "none"])
    if tail == "filler":
        buf += encode_filler(FILLER_SIZE + 100) + bytes(100)
    elif tail == "torn":
        buf += bytes(buf[starts[1]:starts[2]])[:-3]
    found = find_starts(buf, 0, len(buf), BASE_POS)
    assert found.tolist() == walk_starts(buf, 0, len(buf)).tolist()
    assert found.tolist()[:len(starts)] == starts
    for at in (starts[1], starts[-1]):  # starting inside the log
        assert find_starts(buf, at, len(buf), BASE_POS).tolist() == walk_starts(buf, at, len(buf)).tolist()
    spans = verify_spans(buf, found, BASE_POS, Verify.MQSTORE)
    assert spans.count == len(starts)
    cols = decode_dispatch(buf, spans, BASE_POS)
    ref = columns_from_headers([decode_header(buf, s, base_pos=BASE_POS) for s in starts])
    for name in ("commit_pos", "total_size", "queue_id", "queue_offset", "store_ts_ms", "tags_code",
                 "key_rows"):
        assert getattr(cols, name).tolist() == getattr(ref, name).tolist(), name
    assert [cols.topics[i] for i in cols.topic_index] == [ref.topics[i] for i in ref.topic_index]
    assert cols.keys == ref.keys


def test_verify_spans_stops_at_a_damaged_large_body_like_the_reference():
    rnd = random.Random(11)
    buf, starts = stamped_log(rnd, 20)
    sizes = np.diff([*starts, len(buf)])
    victim = int(np.argmax(sizes[3:])) + 3  # a large body
    buf[starts[victim] + sizes[victim] // 2] ^= 0x10
    spans = verify_spans(buf, find_starts(buf, 0, len(buf), BASE_POS), BASE_POS, Verify.MQSTORE)
    assert spans.count == victim
    assert verify_spans(buf, find_starts(buf, 0, len(buf), BASE_POS), BASE_POS, Verify.STRUCTURE).count == 20


def test_stamp_records_of_large_records_equals_stamp_record():
    rnd = random.Random(5)
    n = STRUCT_PATH_MAX_RECORDS + 6  # the numpy path
    records = [encode_record("T", rnd.randbytes(size), queue_id=1, born_ts_ms=5, born_host=BORN,
                             store_host=STORE, max_body_bytes=1 << 20) for size in body_sizes(rnd, n)]
    scalar = bytearray(b"".join(records))
    starts = np.cumsum([0, *map(len, records)])[:-1]
    for i, start in enumerate(starts.tolist()):
        stamp_record(scalar, start, queue_offset=10 + i, commit_pos=BASE_POS + start, store_ts_ms=99)
    batch = bytearray(b"".join(records))
    stamp_records(memoryview(batch), starts, np.array(list(map(len, records))), 10 + np.arange(n),
                  BASE_POS + starts, 99)
    assert batch == scalar
