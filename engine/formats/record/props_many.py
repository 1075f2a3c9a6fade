"""The properties of many records parsed at once, as properties.decode_properties parses one.

The properties of every record lie end to end in one buffer `u8` (record i's end at
row_ends[i]). A pair is a piece between 0x02 separators whose first 0x01 lies strictly inside
it (non-empty key and value); a later duplicate key wins. Everything is whole-array work: the
separators are found by two scans of the buffer, pieces and keys by searchsorted.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from engine.formats.properties import KEYS_SEPARATOR, SEP_KV, SEP_PROP
from engine.formats.record.arrays import gather, int_view

_SEP_KV, _SEP_PROP, _SPACE = SEP_KV[0], SEP_PROP[0], KEYS_SEPARATOR.encode()[0]
_HEAD_BYTES = 8  # a key head is a key's first 8 bytes as one little-endian int


class Pairs(NamedTuple):
    """The key/value pairs of many records, in record order then position order."""

    rows: np.ndarray  # the record each pair belongs to
    key_starts: np.ndarray
    separators: np.ndarray  # the 0x01 between key and value
    value_ends: np.ndarray

    def where(self, selection: np.ndarray) -> Pairs:
        """The pairs at `selection` (a mask or indexes)."""
        return Pairs(*(column[selection] for column in self))


def split_pairs(u8: np.ndarray, row_ends: np.ndarray) -> Pairs:
    """Every pair of every record, as decode_properties finds them."""
    n = len(row_ends)
    row_starts = np.concatenate([[0], row_ends[:-1]]) if n else row_ends
    p2 = np.flatnonzero(u8 == _SEP_PROP)
    p1 = np.flatnonzero(u8 == _SEP_KV)
    starts = np.concatenate([row_starts, p2 + 1])
    rows = np.concatenate([np.arange(n), np.searchsorted(row_ends, p2, side="right")])
    order = np.argsort(starts, kind="stable")
    starts, rows = starts[order], rows[order]
    keep = rows < n
    starts, rows = starts[keep], rows[keep]
    limit = row_ends[rows]
    nxt = np.searchsorted(p2, starts)
    nxt_pos = p2[np.minimum(nxt, len(p2) - 1)] if len(p2) else limit
    ends = np.where((nxt < len(p2)) & (nxt_pos < limit), nxt_pos, limit)
    j = np.searchsorted(p1, starts)
    kv = p1[np.minimum(j, len(p1) - 1)] if len(p1) else starts
    pair = (j < len(p1)) & (kv > starts) & (kv < ends - 1)
    return Pairs(rows[pair], starts[pair], kv[pair], ends[pair])


def named(u8: np.ndarray, pairs: Pairs, name: bytes) -> np.ndarray:
    """Indexes of the pairs whose key is `name`."""
    cand = np.flatnonzero(pairs.separators - pairs.key_starts == len(name))
    if len(cand):
        keys = gather(u8, pairs.key_starts[cand], len(name))
        cand = cand[(keys == np.frombuffer(name, np.uint8)).all(axis=1)]
    return cand


def last_values(u8: np.ndarray, pairs: Pairs, name: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, value starts, value ends) of property `name` in the records that have it (a later
    duplicate wins, as in a dict)."""
    cand = named(u8, pairs, name)
    rows = pairs.rows[cand]
    last = np.ones(len(cand), dtype=bool)
    last[:-1] = rows[1:] != rows[:-1]
    cand = cand[last]
    return rows[last], pairs.separators[cand] + 1, pairs.value_ends[cand]


def split_tokens(u8: np.ndarray, rows: np.ndarray, starts: np.ndarray, ends: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, starts, ends) of the tokens of the KEYS values u8[starts[i]:ends[i]] of `rows`:
    split on spaces, empty tokens dropped (as properties.split_keys does)."""
    spaces = np.flatnonzero(u8 == _SPACE)
    if not len(starts):
        spaces = spaces[:0]
    inside = np.searchsorted(starts, spaces, side="right") - 1
    spaces = spaces[(inside >= 0) & (spaces < ends[np.maximum(inside, 0)])]
    t_start = np.sort(np.concatenate([starts, spaces + 1]))
    t_end = np.sort(np.concatenate([ends, spaces]))
    nonempty = t_end > t_start
    t_start, t_end = t_start[nonempty], t_end[nonempty]
    t_rows = rows[np.searchsorted(starts, t_start, side="right") - 1] if len(starts) else rows
    return t_rows, t_start, t_end


def key_heads(u8: np.ndarray, pairs: Pairs) -> np.ndarray:
    """Each pair's key head: its first 8 bytes (fewer if shorter) as a little-endian uint64.
    `u8` must hold 8 bytes of padding after the last record."""
    lens = np.minimum(pairs.separators - pairs.key_starts, _HEAD_BYTES).astype(np.uint64)
    masks = np.where(lens >= _HEAD_BYTES, np.uint64(2**64 - 1),
                     (np.uint64(1) << (lens * np.uint64(8))) - np.uint64(1))
    return int_view(u8, "<u8")[pairs.key_starts] & masks


def name_head(name: str) -> tuple[int, np.uint64]:
    """(length, key head) of a key of at most 8 bytes: the head is then the whole key."""
    raw = name.encode()
    assert len(raw) <= _HEAD_BYTES
    return len(raw), np.uint64(int.from_bytes(raw, "little"))


def may_repeat_keys(u8: np.ndarray, pairs: Pairs, heads: np.ndarray) -> bool:
    """True when some record may hold one key twice: same length, first and last 8 bytes
    (exact up to 16 bytes; a longer look-alike only answers True)."""
    if not len(pairs.rows):
        return False
    lens = pairs.separators - pairs.key_starts
    tails = np.where(lens > _HEAD_BYTES,
                     int_view(u8, "<u8")[np.maximum(pairs.separators - _HEAD_BYTES, 0)], np.uint64(0))
    order = np.lexsort((tails, heads, lens, pairs.rows))
    same = np.ones(len(pairs.rows) - 1, dtype=bool)
    for column in (pairs.rows, lens, heads, tails):
        ordered = column[order]
        same &= ordered[1:] == ordered[:-1]
    return bool(same.any())
