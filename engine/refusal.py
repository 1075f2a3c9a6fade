"""Why the supervisor refused a producer's record, as a code its answer row can carry back.

The supervisor's check (workers.request_check) raises RecordRefusedError with a `Refusal` and
up to two numbers: the limit the record broke and what the record had. A refused record's
answer row carries the three (ipc.mailbox REFUSAL_DTYPE), and the producer turns them into the
same words with `describe_refusal`, so its MESSAGE_ILLEGAL says why the record was refused.
The codes travel through shared memory: their numbers are fixed.
"""

from __future__ import annotations

import os
from enum import IntEnum

from engine.errors import RecordRefusedError
from engine.status import PutStatus


class Refusal(IntEnum):
    """What a refused record broke; UNSAID for a row that names nothing (no code written)."""

    UNSAID = 0
    MALFORMED_REQUEST = 1
    TOO_SHORT = 2
    SEGMENT_FIT = 3
    TOTAL_SIZE = 4
    MAGIC = 5
    IPV6_HOSTS = 6
    TRANSACTION = 7
    QUEUE_ID = 8
    BODY_SIZE = 9
    STRUCTURE = 10
    CRC32C_SLOT = 11
    BODY_CRC = 12
    PROPERTIES_UTF8 = 13
    TOPIC = 14
    TOPIC_UNKNOWN = 15
    TOPIC_NOT_WRITABLE = 16
    WRITE_QUEUE = 17
    TOPIC_NOT_WRITTEN = 18  # SERVICE_NOT_AVAILABLE or DISK_FULL, not MESSAGE_ILLEGAL: found is the errno


# (field named in the error, the words with {limit} and {found})
_WORDS: dict[Refusal, tuple[str, str]] = {
    Refusal.UNSAID: ("record", "the supervisor refused the record"),
    Refusal.MALFORMED_REQUEST: ("request", "the request's records are not framed by their TOTALSIZE"),
    Refusal.TOO_SHORT: ("record", "{found} bytes is too short for a record (at least {limit})"),
    Refusal.SEGMENT_FIT: ("record", "{found} bytes does not fit a commitlog segment, which holds "
                          "records of at most {limit} bytes"),
    Refusal.TOTAL_SIZE: ("record", "TOTALSIZE {found} but {limit} bytes"),
    Refusal.MAGIC: ("record", "magic 0x{found:08X} is not message version 1"),
    Refusal.IPV6_HOSTS: ("record", "IPv6 host flags are not accepted from producers"),
    Refusal.TRANSACTION: ("record", "SYSFLAG 0x{found:X} marks a transaction PREPARED or ROLLBACK "
                          "record; mqstore stores no transactional half messages"),
    Refusal.QUEUE_ID: ("queue_id", "{found} is outside 0..{limit_less_one}"),
    Refusal.BODY_SIZE: ("body", "BODYLENGTH {found} exceeds {limit}"),
    Refusal.STRUCTURE: ("record", "its field lengths do not add up to its TOTALSIZE"),
    Refusal.CRC32C_SLOT: ("record", "properties do not end with the reserved __CRC32C slot"),
    Refusal.BODY_CRC: ("body", "BODYCRC does not match the body"),
    Refusal.PROPERTIES_UTF8: ("properties", "are not valid UTF-8"),
    Refusal.TOPIC: ("topic", "is not a valid topic name"),
    Refusal.TOPIC_UNKNOWN: ("topic", "no such topic, and auto_create_topic is off (`mqstore topic create`)"),
    Refusal.TOPIC_NOT_WRITABLE: ("topic", "its perm {found} does not allow writes (`mqstore topic "
                                 "update --perm rw`)"),
    Refusal.WRITE_QUEUE: ("queue_id", "{found} is not one of the topic's {limit} write queues "
                          "(0..{limit_less_one})"),
    Refusal.TOPIC_NOT_WRITTEN: ("topic", "creating it failed: config/topics.json was not written "
                                "(errno {found}: {strerror}); nothing was stored"),
}
assert set(_WORDS) == set(Refusal)


def refused(refusal: Refusal, *, limit: int = 0, found: int = 0, detail: str | None = None,
            put_status: PutStatus = PutStatus.MESSAGE_ILLEGAL) -> RecordRefusedError:
    """The error for a refused record; `detail` replaces the words in the supervisor's own
    message when it knows more than the code says (which field lengths disagree). `put_status`:
    the record's status, MESSAGE_ILLEGAL unless the store, not the record, is at fault."""
    field, _ = _WORDS[refusal]
    return RecordRefusedError(field, detail or _words(refusal, limit, found), refusal=int(refusal),
                              limit=limit, found=found, put_status=put_status)


def describe_refusal(code: int, limit: int, found: int) -> str:
    """What a producer says of a record refused with this row: 'invalid <field>: <words>'."""
    try:
        refusal = Refusal(code)
    except ValueError:  # a newer supervisor's code: say that much
        return f"the supervisor refused the record (reason code {code})"
    if refusal is Refusal.UNSAID:
        return _WORDS[refusal][1]
    if refusal is Refusal.TOPIC_NOT_WRITTEN:  # the store's fault, not an invalid record
        return f"topic {_words(refusal, limit, found)}"
    return f"invalid {_WORDS[refusal][0]}: {_words(refusal, limit, found)}"


def _words(refusal: Refusal, limit: int, found: int) -> str:
    strerror = os.strerror(found) if refusal is Refusal.TOPIC_NOT_WRITTEN and 0 < found < 2**31 else "?"
    return _WORDS[refusal][1].format(limit=limit, found=found, limit_less_one=limit - 1, strerror=strerror)
