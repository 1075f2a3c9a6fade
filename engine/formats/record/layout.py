"""Commitlog record: RocketMQ message format v1 byte for byte (v2 and IPv6 hosts are read too).

The one definition of the record layout: every offset, struct format, size and the numpy
dtype of the codec derive from `HEADER_LAYOUT` below. All numbers big-endian. Offsets are from
the record start with IPv4 born and store hosts (an IPv6 host is 20 bytes instead of 8 and
shifts every later field by HOST_V6_SHIFT = 12).

    off  size  field               notes
      0     4  TOTALSIZE           whole record, this field included
      4     4  MAGICCODE           0xDAA320A7 (v1) / 0xDAA320AB (v2: TOPICLENGTH is 2 bytes)
      8     4  BODYCRC             zlib CRC-32 of the body & 0x7FFFFFFF
     12     4  QUEUEID
     16     4  FLAG                user flag, as given
     20     8  QUEUEOFFSET         stamped at append
     28     8  PHYSICALOFFSET      the record's commit_pos, stamped at append
     36     4  SYSFLAG             SysFlag bits
     40     8  BORNTIMESTAMP       ms
     48   4+4  BORNHOST            IPv4 + port (16+4 with SysFlag.BORNHOST_V6)
     56     8  STORETIMESTAMP      ms, stamped at append
     64   4+4  STOREHOST           IPv4 + port (16+4 with SysFlag.STOREHOST_V6)
     72     4  RECONSUMETIMES
     76     8  PREPAREDTXOFFSET
     84     4  BODYLENGTH
     88     B  BODY
   88+B   1|2  TOPICLENGTH         signed byte (v1) / signed short (v2)
      .     T  TOPIC               UTF-8
      .     2  PROPERTIESLENGTH    signed short, <= 32767
      .     P  PROPERTIES          key 0x01 value 0x02 ..., mqstore's last 20 bytes are
                                   `__CRC32C` 0x01 <10 decimal digits, MSB first> 0x02: the
                                   CRC32C of record bytes [0, TOTALSIZE-20)

TOTALSIZE = 91 + B + T + P (v1, IPv4/IPv4). End-of-file filler: TOTALSIZE = space left in
the segment, MAGICCODE 0xCBD43194, 8 bytes written. The __CRC32C tail is defined in
`crc32c_property`, the msgId a record is known by (store host + commit_pos) in `msg_id`.
"""

from __future__ import annotations

import re
import struct
from enum import IntEnum, IntFlag

import numpy as np

from engine.errors import BadInputError
from engine.formats.crc32c_property import CRC32C_PROP_SIZE
from engine.status import PutStatus

MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
BLANK_MAGIC = 0xCBD43194

# The fixed header of a v1 record with IPv4 hosts, field by field: (name, struct code).
HEADER_LAYOUT = (
    ("total_size", "i"), ("magic", "I"), ("body_crc", "i"), ("queue_id", "i"), ("flag", "i"),
    ("queue_offset", "q"), ("commit_pos", "q"), ("sys_flag", "i"), ("born_ts_ms", "q"),
    ("born_ip", "4s"), ("born_port", "i"), ("store_ts_ms", "q"), ("store_ip", "4s"),
    ("store_port", "i"), ("reconsume_times", "i"), ("prepared_tx_offset", "q"), ("body_length", "i"),
)
HEADER_FIELDS = tuple(name for name, _ in HEADER_LAYOUT)
_NUMPY_CODES = {"b": "i1", "h": ">i2", "i": ">i4", "I": ">u4", "q": ">i8"}


def _fmt(first: str, stop: str | None = None) -> str:
    """The struct format of the header fields from `first` up to (not including) `stop`."""
    lo = HEADER_FIELDS.index(first)
    hi = HEADER_FIELDS.index(stop) if stop else len(HEADER_FIELDS)
    return ">" + "".join(code for _, code in HEADER_LAYOUT[lo:hi])


def dtype_of(struct_fmt: str, names: tuple[str, ...]) -> np.dtype:
    """A numpy structured dtype with the layout of a big-endian struct format."""
    codes = re.findall(r"(\d*)([a-zA-Z])", struct_fmt.lstrip(">"))
    kinds = [f"S{count}" if code == "s" else _NUMPY_CODES[code] for count, code in codes]
    return np.dtype(list(zip(names, kinds, strict=True)))


V4_HEADER_FMT = _fmt("total_size")
V4_HEADER_SIZE = struct.calcsize(V4_HEADER_FMT)
# TOTALSIZE .. BORNTIMESTAMP: the fields before the first host, where IPv6 shifts nothing.
RECORD_HEAD_FMT = _fmt("total_size", "born_ip")
RECORD_HEAD_SIZE = struct.calcsize(RECORD_HEAD_FMT)
# RECONSUMETIMES PREPAREDTXOFFSET BODYLENGTH: after the store host.
RECORD_MID_FMT = _fmt("reconsume_times")
RECORD_MID_SIZE = struct.calcsize(RECORD_MID_FMT)
HOST_V4_FMT = _fmt("born_ip", "store_ts_ms")
HOST_V4_SIZE = struct.calcsize(HOST_V4_FMT)
HOST_V6_FMT, HOST_V6_SIZE = ">16si", 20
HOST_V6_SHIFT = HOST_V6_SIZE - HOST_V4_SIZE  # how far an IPv6 host moves what follows it
FILLER_FMT = _fmt("total_size", "body_crc")  # TOTALSIZE MAGICCODE
FILLER_SIZE = struct.calcsize(FILLER_FMT)
TOPIC_LENGTH_SIZE_V1, TOPIC_LENGTH_SIZE_V2, PROPERTIES_LENGTH_SIZE = 1, 2, 2
TOPIC_LENGTH_SHIFT_V2 = TOPIC_LENGTH_SIZE_V2 - TOPIC_LENGTH_SIZE_V1
RECORD_FIXED_SIZE = V4_HEADER_SIZE + TOPIC_LENGTH_SIZE_V1 + PROPERTIES_LENGTH_SIZE

