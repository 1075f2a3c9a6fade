"""`engine.check.fsck`, the index part: every record key is found by `ShardIndex.query`; every entry
resolves to a record start with a key of that hash in that shard, and carries the time its
writer computed from that record's store time; slot heads and chains agree with the entries.
A key not found that routine recovery indexes again is pending (engine.check.pending).
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import numpy as np

from engine.check.commitlog import LogScan
from engine.check.findings import FindingKind, FindingList
from engine.check.pending import PendingWork
from engine.errors import SegmentLayoutError, StoreError
from engine.files.mapped_file import Access, MappedFile
from engine.files.naming import INDEX_DIR, is_index_file_name
from engine.formats.index_file import (
    INDEX_ENTRY_DTYPE,
    INT32_MAX,
    IndexHeader,
    decode_index_header,
    entry_pos,
    index_file_size,
    slot_pos,
    time_diff_s,
)
from engine.formats.record import Record
from engine.index.shard import ShardIndex
from engine.index.slot_pages import stored_slot_heads

_FILE_KINDS = (FindingKind.INDEX_FILE_CORRUPT, FindingKind.INDEX_ENTRY_UNRESOLVED,
               FindingKind.INDEX_ENTRY_TIME)


class KeyProbe:
    """Looks every record key up through ShardIndex.query while the log is scanned: first in
    the record's own store time (the tightest query a reader can make), then unbounded."""

    def __init__(self, root: Path, slot_count: int, entry_count: int, shard_count: int):
        self.shards: list[ShardIndex | None] = []
        self.unreadable: dict[int, str] = {}
        self.unchecked: dict[int, int] = defaultdict(int)
        self.missing: list[tuple[int, str, int]] = []  # (shard, detail, commit_pos)
        for shard in range(shard_count):
            try:
                self.shards.append(ShardIndex.load(root, shard, slot_count, entry_count, Access.READ_ONLY))
            except StoreError as exc:
                self.shards.append(None)
                self.unreadable[shard] = exc.message

    def probe(self, record: Record, by_shard: dict[int, list[str]]) -> None:
        pos, ts = record.commit_pos, record.store_ts_ms
        for shard, keys in by_shard.items():
            index = self.shards[shard]
            if index is None:
                self.unchecked[shard] += len(keys)
                continue
            for key in keys:
                if pos in index.query(record.topic, key, ts, ts, INT32_MAX):
                    continue
                if pos in index.query(record.topic, key, 0, None, INT32_MAX):
                    continue  # found, only not within its own store time (INDEX_ENTRY_TIME says why)
                self.missing.append((shard, f"key {record.topic}#{key} of the record at {pos} "
                                            "is not found", pos))

    def close(self) -> None:
        for index in self.shards:
            if index is not None:
                index.close()


def check_index(root: Path, slot_count: int, entry_count: int, shard_count: int, scan: LogScan,
                keys: KeyProbe, out: FindingList, pending: PendingWork) -> None:
    """Every shard's files, oldest first, and the keys the probe did not find."""
    base = root / INDEX_DIR
    if base.is_dir():
        for entry in sorted(base.iterdir()):
            if not (entry.is_dir() and entry.name.isdigit() and int(entry.name) < shard_count
                    and str(int(entry.name)) == entry.name):
                out.add(FindingKind.LAYOUT, entry, f"not an index shard directory (0..{shard_count - 1})")
    a = scan.arrays
    for shard in range(shard_count):
        directory = base / str(shard)
        mine = a["key_shard"] == shard
        order = np.lexsort((a["key_hash"][mine], a["key_pos"][mine]))
        exp_pos, exp_hash = a["key_pos"][mine][order], a["key_hash"][mine][order]
        # A shard's first file was created unseeded unless older files were deleted by retention
        # (then the log no longer starts at 0); each later one is seeded with its predecessor's end.
        seed_ts_ms = 0 if scan.min_pos == 0 else None
        for path in _index_files(directory, slot_count, out):
            seed_ts_ms = _check_index_file(path, slot_count, entry_count, exp_pos, exp_hash, seed_ts_ms,
                                           scan, out)
            for kind in _FILE_KINDS:
                out.close_group(kind, path)
        if keys.unchecked.get(shard):
            out.add(FindingKind.INDEX_KEY_MISSING, directory, f"{keys.unchecked[shard]} keys not checked: "
                    f"the shard cannot be opened ({keys.unreadable[shard]})")
        for _, detail, pos in (m for m in keys.missing if m[0] == shard):
            if pending.shard_covers(shard, pos):
                pending.add(FindingKind.INDEX_KEY_MISSING, directory, detail, [pos])
            else:
                out.add(FindingKind.INDEX_KEY_MISSING, directory, detail, pos)
        out.close_group(FindingKind.INDEX_KEY_MISSING, directory)
        pending.close_group(FindingKind.INDEX_KEY_MISSING, directory)


