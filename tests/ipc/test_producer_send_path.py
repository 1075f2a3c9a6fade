"""Producer.send is one path: a valid message is checked and encoded once (straight-line, even
the first send to a topic); a bad one is named by engine.message.message_parts, once. A real
supervisor; the encoders and the validator are watched in this process."""

from __future__ import annotations

import pytest

from engine.status import PutStatus
from ipc import one_message
from ipc import producer as producer_module
from ipc.consumer import Consumer
from ipc.producer import Producer
from tests.workers.store_harness import module_store

pytestmark = pytest.mark.slow  # a real supervisor


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    yield from module_store(tmp_path_factory.mktemp("send-path") / "store")


@pytest.fixture
def calls(monkeypatch) -> dict[str, int]:
    """How often each encoder and the validator ran in this process."""
    counted: dict[str, int] = {}

    def watch(module, name: str) -> None:
        real = getattr(module, name)

        def counting(*args, **kwargs):
            counted[name] = counted.get(name, 0) + 1
            return real(*args, **kwargs)
        monkeypatch.setattr(module, name, counting)

    for name in ("encode_columns", "encode_records", "message_parts"):
        watch(producer_module, name)
    watch(one_message, "encode_one")
    return counted


def test_the_first_send_to_a_topic_is_checked_and_encoded_once(store, calls):
    with Producer(store.root) as producer:
        result = producer.send("FIRST_SEND", b"body", keys="k1", queue_id=1)
    assert result.status is PutStatus.PUT_OK, result
    assert calls == {"encode_one": 1}
    with Consumer(store.root, "send-path") as consumer:
        [message] = consumer.pull("FIRST_SEND", 1, 0, 8, timeout_ms=10_000).messages  # waits for dispatch
    assert (message.body, message.keys) == (b"body", ("k1",))


VALIDATED_ONLY = {"message_parts": 1}


@pytest.mark.parametrize(("kwargs", "status", "field", "ran"), [
    ({"topic": "a/b"}, PutStatus.MESSAGE_ILLEGAL, "topic", VALIDATED_ONLY),
    ({"keys": "two words"}, PutStatus.MESSAGE_ILLEGAL, "keys", VALIDATED_ONLY),
    ({"queue_id": 99}, PutStatus.MESSAGE_ILLEGAL, "queue_id", VALIDATED_ONLY),
    ({"body": "not bytes"}, PutStatus.MESSAGE_ILLEGAL, "body", VALIDATED_ONLY),
    # only the encoder sees the properties' length: its one try, then the validator names it
    ({"keys": "k" * 40000}, PutStatus.PROPERTIES_SIZE_EXCEEDED, "properties",
     {"encode_one": 1, "message_parts": 1}),
])
def test_a_bad_message_is_named_by_the_validator_once(store, calls, kwargs, status, field, ran):
    args = {"topic": "BAD_SEND", "body": b"x", **kwargs}
    with Producer(store.root) as producer, store.ctl() as ctl:
        before = ctl.written_pos
        result = producer.send(args.pop("topic"), args.pop("body"), **args)
        assert ctl.written_pos == before
    assert result.status is status and f"invalid {field}" in result.reason, result
    assert calls == ran
