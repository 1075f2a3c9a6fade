"""engine.message.message_parts, the one message validator of the store and the Producer, and
the put status a BadInputError carries from where it is raised (no caller reads the reason).

tests/ipc/test_producer.py::test_bad_input_gets_a_status_and_changes_nothing runs the same
validator in a real Producer against a real supervisor.
"""

from __future__ import annotations

import pytest

from engine.errors import BadInputError
from engine.formats.record import MAX_PROPERTIES_BYTES, encode_record
from engine.formats.record.encode_many import encode_columns, encode_one, encode_records
from engine.formats.record.layout import FILLER_SIZE
from engine.formats.store_meta import MAX_QUEUE_COUNT
from engine.message import Message, PutLimits, message_parts, topic_bytes
from engine.status import PutStatus
from engine.store import MessageStore
from tests.engine.test_bad_input import BAD_PUTS, CONFIG
from tests.helpers import SEGMENT_BYTES, TOPIC, snapshot

UNIQ = "0" * 32
# as the store's: queue ids bounded by the largest queue count; each topic's own count is the
# topic table's rule (tests/engine/topics/test_topic_table.py)
LIMITS = PutLimits(MAX_QUEUE_COUNT, CONFIG.max_body_bytes, SEGMENT_BYTES - FILLER_SIZE,
                   f"a commitlog segment of {SEGMENT_BYTES} bytes")
HOSTS = {"born_ts_ms": 1, "born_host": ("127.0.0.1", 1), "store_host": ("127.0.0.1", 10911)}
BIG = "v" * MAX_PROPERTIES_BYTES


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One store for the module: a refused put changes nothing (tests/engine/test_bad_input.py)."""
    with MessageStore.open(tmp_path_factory.mktemp("parts") / "store", CONFIG) as opened:
        yield opened


@pytest.mark.parametrize("name", sorted(set(BAD_PUTS) - {"queue_id_too_big"}))
def test_the_validator_refuses_each_bad_put_with_the_status_the_store_gives(store, name):
    """The store's put answers with exactly the validator's error: its status and its text."""
    message, status, field = BAD_PUTS[name]
    with pytest.raises(BadInputError) as refused:
        message_parts(message, UNIQ, LIMITS)
    assert refused.value.put_status is status and field in str(refused.value)
    [result] = store.put_batch([message])
    assert (result.status, result.reason) == (status, str(refused.value))


def test_a_valid_message_gives_its_parts_and_leaves_the_queue_to_the_caller():
    topic_raw, body, props_raw, queue_id = message_parts(Message(TOPIC, b"x", keys=("k",)), UNIQ, LIMITS)
    assert (topic_raw, body, queue_id) == (TOPIC.encode(), b"x", None)
    assert props_raw == f"KEYS\x01k\x02UNIQ_KEY\x01{UNIQ}\x02".encode()
    assert message_parts(Message(TOPIC, b"x", queue_id=3), UNIQ, LIMITS)[3] == 3
    assert topic_bytes(TOPIC) == TOPIC.encode()


def test_a_record_larger_than_its_room_is_refused_naming_the_room():
    small = PutLimits(4, 1000, 200, "a mailbox slot of 200 bytes")
    with pytest.raises(BadInputError, match="does not fit a mailbox slot of 200 bytes") as refused:
        message_parts(Message(TOPIC, b"x" * 150), UNIQ, small)
    assert refused.value.put_status is PutStatus.MESSAGE_ILLEGAL and refused.value.field == "body"


def test_a_put_of_something_that_is_not_a_message_is_refused_and_changes_nothing(store):
    before = snapshot(store.root)
    [result] = store.put_batch([(TOPIC, b"x")])
    assert result.status is PutStatus.MESSAGE_ILLEGAL and "not a Message" in result.reason
    assert snapshot(store.root) == before


ENCODERS = {
    "encode_record": lambda: encode_record(TOPIC, b"x", queue_id=0, properties={"p": BIG}, **HOSTS),
    "encode_records": lambda: encode_records([b"T"], [b"x"], [BIG.encode()], [0], **HOSTS),
    "encode_columns_few": lambda: encode_columns(b"T", [b"x"], 0, keys_raw=[BIG.encode()], tags_raw=None,
                                                 uniq_prefix="0" * 26, first_counter=0, **HOSTS),
    "encode_columns_many": lambda: encode_columns(b"T", [b"x"] * 40, 0, keys_raw=[BIG.encode()] * 40,
                                                  tags_raw=None, uniq_prefix="0" * 26, first_counter=0,
                                                  **HOSTS),
    "encode_one": lambda: encode_one(b"T", b"x", 0, key_raw=BIG.encode(), tags_raw=None,
                                     uniq_prefix="0" * 26, counter=0, **HOSTS),
    "message_parts": lambda: message_parts(Message(TOPIC, b"x", properties={"p": BIG}), UNIQ, LIMITS),
}


@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_every_encoder_refuses_too_many_properties_as_properties_size_exceeded(name):
    with pytest.raises(BadInputError, match=f"exceed {MAX_PROPERTIES_BYTES}") as refused:
        ENCODERS[name]()
    assert refused.value.field == "properties"
    assert refused.value.put_status is PutStatus.PROPERTIES_SIZE_EXCEEDED


def test_bad_input_is_message_illegal_unless_raised_otherwise():
    assert BadInputError("topic", "no").put_status is PutStatus.MESSAGE_ILLEGAL
