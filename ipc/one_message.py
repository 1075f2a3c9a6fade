"""A blocking send of one message as straight-line code: its columns taken apart, its checks
made inline and its record from encode_many.encode_one (docs/DECISIONS.md#one-message-send).

Nothing here raises for bad input: what these functions cannot check or refuse gets None, and
ipc.producer.Producer then sends that message by the general path, which names what is wrong.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.errors import BadInputError
from engine.formats.record.encode_many import encode_one
from engine.formats.uniq_key import reserve_uniq_keys
from engine.message import key_bytes, tags_text

_SEQUENCES = (list, tuple)


def one_message(bodies: object, keys: object, queue_ids: object) -> tuple[object, object, object] | None:
    """send_columns' columns as (body, key or None, queue id or None) when they hold exactly
    one message given as lists or tuples (or an int queue id), else None. Nothing is checked."""
    if type(bodies) not in _SEQUENCES or len(bodies) != 1:
        return None
    if keys is None:
        key = None
    elif type(keys) in _SEQUENCES and len(keys) == 1:
        key = keys[0]
    else:
        return None
    if queue_ids is None or type(queue_ids) is int:
        return bodies[0], key, queue_ids
    if type(queue_ids) in _SEQUENCES and len(queue_ids) == 1:
        return bodies[0], key, queue_ids[0]
    return None


def one_record(topic: str, topic_raw: bytes, body: object, key: object, tags: object, queue_id: object, *,
               max_body_bytes: int, queue_count: int, round_robin: Callable[[str, int], int],
               born_host: tuple[str, int], store_host: tuple[str, int]) -> bytes | None:
    """The record of one valid message to `topic` (`topic_raw`: its checked UTF-8; key: one str
    or None; queue_id: an int, or None for `round_robin(topic, 1)`), or None for anything else."""
    if type(body) is not bytes or len(body) > max_body_bytes:
        return None
    key_raw = None
    if key is not None:
        key_raw = key_bytes(key)
        if key_raw is None:
            return None
    tags_raw = None
    if tags is not None:
        try:
            tags_raw = tags_text(tags)
        except BadInputError:
            return None
    if queue_id is None:
        queue_id = round_robin(topic, 1)
    elif type(queue_id) is not int or not 0 <= queue_id < queue_count:
        return None
    uniq_prefix, counter = reserve_uniq_keys(1)
    try:
        return encode_one(topic_raw, body, queue_id, key_raw=key_raw, tags_raw=tags_raw,
                          uniq_prefix=uniq_prefix, counter=counter, born_ts_ms=time.time_ns() // 1_000_000,
                          born_host=born_host, store_host=store_host)
    except BadInputError:
        return None