HEADER_DTYPE = dtype_of(V4_HEADER_FMT, HEADER_FIELDS)
FIELD_OFFSETS = {name: HEADER_DTYPE.fields[name][1] for name in HEADER_FIELDS}
FIELD_INDEX = {name: i for i, name in enumerate(HEADER_FIELDS)}  # in an unpacked header tuple

# Byte offsets of fields from the record start (IPv4 born and store hosts).
TOTAL_SIZE_OFFSET = FIELD_OFFSETS["total_size"]
MAGIC_OFFSET = FIELD_OFFSETS["magic"]
BODY_CRC_OFFSET = FIELD_OFFSETS["body_crc"]
QUEUE_ID_OFFSET = FIELD_OFFSETS["queue_id"]
FLAG_OFFSET = FIELD_OFFSETS["flag"]
QUEUE_OFFSET_OFFSET = FIELD_OFFSETS["queue_offset"]
PHYSICAL_OFFSET_OFFSET = FIELD_OFFSETS["commit_pos"]
SYS_FLAG_OFFSET = FIELD_OFFSETS["sys_flag"]
BORN_TS_OFFSET = FIELD_OFFSETS["born_ts_ms"]
BORN_HOST_OFFSET = FIELD_OFFSETS["born_ip"]
STORE_TS_OFFSET = FIELD_OFFSETS["store_ts_ms"]
STORE_TS_OFFSET_BORN_V6 = STORE_TS_OFFSET + HOST_V6_SHIFT
STORE_HOST_OFFSET = FIELD_OFFSETS["store_ip"]
RECONSUME_TIMES_OFFSET = FIELD_OFFSETS["reconsume_times"]
PREPARED_TX_OFFSET_OFFSET = FIELD_OFFSETS["prepared_tx_offset"]
BODY_LENGTH_OFFSET = FIELD_OFFSETS["body_length"]
BODY_OFFSET = V4_HEADER_SIZE

# The table above, checked against the derived values.
assert (RECORD_HEAD_SIZE, V4_HEADER_SIZE, RECORD_MID_SIZE, HOST_V4_SIZE, FILLER_SIZE) == (48, 88, 16, 8, 8)
assert struct.calcsize(HOST_V6_FMT) == HOST_V6_SIZE and RECORD_FIXED_SIZE == 91
assert (QUEUE_OFFSET_OFFSET, PHYSICAL_OFFSET_OFFSET, SYS_FLAG_OFFSET, BORN_HOST_OFFSET) == (20, 28, 36, 48)
assert (STORE_TS_OFFSET, STORE_TS_OFFSET_BORN_V6, BODY_LENGTH_OFFSET, BODY_OFFSET) == (56, 68, 84, 88)
assert HEADER_DTYPE.itemsize == V4_HEADER_SIZE

MAX_TOPIC_BYTES = 127  # v1 TOPICLENGTH is a signed byte
MAX_PROPERTIES_BYTES = 32767  # PROPERTIESLENGTH is a signed short
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
BODY_CRC_MASK = 0x7FFFFFFF
# Every record and every filler starts with its 4-byte big-endian TOTALSIZE: what walkers read.
TOTAL_SIZE_FIELD = struct.Struct(_fmt("total_size", "magic"))


def check_properties_bytes(props_bytes: int) -> None:
    """The one PROPERTIESLENGTH rule of every encoder: properties of `props_bytes` (the CRC32C
    tail included) fit a signed short; past it a put gets PROPERTIES_SIZE_EXCEEDED. Hot paths
    compare inline and call this only past the limit."""
    if props_bytes > MAX_PROPERTIES_BYTES:
        raise BadInputError("properties", f"{props_bytes - CRC32C_PROP_SIZE} bytes plus the "
                            f"{CRC32C_PROP_SIZE}-byte CRC32C property exceed {MAX_PROPERTIES_BYTES}",
                            put_status=PutStatus.PROPERTIES_SIZE_EXCEEDED)


class SysFlag(IntFlag):
    """SYSFLAG bits (RocketMQ MessageSysFlag); the transaction type is the 0xC field."""

    COMPRESSED = 0x1
    MULTI_TAGS = 0x2
    TRANSACTION_PREPARED = 0x4
    TRANSACTION_COMMIT = 0x8
    TRANSACTION_ROLLBACK = 0xC
    BORNHOST_V6 = 0x10
    STOREHOST_V6 = 0x20
    NEED_UNWRAP = 0x40
    INNER_BATCH = 0x80


TX_TYPE_MASK = 0xC
COMPRESSION_TYPE_MASK = 0x700
# Plain ints: IntFlag arithmetic is slow on hot paths.
BORNHOST_V6 = int(SysFlag.BORNHOST_V6)
STOREHOST_V6 = int(SysFlag.STOREHOST_V6)
HOSTS_V6 = BORNHOST_V6 | STOREHOST_V6
SYS_FLAG_LOW_BYTE_OFFSET = SYS_FLAG_OFFSET + 3  # SYSFLAG is big-endian: the host bits are in this byte
assert HOSTS_V6 < 0x100


class TxType(IntEnum):
    """Transaction type held in SYSFLAG bits 2-3; only NOT and COMMIT enter consume queues."""

    NOT = 0x0
    PREPARED = 0x4
    COMMIT = 0x8
    ROLLBACK = 0xC


def tx_type(sys_flag: int) -> TxType:
    """The transaction type of a SYSFLAG value."""
    return TxType(sys_flag & TX_TYPE_MASK)
