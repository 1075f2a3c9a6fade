"""Born and store hosts of many records with IPv4 hosts, and the msgIds of their store hosts.

A host is its IP (4 bytes) then its port (4, big-endian), so one big-endian 8-byte read is
(ip << 32 | port): one gather per record and host. Text comes from msg_id.decode_host, once per
distinct host (a store has few); a msgId's 32 hex digits (msg_id.make_msg_id: ip, port,
commit_pos) come from the nibbles of the packed store host and the commit position.
"""

from __future__ import annotations

import struct
from enum import Enum

import numpy as np

from engine.formats.msg_id import decode_host
from engine.formats.record.arrays import int_view
from engine.formats.record.layout import FIELD_OFFSETS

_IP_BYTES = 4
_PORT = struct.Struct(">i")
_HEX_U8 = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_NIBBLE_SHIFTS = np.arange(60, -4, -4, dtype=np.int64)  # 16 hex digits of a 64-bit value, MSB first
_NIBBLE_SHIFTS_U = _NIBBLE_SHIFTS.astype(np.uint64)
MSG_ID_V4_CHARS = 32  # 4 + 4 + 8 bytes


class Host(Enum):
    """Which host of a record."""

    BORN = "born"
    STORE = "store"


for _host in Host:
    assert FIELD_OFFSETS[f"{_host.value}_port"] == FIELD_OFFSETS[f"{_host.value}_ip"] + _IP_BYTES


def packed_hosts(u8: np.ndarray, starts: np.ndarray, host: Host) -> np.ndarray:
    """(ip << 32 | unsigned port) of the `host` of each IPv4-host record at `starts` (uint64)."""
    return int_view(u8, ">u8")[starts + FIELD_OFFSETS[f"{host.value}_ip"]].astype(np.uint64)


def host_texts(packed: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The `ip:port` text of each distinct packed host, and each record's index into them."""
    distinct, inverse = np.unique(packed, return_inverse=True)
    texts = []
    for value in distinct.tolist():
        ip, port = decode_host((value >> 32).to_bytes(_IP_BYTES, "big"),
                               _PORT.unpack((value & 0xFFFFFFFF).to_bytes(4, "big"))[0])
        texts.append(f"{ip}:{port}")
    return texts, inverse.ravel()


def msg_id_digits(store_packed: np.ndarray, commit_pos: np.ndarray) -> np.ndarray:
    """make_msg_id of each IPv4 store host and commit position: (n, 32) upper-case hex digits."""
    digits = np.empty((len(commit_pos), MSG_ID_V4_CHARS), dtype=np.uint8)
    half = MSG_ID_V4_CHARS // 2
    digits[:, :half] = _HEX_U8[(store_packed[:, None] >> _NIBBLE_SHIFTS_U) & np.uint64(0xF)]
    digits[:, half:] = _HEX_U8[(commit_pos[:, None] >> _NIBBLE_SHIFTS) & 0xF]
    return digits