def expected_time_diffs_s(store_ts_ms: np.ndarray, begin_ts_ms: int) -> np.ndarray:
    """formats.index_file.time_diff_s over an array: what the writer stores for these times."""
    if begin_ts_ms <= 0:
        return np.zeros(len(store_ts_ms), dtype=np.int64)
    return np.clip((store_ts_ms.astype(np.int64) - begin_ts_ms) // 1000, 0, INT32_MAX)


def _index_files(directory: Path, slot_count: int, out: FindingList) -> list[Path]:
    """The shard's index files in name order; a blank last file (a crash inside create, which
    the reader ignores and the writer removes) is skipped."""
    if not directory.is_dir():
        return []
    paths = []
    for name in sorted(os.listdir(directory)):
        if is_index_file_name(name):
            paths.append(directory / name)
        else:
            out.add(FindingKind.LAYOUT, directory / name, "not an index file name")
    if paths and _is_blank(paths[-1], slot_count):
        paths.pop()
    return paths


def _is_blank(path: Path, slot_count: int) -> bool:
    with open(path, "rb") as f:
        return not any(f.read(slot_pos(slot_count)))


def _check_index_file(path: Path, slot_count: int, entry_count: int, exp_pos: np.ndarray,
                      exp_hash: np.ndarray, seed_ts_ms: int | None, scan: LogScan,
                      out: FindingList) -> int | None:
    """Check one file whose creation seed was `seed_ts_ms` (None: unknown); return its end_ts_ms,
    the next file's seed (None when the file cannot be read)."""
    try:
        mapped = MappedFile.open(path, Access.READ_ONLY, index_file_size(slot_count, entry_count))
    except SegmentLayoutError as exc:
        out.add(FindingKind.INDEX_FILE_CORRUPT, path, exc.message)
        return None
    try:
        header = decode_index_header(mapped.buf)
        if not 1 <= header.index_count <= entry_count:
            out.add(FindingKind.INDEX_FILE_CORRUPT, path,
                    f"index_count {header.index_count} outside [1, {entry_count}]")
            return None
        n = header.index_count - 1
        heads = stored_slot_heads(mapped, slot_count).astype(np.int64)
        entries = np.frombuffer(mapped.buf, dtype=INDEX_ENTRY_DTYPE, count=n, offset=entry_pos(slot_count, 1))
        hashes = entries["key_hash"].astype(np.int64)
        positions = entries["commit_pos"].astype(np.int64)
        diffs = entries["time_diff_s"].astype(np.int64)
        prevs = entries["prev_index"].astype(np.int64)
        del entries
        _check_chains(path, heads, hashes, prevs, slot_count, out)
        resolved = _check_entries_resolve(path, hashes, positions, exp_pos, exp_hash, scan, out)
        _check_entry_times(path, header, seed_ts_ms, positions, diffs, resolved, scan, out)
        return header.end_ts_ms
    finally:
        mapped.close()


def _check_chains(path: Path, heads: np.ndarray, hashes: np.ndarray, prevs: np.ndarray,
                  slot_count: int, out: FindingList) -> None:
    """Entry i's prev must be the previous entry of its slot (0 for the first) and each slot's
    head its newest entry: what put_key builds, so every entry is reachable from its slot."""
    n = len(hashes)
    numbers = np.arange(1, n + 1)
    slots = np.mod(hashes, slot_count)
    order = np.lexsort((numbers, slots))
    s_sorted, i_sorted = slots[order], numbers[order]
    same = np.zeros(n, dtype=bool)
    same[1:] = s_sorted[1:] == s_sorted[:-1]
    expected_prev = np.zeros(n, dtype=np.int64)
    expected_prev[order[1:]] = np.where(same[1:], i_sorted[:-1], 0)
    expected_heads = np.zeros(slot_count, dtype=np.int64)
    last_of_slot = np.ones(n, dtype=bool)
    last_of_slot[:-1] = ~same[1:]
    expected_heads[s_sorted[last_of_slot]] = i_sorted[last_of_slot]
    bad_links = np.flatnonzero((prevs != expected_prev) | (hashes < 0))
    bad_heads = np.flatnonzero(heads != expected_heads)
    if len(bad_links) or len(bad_heads):
        first_link = f"entry {int(bad_links[0]) + 1}" if len(bad_links) else "-"
        first_head = f"slot {int(bad_heads[0])}" if len(bad_heads) else "-"
        out.add(FindingKind.INDEX_FILE_CORRUPT, path, f"{len(bad_links)} chain links and {len(bad_heads)} "
                f"slot heads disagree with the entries (first: {first_link}, {first_head})")


def _check_entries_resolve(path: Path, hashes: np.ndarray, positions: np.ndarray, exp_pos: np.ndarray,
                           exp_hash: np.ndarray, scan: LogScan, out: FindingList) -> np.ndarray:
    """Each live entry points at a record start with a key of that hash (in this shard); returns
    which entries do."""
    left = np.searchsorted(exp_pos, positions, side="left")
    right = np.searchsorted(exp_pos, positions, side="right")
    match = np.zeros(len(positions), dtype=bool)
    if len(exp_pos):
        for k in range(int((right - left).max(initial=0))):
            at = np.minimum(left + k, len(exp_pos) - 1)
            match |= (left + k < right) & (exp_hash[at] == hashes)
    live = positions >= scan.min_pos
    for i in np.flatnonzero(live & ~match):
        pos = int(positions[i])
        if pos in scan.bad_starts:
            continue  # the record itself is reported (CORRUPT_RECORD / TORN_TAIL)
        why = ("past the end of valid data" if pos >= scan.data_end else
               "a record start without a key of that hash" if scan.is_boundary(pos) else
               "not a record start")
        out.add(FindingKind.INDEX_ENTRY_UNRESOLVED, path,
                f"entry {i + 1} (hash {int(hashes[i])}, pos {pos}): {why}", pos)
    return match


def _check_entry_times(path: Path, header: IndexHeader, seed_ts_ms: int | None, positions: np.ndarray,
                       diffs: np.ndarray, resolved: np.ndarray, scan: LogScan, out: FindingList) -> None:
    """Each resolved entry's time_diff_s is what IndexFile.put_key / put_hashes wrote for its
    record's store time: time_diff_s(store_ts_ms, begin), begin being entry 1's store time, which
    the header keeps as begin_ts_ms (a reader takes an entry's time as begin + time_diff_s x 1000,
    entry 1's as begin). Entry 1's own time_diff_s was measured from the file's creation seed:
    0 for an unseeded file (or one trimmed empty and refilled), else from the previous file's end."""
    idx = np.flatnonzero(resolved)
    if len(idx) == 0:
        return
    a = scan.arrays
    store_ts = a["store_ts_ms"][np.searchsorted(a["pos"], positions[idx])]
    entry_one = idx[0] == 0  # entry 1 resolves: its record's store time is the writer's begin
    begin_ts_ms = int(store_ts[0]) if entry_one else header.begin_ts_ms
    bad = diffs[idx] != expected_time_diffs_s(store_ts, begin_ts_ms)
    if entry_one:
        if header.begin_ts_ms != begin_ts_ms:
            out.add(FindingKind.INDEX_ENTRY_TIME, path, f"header begin_ts_ms {header.begin_ts_ms} is not "
                    f"the store time {begin_ts_ms} of entry 1's record: every entry's time reads wrong",
                    int(positions[0]))
        if seed_ts_ms is None:
            bad[0] = diffs[0] < 0
        else:
            bad[0] = int(diffs[0]) not in (0, time_diff_s(begin_ts_ms, seed_ts_ms))
    wrong = np.flatnonzero(bad)
    for k in wrong[:out.cap]:
        i, pos = int(idx[k]), int(positions[idx[k]])
        out.add(FindingKind.INDEX_ENTRY_TIME, path, f"entry {i + 1} (pos {pos}): time_diff_s {int(diffs[i])}"
                f" is not what the writer stores for its record's store time {int(store_ts[k])} ms "
                f"(file begin {begin_ts_ms} ms)", pos)
    out.count_more(FindingKind.INDEX_ENTRY_TIME, path, len(wrong) - len(wrong[:out.cap]))
