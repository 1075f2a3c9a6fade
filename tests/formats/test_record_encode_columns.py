"""encode_many.encode_columns against the reference codecs, byte for byte.

The reference for a column batch is what the message-by-message path writes: the properties
engine.message builds for Message(topic, body, tags=..., keys=(key,)) with the same UNIQ_KEY,
encoded by scalar.encode_record (one record) and encode_many.encode_records (many)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import BadInputError
from engine.formats.record import (
    MAX_PROPERTIES_BYTES,
    Verify,
    decode_record,
    encode_many,
    encode_record,
    stamp_record,
)
from engine.formats.record.encode_many import encode_columns, encode_records
from engine.formats.uniq_key import UniqKeyBlock
from engine.message import Message, build_properties, encode_message_properties, key_column

BORN, STORE = ("127.0.0.1", 4242), ("10.1.2.3", 10911)
BORN_TS_MS = 1_700_000_000_123
PREFIX = "0000ABCD" + "12F456" + "018BCDEF0123"
# key text without spaces or separators; '%' and non-ASCII exercise the template's escaping
KEY = st.text(alphabet=st.sampled_from("ab_-9%é漢"), min_size=1, max_size=12)
TAGS = st.none() | st.text(alphabet=st.sampled_from("tag%é |"), min_size=1, max_size=10)
TOPIC = st.sampled_from(["T", "Topic_A", "x" * 127, "with%percent"])


def reference(topic: str, bodies, keys, tags, queue_ids, block: UniqKeyBlock) -> bytes:
    """The same messages through encode_message_properties and record_batch.encode_records."""
    props = [encode_message_properties(Message(topic, body, tags=tags, keys=(key,) if key else ()), uniq)
             for body, key, uniq in zip(bodies, keys or [None] * len(bodies), block.texts(), strict=True)]
    encoded = encode_records([topic.encode()] * len(bodies), bodies, props, queue_ids, born_ts_ms=BORN_TS_MS,
                             born_host=BORN, store_host=STORE)
    return bytes(encoded.buf), encoded


def columns(topic: str, bodies, keys, tags, queue_ids, block: UniqKeyBlock):
    return encode_columns(topic.encode(), bodies, queue_ids,
                          keys_raw=key_column(keys, len(bodies)) if keys is not None else None,
                          tags_raw=tags.encode() if tags is not None else None, uniq_prefix=block.prefix,
                          first_counter=block.first_counter, born_ts_ms=BORN_TS_MS, born_host=BORN,
                          store_host=STORE)


@settings(max_examples=300, deadline=None)
@given(topic=TOPIC, tags=TAGS, data=st.data(),
       n=st.integers(1, 30), first_counter=st.sampled_from([0, 5, 0xFFFFFF - 3, 0xFFFFFF]),
       same_body_len=st.booleans(), with_keys=st.booleans())
def test_columns_are_byte_identical_to_the_message_path(topic, tags, data, n, first_counter,
                                                         same_body_len, with_keys):
    body = st.binary(min_size=32, max_size=32) if same_body_len else st.binary(max_size=300)
    bodies = data.draw(st.lists(body, min_size=n, max_size=n))
    keys = data.draw(st.lists(KEY, min_size=n, max_size=n)) if with_keys else None
    queue_ids = data.draw(st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n) | st.just(3))
    block = UniqKeyBlock(PREFIX, first_counter, n)
    per_record = queue_ids if isinstance(queue_ids, list) else [queue_ids] * n
    expected, ref = reference(topic, bodies, keys, tags, per_record, block)
    got = columns(topic, bodies, keys, tags, queue_ids, block)
    assert got.buf == expected
    assert got.starts.tolist() == ref.starts.tolist() and got.sizes.tolist() == ref.sizes.tolist()


def test_each_record_equals_encode_record_and_decodes_back():
    bodies = [b"", b"x" * 300, b"%b%s", bytes(range(256))]
    keys = ["k1", "longer-key-%", "é", "k4"]
    block = UniqKeyBlock(PREFIX, 0xFFFFFE, len(bodies))  # the counter wraps inside the batch
    got = columns("Orders", bodies, keys, "tagA", [0, 1, 2, 3], block)
    uniq_keys = block.texts()
    assert uniq_keys[2].endswith("000000")
    for i, (start, size) in enumerate(zip(got.starts.tolist(), got.sizes.tolist(), strict=True)):
        message = Message("Orders", bodies[i], tags="tagA", keys=(keys[i],))
        one = encode_record("Orders", bodies[i], queue_id=i,
                            properties=build_properties(message, uniq_key=uniq_keys[i]),
                            born_ts_ms=BORN_TS_MS, born_host=BORN, store_host=STORE)
        assert got.buf[start:start + size] == one
        stamp_record(one, 0, queue_offset=7, commit_pos=1000, store_ts_ms=5)
        record = decode_record(one, 0, verify=Verify.MQSTORE, base_pos=1000)
        assert (record.body, record.tags, record.keys, record.uniq_key, record.queue_id) == (
            bodies[i], "tagA", (keys[i],), uniq_keys[i], i)


def test_no_keys_no_tags_and_empty_batch():
    block = UniqKeyBlock(PREFIX, 9, 2)
    got = columns("T", [b"a", b"bb"], None, None, 1, block)
    assert got.buf == reference("T", [b"a", b"bb"], None, None, [1, 1], block)[0]
    empty = columns("T", [], None, None, [], UniqKeyBlock(PREFIX, 0, 0))
    assert empty.buf == b"" and len(empty.starts) == len(empty.sizes) == 0


@pytest.mark.parametrize("change, field", [
    ({"keys": ["a"]}, "keys"),  # one key for two bodies
    ({"queue_ids": [0]}, "queue_ids"),
    ({"topic": ""}, "topic"),
    ({"topic": "x" * 128}, "topic"),
    ({"uniq_prefix": "ABC"}, "uniq_prefix"),
    ({"keys": ["a", "k" * MAX_PROPERTIES_BYTES]}, "properties"),
])
def test_bad_columns_are_refused(change, field):
    args = {"topic": "T", "keys": ["a", "b"], "queue_ids": [0, 1], "uniq_prefix": PREFIX}
    args.update(change)
    keys_raw = [key.encode() for key in args["keys"]]
    with pytest.raises(BadInputError) as info:
        encode_columns(args["topic"].encode(), [b"1", b"2"], args["queue_ids"], keys_raw=keys_raw,
                       tags_raw=None, uniq_prefix=args["uniq_prefix"], first_counter=0,
                       born_ts_ms=BORN_TS_MS, born_host=BORN, store_host=STORE)
    assert info.value.field == field


def test_longest_key_that_fits_the_properties_limit():
    probe = columns("T", [b"x"], ["k"], None, 0, UniqKeyBlock(PREFIX, 0, 1))
    props_len = int(probe.sizes[0]) - 91 - 1 - 1  # TOTALSIZE = 91 + body + topic + properties
    longest = "k" * (MAX_PROPERTIES_BYTES - props_len + 1)
    fits = columns("T", [b"x"], [longest], None, 0, UniqKeyBlock(PREFIX, 0, 1))
    assert fits.buf == reference("T", [b"x"], [longest], None, [0], UniqKeyBlock(PREFIX, 0, 1))[0]
    with pytest.raises(BadInputError, match="exceed 32767"):
        columns("T", [b"x"], [longest + "k"], None, 0, UniqKeyBlock(PREFIX, 0, 1))


@settings(max_examples=200, deadline=None)
@given(topic=TOPIC, tags=TAGS, data=st.data(), n=st.integers(1, 40),
       first_counter=st.sampled_from([0, 0xFFFFFF - 3]), with_keys=st.booleans())
def test_few_record_path_is_byte_identical_to_the_vector_path(topic, tags, data, n, first_counter,
                                                               with_keys):
    """_encode_few (up to STRUCT_PATH_MAX_RECORDS records) against the numpy path, any n."""
    bodies = data.draw(st.lists(st.binary(max_size=300), min_size=n, max_size=n))
    keys_raw = key_column(data.draw(st.lists(KEY, min_size=n, max_size=n)), n) if with_keys else None
    queue_ids = data.draw(st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n) | st.just(3))
    args = (topic.encode(), bodies, queue_ids, keys_raw, tags.encode() if tags is not None else None,
            PREFIX, first_counter, BORN_TS_MS, BORN, STORE)
    few = encode_many._encode_few(*args)
    vector = encode_many._encode_vector(*args)
    assert bytes(few.buf) == bytes(vector.buf)
    assert few.starts.tolist() == vector.starts.tolist() and few.sizes.tolist() == vector.sizes.tolist()
    assert few.starts.dtype == vector.starts.dtype == few.sizes.dtype


def test_few_record_path_refuses_a_bad_host():
    with pytest.raises(BadInputError) as info:
        encode_columns(b"T", [b"x"], 0, keys_raw=None, tags_raw=None, uniq_prefix=PREFIX,
                       first_counter=0, born_ts_ms=BORN_TS_MS, born_host=("not-an-ip", 1),
                       store_host=STORE)
    assert info.value.field == "host"


@settings(max_examples=300, deadline=None)
@given(topic=TOPIC, tags=TAGS, key=st.none() | KEY, body=st.binary(max_size=300),
       queue_id=st.integers(0, 2**31 - 1), counter=st.sampled_from([0, 7, 0xFFFFFF, 0x1000000 + 5]))
def test_one_record_is_byte_identical_to_the_columns_of_one(topic, tags, key, body, queue_id, counter):
    """encode_one (a blocking send's record) against encode_columns of one message."""
    block = UniqKeyBlock(PREFIX, counter, 1)
    expected = columns(topic, [body], [key] if key is not None else None, tags, [queue_id], block)
    got = encode_many.encode_one(topic.encode(), body, queue_id,
                                 key_raw=key.encode() if key is not None else None,
                                 tags_raw=tags.encode() if tags is not None else None, uniq_prefix=PREFIX,
                                 counter=counter, born_ts_ms=BORN_TS_MS, born_host=BORN, store_host=STORE)
    assert type(got) is bytes and got == bytes(expected.buf)


@pytest.mark.parametrize("change, field", [
    ({"topic_raw": b""}, "topic"),
    ({"topic_raw": b"x" * 128}, "topic"),
    ({"uniq_prefix": "ABC"}, "uniq_prefix"),
    ({"key_raw": b"k" * MAX_PROPERTIES_BYTES}, "properties"),
    ({"born_host": ("not-an-ip", 1)}, "host"),
])
def test_one_record_refuses_what_the_columns_refuse(change, field):
    args = {"topic_raw": b"T", "key_raw": b"k", "uniq_prefix": PREFIX, "born_host": BORN, **change}
    with pytest.raises(BadInputError) as info:
        encode_many.encode_one(args.pop("topic_raw"), b"body", 0, tags_raw=None, counter=0,
                               born_ts_ms=BORN_TS_MS, store_host=STORE, **args)
    assert info.value.field == field
