"""engine.formats.record.layout: one field table, and every offset, format and dtype from it."""

from __future__ import annotations

import random
import struct

import numpy as np

from engine.formats.record import layout


def test_offsets_are_rocketmq_v1():
    """The byte offsets of RocketMQ's message format v1 (IPv4 hosts), field by field."""
    got = [layout.FIELD_OFFSETS[name] for name in layout.HEADER_FIELDS] + [layout.BODY_OFFSET]
    assert got == [0, 4, 8, 12, 16, 20, 28, 36, 40, 48, 52, 56, 64, 68, 72, 76, 84, 88]
    assert (layout.TOTAL_SIZE_OFFSET, layout.MAGIC_OFFSET, layout.PHYSICAL_OFFSET_OFFSET,
            layout.STORE_TS_OFFSET, layout.BODY_LENGTH_OFFSET) == (0, 4, 28, 56, 84)
    assert layout.RECORD_FIXED_SIZE == 91 and layout.FILLER_SIZE == 8


def test_ipv6_and_v2_shifts_derive_from_the_sizes():
    assert layout.HOST_V6_SHIFT == layout.HOST_V6_SIZE - layout.HOST_V4_SIZE == 12
    assert layout.STORE_TS_OFFSET_BORN_V6 == layout.STORE_TS_OFFSET + 12
    assert layout.TOPIC_LENGTH_SHIFT_V2 == 1
    head, host, mid = (struct.calcsize(f) for f in (layout.RECORD_HEAD_FMT, layout.HOST_V4_FMT,
                                                    layout.RECORD_MID_FMT))
    assert head + host + 8 + host + mid == layout.V4_HEADER_SIZE


def test_the_dtype_reads_what_the_struct_format_packs():
    rnd = random.Random(5)
    values = []
    for _, code in layout.HEADER_LAYOUT:
        if code == "4s":
            values.append(rnd.randbytes(4))
        else:
            bits = struct.calcsize(code) * 8
            low = 0 if code == "I" else -(2 ** (bits - 1))
            values.append(rnd.randrange(low, low + 2**bits))
    raw = struct.pack(layout.V4_HEADER_FMT, *values)
    row = np.frombuffer(raw, dtype=layout.HEADER_DTYPE)[0]
    assert [row[name].item() for name in layout.HEADER_FIELDS] == values
    assert struct.unpack(layout.V4_HEADER_FMT, raw) == tuple(values)
    assert layout.TOTAL_SIZE_FIELD.unpack_from(raw)[0] == values[0]
