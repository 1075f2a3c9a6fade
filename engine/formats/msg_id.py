"""RocketMQ's offset msgId (store host + commit position in hex) and the host address decoding it
shares with records.

    msgId = hex upper( store IP (4 or 16 bytes) | port (4, big-endian) | commit_pos (8, big-endian) )

so 32 hex characters for an IPv4 store host, 56 for IPv6.
"""

from __future__ import annotations

import socket
import struct
from functools import lru_cache

from engine.errors import BadInputError

MSG_ID_TAIL_FMT = ">iq"  # port, commit_pos
MSG_ID_TAIL_SIZE = 12
assert struct.calcsize(MSG_ID_TAIL_FMT) == MSG_ID_TAIL_SIZE
_MSG_ID_TAIL = struct.Struct(MSG_ID_TAIL_FMT)


@lru_cache(maxsize=1024)
def decode_host(ip: bytes, port: int) -> tuple[str, int]:
    """(text address, port) of a packed IPv4 (4 bytes) or IPv6 (16 bytes) host; cached, as a store
    has few distinct hosts and every decoded record carries two."""
    return socket.inet_ntop(socket.AF_INET if len(ip) == 4 else socket.AF_INET6, ip), port


def make_msg_id(store_host: tuple[str, int], commit_pos: int) -> str:
    """RocketMQ's offset msgId: uppercase hex of store IP, port (4) and commit position (8)."""
    ip, port = store_host
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        packed = socket.inet_pton(family, ip) + _MSG_ID_TAIL.pack(port, commit_pos)
    except (OSError, struct.error, TypeError):
        raise BadInputError("store_host", f"{store_host!r} / {commit_pos!r} cannot form a msgId") from None
    return packed.hex().upper()


def parse_msg_id(msg_id: str) -> tuple[tuple[str, int], int]:
    """Inverse of make_msg_id: ((store ip, port), commit_pos); BadInputError if malformed."""
    if not isinstance(msg_id, str) or len(msg_id) not in (32, 56):
        raise BadInputError("msg_id", f"{msg_id!r} is not 32 or 56 hex characters")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise BadInputError("msg_id", f"{msg_id!r} is not hexadecimal") from None
    if len(raw) * 2 != len(msg_id):
        raise BadInputError("msg_id", f"{msg_id!r} is not hexadecimal")
    ip_size = len(raw) - _MSG_ID_TAIL.size
    port, commit_pos = _MSG_ID_TAIL.unpack_from(raw, ip_size)
    if commit_pos < 0:
        raise BadInputError("msg_id", f"{msg_id!r} holds a negative commit position")
    return decode_host(raw[:ip_size], port), commit_pos
