"""engine.formats.record.props_many and hosts: many records' properties, hosts and msgIds equal
what the scalar codec (decode_properties, split_keys, make_msg_id) gives each."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.formats.msg_id import make_msg_id
from engine.formats.properties import decode_properties, split_keys
from engine.formats.record import encode_record
from engine.formats.record.hosts import Host, host_texts, msg_id_digits, packed_hosts
from engine.formats.record.props_many import last_values, split_pairs, split_tokens

_PIECE = st.text(alphabet="ab \x01\x02", max_size=6)
_NAMES = ("a", "b", "ab", "a b")


def _blob(raws: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    return np.frombuffer(b"".join(raws), dtype=np.uint8), np.cumsum([len(r) for r in raws])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_PIECE, max_size=5).map("\x02".join), min_size=1, max_size=6))
def test_last_values_and_tokens_agree_with_the_scalar_parser(texts):
    raws = [text.encode() for text in texts]
    u8, row_ends = _blob(raws)
    pairs = split_pairs(u8, row_ends)
    expected = [decode_properties(raw) for raw in raws]
    for name in _NAMES:
        rows, starts, ends = last_values(u8, pairs, name.encode())
        got = {row: u8[s:e].tobytes().decode() for row, s, e in zip(rows, starts, ends, strict=True)}
        assert got == {i: props[name] for i, props in enumerate(expected) if name in props}
        t_rows, t_start, t_end = split_tokens(u8, rows, starts, ends)
        tokens: dict[int, list[str]] = {}
        for row, s, e in zip(t_rows.tolist(), t_start.tolist(), t_end.tolist(), strict=True):
            tokens.setdefault(row, []).append(u8[s:e].tobytes().decode())
        assert tokens == {row: list(split_keys(value)) for row, value in got.items() if split_keys(value)}


def test_hosts_and_msg_ids_equal_the_scalar_ones():
    rnd = random.Random(3)
    records, starts, at = [], [], 0
    for i in range(40):
        born = (f"10.{rnd.randrange(256)}.{rnd.randrange(256)}.{rnd.randrange(256)}", rnd.randrange(2**31))
        store = (f"192.168.{i % 3}.{rnd.randrange(256)}", rnd.choice([10911, 2**31 - 1, 0]))
        records.append((born, store, encode_record("T", b"x", queue_id=0, born_ts_ms=1, born_host=born,
                                                   store_host=store)))
        starts.append(at)
        at += len(records[-1][2])
    u8 = np.frombuffer(b"".join(raw for _, _, raw in records), dtype=np.uint8)
    starts_at = np.array(starts, dtype=np.int64)
    for host, pick in ((Host.BORN, 0), (Host.STORE, 1)):
        texts, inverse = host_texts(packed_hosts(u8, starts_at, host))
        assert [texts[i] for i in inverse] == [f"{r[pick][0]}:{r[pick][1]}" for r in records]
    commit_pos = np.array([rnd.randrange(2**40) for _ in records], dtype=np.int64)
    digits = msg_id_digits(packed_hosts(u8, starts_at, Host.STORE), commit_pos)
    assert [row.tobytes().decode() for row in digits] == [
        make_msg_id(store, pos) for (_, store, _), pos in zip(records, commit_pos.tolist(), strict=True)]
