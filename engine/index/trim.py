"""What an index file keeps when it is trimmed to a commit position after a crash (DESIGN §5.4).

Entries past the last sync may be anything a power loss leaves: zero pages, and torn entries (a
disk writes 512-byte sectors atomically, not pages, so a 20-byte entry that straddles two sectors
may have one part written and not the other). Walking back from `index_count` is fooled by a
torn entry that happens to look plausible after zeroed ones. So the kept entries are the longest
valid prefix below the cut, found by a forward scan that starts at an entry known to be durable;
and a slot head that points past the kept entries is walked back along its chain only through
entries that cannot be torn, else looked up among the kept entries.

Everything here reads the file's entry array (a numpy view where entry number n is row n) and
never writes; `IndexFile.trim_from` applies the result. Work is bounded by what lies past the
durable entries, except a slot whose chain cannot be trusted, which costs a backward scan of the
kept entries (after a power loss, at most once per trim).
"""

from __future__ import annotations

import bisect

import numpy as np

from engine.formats.index_file import INDEX_ENTRY_SIZE, entry_pos

SECTOR_BYTES = 512  # the unit a disk writes atomically
_ANCHOR_WINDOW_ENTRIES = 4096
_FIRST_SCAN_ENTRIES = 1024
_MAX_SCAN_ENTRIES = 1 << 16
_CHAIN_STEPS = 32  # links a stale slot head is walked back before it is looked up instead
_LOOKUP_WINDOW_ENTRIES = 1 << 20


def kept_count(entries: np.ndarray, slot_count: int, count: int, cut_pos: int) -> int:
    """The index_count after trimming entries [1, count) to `cut_pos`: the end of the longest
    prefix of valid entries (see `_valid`) that all point below cut_pos.

    A binary search for cut_pos gives an upper bound (the entries below the durable position are
    sorted; whatever lies past them can only make the search land late, but a damaged entry
    below it that the search meets makes it land early: ShardIndex.trim_for_recovery re-indexes
    what that takes), a backward look from there finds an entry that is durable, and the forward
    scan from it finds the first invalid."""
    if count <= 1:
        return 1
    positions = entries["commit_pos"]
    upper = 1 + bisect.bisect_left(range(1, count), cut_pos, key=lambda n: int(positions[n]))
    anchor = _durable_anchor(entries, upper, cut_pos)
    return _first_invalid(entries, slot_count, anchor, count, cut_pos)


def _durable_anchor(entries: np.ndarray, upper: int, cut_pos: int) -> int:
    """An entry number below which every entry is durable: the first of the last pair of adjacent
    plausible entries in order before `upper` (1 if none).

    Past the durable entries, an entry is a zero, a whole new one (at or past the durable
    position, so not below the cut when the cut is that position) or torn; two torn entries are
    never adjacent (they straddle sector boundaries 512 bytes apart), so such a pair ends at most
    one entry past the durable ones and its first entry is durable."""
    hi, width = upper, _ANCHOR_WINDOW_ENTRIES
    while hi > 2:
        lo = max(1, hi - width)
        ok = _plausible(entries, lo, hi, cut_pos)
        positions = entries["commit_pos"][lo:hi]
        pairs = np.flatnonzero(ok[:-1] & ok[1:] & (positions[1:] >= positions[:-1]))
        if len(pairs):
            return lo + int(pairs[-1])
        hi, width = lo + 1, width * 2
    return 1


def _first_invalid(entries: np.ndarray, slot_count: int, start: int, count: int, cut_pos: int) -> int:
    """The first entry number in [start, count) that is not `_valid` (count if none)."""
    lo, step = start, _FIRST_SCAN_ENTRIES
    while lo < count:
        hi = min(count, lo + step)
        bad = np.flatnonzero(~_valid(entries, slot_count, lo, hi, cut_pos))
        if len(bad):
            return lo + int(bad[0])
        lo, step = hi, min(step * 8, _MAX_SCAN_ENTRIES)
    return count


def _plausible(entries: np.ndarray, lo: int, hi: int, cut_pos: int) -> np.ndarray:
    """Per entry of [lo, hi): fields a writer can produce, pointing below cut_pos, not all zero."""
    rows = entries[lo:hi]
    key_hash, commit_pos = rows["key_hash"].astype(np.int64), rows["commit_pos"].astype(np.int64)
    diff_s, prev = rows["time_diff_s"].astype(np.int64), rows["prev_index"].astype(np.int64)
    numbers = np.arange(lo, hi, dtype=np.int64)
    written = (key_hash != 0) | (commit_pos != 0) | (diff_s != 0) | (prev != 0)
    return (written & (key_hash >= 0) & (commit_pos >= 0) & (commit_pos < cut_pos) & (diff_s >= 0)
            & (prev >= 0) & (prev < numbers))


