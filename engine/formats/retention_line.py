"""Retention line: the commit position retention has removed the commitlog up to (16 bytes).

    off  size  field
      0     4  magic        0x4D51524C "MQRL"
      4     8  min_pos      retention removed every segment below it and none at or above it
     12     4  crc32c       CRC32C of bytes [0, 12)

Retention writes it before it removes a segment, so the log never starts above it unless
something else removed segments (DESIGN §4: a store never shrinks by surprise). The file is
rewritten in place (its 16 bytes lie in one sector; a torn one fails its CRC).
"""

from __future__ import annotations

import struct

import crc32c

from engine.errors import BadInputError, CheckpointError

RETENTION_LINE_MAGIC = 0x4D51524C  # "MQRL"
RETENTION_LINE_FMT = ">Iq"  # magic, min_pos
RETENTION_LINE_BODY_SIZE = 12
RETENTION_LINE_SIZE = 16  # the body and its CRC32C
_BODY = struct.Struct(RETENTION_LINE_FMT)
_CRC = struct.Struct(">I")
assert _BODY.size == RETENTION_LINE_BODY_SIZE == RETENTION_LINE_SIZE - _CRC.size


def encode_retention_line(min_pos: int) -> bytes:
    """The file image of a line at `min_pos`."""
    if type(min_pos) is not int or min_pos < 0:
        raise BadInputError("min_pos", f"{min_pos!r} is not a commit position")
    body = _BODY.pack(RETENTION_LINE_MAGIC, min_pos)
    return body + _CRC.pack(crc32c.crc32c(body))


def decode_retention_line(data: bytes) -> int:
    """The line's min_pos; CheckpointError for a file of another size, magic or CRC."""
    if len(data) != RETENTION_LINE_SIZE:
        raise CheckpointError(f"retention line is {len(data)} bytes, not {RETENTION_LINE_SIZE}")
    magic, min_pos = _BODY.unpack_from(data)
    if magic != RETENTION_LINE_MAGIC:
        raise CheckpointError(f"retention line magic 0x{magic:08X} is not 0x{RETENTION_LINE_MAGIC:08X}")
    if _CRC.unpack_from(data, RETENTION_LINE_BODY_SIZE)[0] != crc32c.crc32c(data[:RETENTION_LINE_BODY_SIZE]):
        raise CheckpointError("retention line fails its CRC32C")
    if min_pos < 0:
        raise CheckpointError(f"retention line holds a negative position {min_pos}")
    return min_pos
