"""engine.formats.crc32c_property: the reserved tail, sealing, and reading a tail back."""

from __future__ import annotations

import crc32c

from engine.formats.crc32c_property import (
    CRC32C_DIGITS,
    CRC32C_PREFIX,
    CRC32C_PROP_SIZE,
    CRC32C_RESERVED,
    read_crc32c_tail,
    seal_crc32c,
)


def test_reserved_tail_is_the_rocketmq_property_with_zero_digits():
    assert CRC32C_RESERVED == b"__CRC32C\x01" + b"0" * 10 + b"\x02"
    assert (len(CRC32C_PREFIX), CRC32C_DIGITS, CRC32C_PROP_SIZE) == (9, 10, 20)


def test_seal_writes_crc_of_the_bytes_before_the_tail_and_read_returns_it():
    buf = bytearray(b"some record bytes" + CRC32C_RESERVED)
    crc_pos = len(buf) - CRC32C_PROP_SIZE
    assert read_crc32c_tail(buf, len(buf), 0) == 0
    seal_crc32c(buf, 0, crc_pos)
    want = crc32c.crc32c(b"some record bytes")
    assert buf[crc_pos:] == CRC32C_PREFIX + b"%010d" % want + b"\x02"
    assert read_crc32c_tail(buf, len(buf), 0) == want


def test_read_returns_none_for_a_malformed_or_short_tail():
    good = b"x" + CRC32C_RESERVED
    assert read_crc32c_tail(good, len(good), 1) == 0
    assert read_crc32c_tail(good, len(good), 2) is None  # properties shorter than the tail
    for bad in (good[:-1] + b"\x03", good.replace(b"__CRC32C", b"__CRC32D"), good[:12] + b"a" + good[13:]):
        assert read_crc32c_tail(bad, len(bad), 1) is None
