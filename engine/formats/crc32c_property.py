"""mqstore's `__CRC32C` property: the last 20 bytes of every record it writes.

    `__CRC32C` 0x01 <10 decimal digits, MSB first> 0x02

The digits are the CRC32C of record bytes [0, TOTALSIZE - 20). `encode_record` reserves the
property with zero digits, and `seal_crc32c` fills them in once the append has stamped the
record's position and store time; RocketMQ readers see an ordinary property.
"""

from __future__ import annotations

import crc32c

from engine.formats.properties import PROP_CRC32C, SEP_PROP

CRC32C_PREFIX = PROP_CRC32C.encode() + b"\x01"
CRC32C_DIGITS = 10
CRC32C_PROP_SIZE = len(CRC32C_PREFIX) + CRC32C_DIGITS + 1
CRC32C_RESERVED = CRC32C_PREFIX + b"0" * CRC32C_DIGITS + SEP_PROP
assert CRC32C_PROP_SIZE == len(CRC32C_RESERVED) == 20


def read_crc32c_tail(buf, end: int, props_pos: int) -> int | None:
    """The CRC32C value of a well-formed 20-byte __CRC32C tail ending at `end`, else None."""
    if end - props_pos < CRC32C_PROP_SIZE:
        return None
    tail = bytes(buf[end - CRC32C_PROP_SIZE : end])
    digits = tail[len(CRC32C_PREFIX) : -1]
    if not tail.startswith(CRC32C_PREFIX) or not tail.endswith(SEP_PROP) or not digits.isdigit():
        return None
    return int(digits)


def seal_crc32c(buf: bytearray | memoryview, pos: int, crc_pos: int) -> None:
    """Write the CRC32C of buf[pos:crc_pos] (a whole record but its tail) into the tail at crc_pos."""
    with memoryview(buf) as view:
        crc = crc32c.crc32c(view[pos:crc_pos])
    digits_pos = crc_pos + len(CRC32C_PREFIX)
    buf[digits_pos : digits_pos + CRC32C_DIGITS] = b"%010d" % crc
