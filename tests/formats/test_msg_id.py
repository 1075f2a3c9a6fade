"""engine.formats.msg_id: RocketMQ offset msgId round trips, IPv6, malformed ids, host decoding."""

from __future__ import annotations

import pytest

from engine.errors import BadInputError
from engine.formats.msg_id import decode_host, make_msg_id, parse_msg_id


def test_msg_id_is_32_uppercase_hex_and_round_trips():
    msg_id = make_msg_id(("192.168.71.1", 8123), 172)
    assert msg_id == "C0A84701" + "00001FBB" + "00000000000000AC"
    assert parse_msg_id(msg_id) == (("192.168.71.1", 8123), 172)
    assert parse_msg_id(msg_id.lower()) == (("192.168.71.1", 8123), 172)


def test_msg_id_ipv6_is_56_hex():
    msg_id = make_msg_id(("2001:db8::1", 10911), 1 << 40)
    assert len(msg_id) == 56
    assert parse_msg_id(msg_id) == (("2001:db8::1", 10911), 1 << 40)


@pytest.mark.parametrize("msg_id", ["", "ABC", "G" * 32, "C0A84701 0001FBB00000000000000AC", "0" * 33,
                                    "FFFFFFFF" + "00001FBB" + "F" * 16, None])
def test_parse_msg_id_rejects_malformed(msg_id):
    with pytest.raises(BadInputError):
        parse_msg_id(msg_id)


def test_make_msg_id_rejects_bad_host():
    with pytest.raises(BadInputError):
        make_msg_id(("not-an-ip", 1), 0)


def test_decode_host_reads_packed_ipv4_and_ipv6():
    assert decode_host(bytes([192, 168, 71, 1]), 8123) == ("192.168.71.1", 8123)
    assert decode_host(bytes(15) + b"\x01", 10911) == ("::1", 10911)