def _valid(entries: np.ndarray, slot_count: int, lo: int, hi: int, cut_pos: int) -> np.ndarray:
    """`_plausible`, in commit order after entry lo - 1, and linked as put_key links: prev is the
    previous entry of the same slot when [lo, hi) holds one, else an older entry of that slot
    (or 0)."""
    ok = _plausible(entries, lo, hi, cut_pos)
    positions = entries["commit_pos"][lo:hi].astype(np.int64)
    before = int(entries["commit_pos"][lo - 1]) if lo > 1 else -1
    ok &= positions >= np.concatenate(([before], positions[:-1]))
    numbers = np.arange(lo, hi, dtype=np.int64)
    slots = entries["key_hash"][lo:hi].astype(np.int64) % slot_count
    prev = entries["prev_index"][lo:hi].astype(np.int64)
    order = np.argsort(slots, kind="stable")
    same = slots[order][1:] == slots[order][:-1]
    expected = np.full(hi - lo, -1, dtype=np.int64)  # -1: no older entry of the slot in [lo, hi)
    expected[order[1:][same]] = numbers[order[:-1][same]]
    inside = expected >= 0
    ok &= np.where(inside, prev == expected, prev < lo)
    older = np.flatnonzero(~inside & (prev > 0) & (prev < lo))
    if len(older):
        ok[older] &= entries["key_hash"][prev[older]].astype(np.int64) % slot_count == slots[older]
    return ok


def heads_after_trim(entries: np.ndarray, slot_count: int, slots: np.ndarray, heads: np.ndarray,
                     count: int) -> np.ndarray:
    """The new head of each of `slots` (whose `heads` point at or past `count`): its newest entry
    below count, 0 if it has none."""
    new_heads = heads.astype(np.int64)
    untrusted = _walk_back(entries, slot_count, slots, new_heads, count)
    if untrusted.any():
        new_heads[untrusted] = _newest_below(entries, slot_count, slots[untrusted], count)
    return new_heads


def _walk_back(entries: np.ndarray, slot_count: int, slots: np.ndarray, heads: np.ndarray,
               count: int) -> np.ndarray:
    """Follow each head's chain (in place) down below count through entries that cannot be torn;
    returns which slots could not be resolved that way."""
    untrusted = (heads < 0) | (heads >= len(entries))
    for _ in range(_CHAIN_STEPS):
        idx = np.flatnonzero(~untrusted & (heads >= count))
        if not len(idx):
            break
        numbers = heads[idx]
        rows = entries[numbers]
        key_hash, prev = rows["key_hash"].astype(np.int64), rows["prev_index"].astype(np.int64)
        diff_s = rows["time_diff_s"].astype(np.int64)
        trusted = (_not_torn(entries, numbers, slot_count) & (key_hash >= 0)
                   & (key_hash % slot_count == slots[idx]) & (prev >= 0) & (prev < numbers)
                   & (diff_s >= 0) & ((prev > 0) | (diff_s > 0)))  # prev 0 and time 0: maybe a zeroed tail
        untrusted[idx[~trusted]] = True
        heads[idx[trusted]] = prev[trusted]
    else:
        untrusted |= heads >= count
    found = np.flatnonzero(~untrusted & (heads > 0))
    if len(found):
        wrong_slot = entries["key_hash"][heads[found]].astype(np.int64) % slot_count != slots[found]
        untrusted[found[wrong_slot]] = True
    return untrusted


def _not_torn(entries: np.ndarray, numbers: np.ndarray, slot_count: int) -> np.ndarray:
    """Entries that cannot be torn: inside one 512-byte sector (written whole or not at all), or
    straddling two where each part has a non-zero byte or shares its sector with a non-zero
    neighbour (the entry before lies wholly in the first sector, the one after in the second): a
    sector that was not written reads as zeros throughout."""
    starts = entry_pos(slot_count, 0) + numbers * INDEX_ENTRY_SIZE
    split = SECTOR_BYTES - starts % SECTOR_BYTES  # bytes of the entry in its first sector
    raw = entries.view(np.uint8).reshape(-1, INDEX_ENTRY_SIZE)
    written = raw[numbers] != 0
    in_first = np.arange(INDEX_ENTRY_SIZE) < split[:, None]
    before_written = (numbers > 1) & raw[np.maximum(numbers - 1, 0)].any(axis=1)
    after_written = (numbers + 1 < len(raw)) & raw[np.minimum(numbers + 1, len(raw) - 1)].any(axis=1)
    first_ok = (written & in_first).any(axis=1) | before_written
    second_ok = (written & ~in_first).any(axis=1) | after_written
    return (split >= INDEX_ENTRY_SIZE) | (first_ok & second_ok)


def _newest_below(entries: np.ndarray, slot_count: int, slots: np.ndarray, count: int) -> np.ndarray:
    """The newest entry number below count of each of `slots` (0 if none), scanning back in windows
    until every slot is found."""
    unique = np.unique(slots)
    newest = np.zeros(len(unique), dtype=np.int64)
    wanted = np.zeros(slot_count, dtype=bool)
    wanted[unique] = True
    left, hi = len(unique), count
    while hi > 1 and left:
        lo = max(1, hi - _LOOKUP_WINDOW_ENTRIES)
        window_slots = entries["key_hash"][lo:hi].astype(np.int32) % np.int32(slot_count)
        hits = np.flatnonzero(wanted[window_slots])
        if len(hits):
            found, last = np.unique(window_slots[hits][::-1], return_index=True)
            newest[np.searchsorted(unique, found)] = (lo + hits[::-1])[last]
            wanted[found] = False
            left -= len(found)
        hi = lo
    return newest[np.searchsorted(unique, slots)]
