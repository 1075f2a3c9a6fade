"""One RocketMQ index file, mapped whole: put, select, trim, sync (RocketMQ IndexFile).

The byte layout (header 40 bytes, `slot_count` 4-byte slots, `entry_count` 20-byte entries) and
its codecs are defined once in `engine.formats.index_file`; this module is the file operations on
a mapping of it. A slot holds the newest entry of its chain (0 = empty); each entry holds the
previous entry of the same slot. Entry 0 is never used and `index_count` starts at 1, so a file
holds `entry_count - 1` keys. Header fields are written straight into the mapping, so a read-only
mapping in another process sees them as they change.

Trimming then re-putting the same keys gives the same bytes as never having trimmed (what
survives a trim is decided by `engine.index.trim`), which makes recovery's re-dispatch
idempotent. Writes reserve disk blocks before they touch a page not yet allocated (the header
when a file is created, a slot page when a key first hashes into it: engine.index.slot_pages; the
entries ahead in growing steps: `MappedFile.reserve`), so a full disk gives DiskFullError with nothing
written, never SIGBUS, and a new file costs a page of disk, not its whole slot table.

Hashes collide (the key hash is Java's `String.hashCode`, and `slot = hash % slot_count`), so
`select` returns candidate commit positions; times are whole seconds since the file's begin.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import numpy as np

from engine.errors import (
    CorruptIndexError,
    DiskFullError,
    ReadOnlyStoreError,
    SegmentLayoutError,
    StoreClosedError,
    StoreError,
)
from engine.files.filesystem import DISK_FULL_ERRNOS, PAGE_BYTES
from engine.files.mapped_file import Access, MappedFile, ReadAhead
from engine.formats.index_file import (
    FIRST_INDEX,
    INDEX_ENTRY,
    INDEX_ENTRY_DTYPE,
    INDEX_ENTRY_SIZE,
    INDEX_HEADER,
    INDEX_HEADER_SIZE,
    INT32_MAX,
    SLOT,
    SLOT_DTYPE,
    IndexHeader,
    check_geometry,
    decode_index_header,
    entry_pos,
    header_problem,
    index_file_size,
    slot_pos,
    time_diff_s,
)
from engine.formats.java_hash import index_key_hash
from engine.index.changes import ChangedRanges, TakenRanges
from engine.index.slot_pages import SlotPages, stored_slot_heads
from engine.index.trim import heads_after_trim, kept_count
from engine.tuning import FEW_INDEX_KEYS

_header_unpack, _header_pack = INDEX_HEADER.unpack_from, INDEX_HEADER.pack_into
_slot_unpack, _slot_pack = SLOT.unpack_from, SLOT.pack_into
_entry_unpack, _entry_pack = INDEX_ENTRY.unpack_from, INDEX_ENTRY.pack_into


class IndexFileFullError(StoreError):
    """put_key on a full index file (`is_full`); a shard catches it and rolls to a new file."""


class IndexFile:
    """One RocketMQ index file, mapped whole."""

    def __init__(self, mapped: MappedFile, slot_count: int, entry_count: int, read_fd: int):
        self._mapped = mapped
        self._read_fd = read_fd  # O_RDONLY, for slot reads that must not fault in a hole (select_hash)
        self.slot_count = slot_count
        self.entry_count = entry_count
        self._buf = mapped.buf
        self._wbuf = mapped.buf if mapped.access is Access.READ_WRITE else None
        self._changes = ChangedRanges(slot_count, self.index_count)  # what a sync has to write
        self._slot_pages = SlotPages(slot_count)  # which header and slot pages have disk blocks
        # entry bytes [entry 0, _reserved_end) have disk blocks
        self._reserved_end = entry_pos(slot_count, 0)

    @classmethod
    def create(cls, path: Path, slot_count: int, entry_count: int, seed_commit_pos: int = 0,
               seed_ts_ms: int = 0) -> IndexFile:
        """A new empty file whose begin and end are the seed (RocketMQ seeds with the previous end).

        The header is synced at once, so a file on disk never lacks one after this returns.
        """
        check_geometry(slot_count, entry_count)
        path = Path(path)
        # no read-around: slots are hashed, and it would zero-fill the entries to come
        mapped = MappedFile.create(path, index_file_size(slot_count, entry_count), ReadAhead.OWN_PAGE)
        try:
            mapped.allocate(0, PAGE_BYTES)  # the header's page; slots and entries when first written
        except DiskFullError:
            mapped.delete()
            raise
        _header_pack(mapped.buf, 0, seed_ts_ms, seed_ts_ms, seed_commit_pos, seed_commit_pos, 0, 1)
        mapped.sync(0, INDEX_HEADER_SIZE)
        index_file = cls(mapped, slot_count, entry_count, _open_read_fd(mapped))
        index_file._slot_pages.allocated(0, PAGE_BYTES)
        return index_file

    @classmethod
    def open(cls, path: Path, slot_count: int, entry_count: int, access: Access) -> IndexFile:
        """Map an existing file; a wrong size or an impossible header is a CorruptIndexError."""
        check_geometry(slot_count, entry_count)
        try:
            mapped = MappedFile.open(Path(path), access, index_file_size(slot_count, entry_count),
                                     ReadAhead.OWN_PAGE)  # lookups follow hash chains back
        except SegmentLayoutError as exc:
            raise CorruptIndexError(exc.message, path=str(path)) from None
        problem = header_problem(decode_index_header(mapped.buf), slot_count, entry_count)
        if problem is not None:
            mapped.close()
            raise CorruptIndexError(problem, path=str(path))
        index_file = cls(mapped, slot_count, entry_count, _open_read_fd(mapped))
        # once per open: lookups on pages that hold data then read through the mapping
        for start_pos, end_pos in mapped.data_ranges(0, slot_pos(slot_count)):
            index_file._slot_pages.allocated(start_pos, end_pos)
        return index_file

    # -- header ---------------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        return self._mapped.path

    @property
    def header(self) -> IndexHeader:
        return decode_index_header(self._live_buf())

    @property
    def query_bounds(self) -> tuple[int, int, int]:
        """(index_count, begin_ts_ms, end_ts_ms): what a lookup reads of every file to skip it,
        read from the header without building an IndexHeader (a quarter of a lookup's time)."""
        begin_ts_ms, end_ts_ms, _, _, _, count = _header_unpack(self._live_buf(), 0)
        return count, begin_ts_ms, end_ts_ms

    @property
    def index_count(self) -> int:
        return _header_unpack(self._live_buf(), 0)[5]

    @property
    def is_full(self) -> bool:
        return _header_unpack(self._live_buf(), 0)[5] >= self.entry_count

    @property
    def room(self) -> int:
        """How many more keys fit."""
        return self.entry_count - _header_unpack(self._live_buf(), 0)[5]

    @property
    def begin_ts_ms(self) -> int:
        return _header_unpack(self._live_buf(), 0)[0]

    @property
    def end_ts_ms(self) -> int:
        return _header_unpack(self._live_buf(), 0)[1]

    @property
    def begin_commit_pos(self) -> int:
        return _header_unpack(self._live_buf(), 0)[2]

    @property
    def end_commit_pos(self) -> int:
        return _header_unpack(self._live_buf(), 0)[3]

    @property
    def newest_commit_pos(self) -> int | None:
        """The newest entry's commit_pos, read from the entry (None when the file holds none)."""
        buf = self._live_buf()
        count = _header_unpack(buf, 0)[5]
        return _entry_unpack(buf, entry_pos(self.slot_count, count - 1))[1] if count > 1 else None

    def entries_at_end(self, commit_pos: int) -> int:
        """How many of the newest entries, in a row, point at `commit_pos` (a record's keys)."""
        buf = self._live_buf()
        newest = number = _header_unpack(buf, 0)[5] - 1
        slot_count = self.slot_count
        while number >= FIRST_INDEX and _entry_unpack(buf, entry_pos(slot_count, number))[1] == commit_pos:
            number -= 1
        return newest - number

    # -- put and select (RocketMQ IndexFile.putKey / selectPhyOffset) -----------------------------

    def put_key(self, key: str, commit_pos: int, store_ts_ms: int) -> None:
        """Add `key` (already `topic#key`) at `commit_pos`; IndexFileFullError when full."""
        buf = self._wbuf
        if buf is None:
            self._raise_not_writable()
        begin_ts, _, begin_pos, _, slots_used, count = _header_unpack(buf, 0)
        if count >= self.entry_count:
            raise IndexFileFullError(f"index file is full ({count - 1} keys)", path=str(self.path))
        epos = entry_pos(self.slot_count, count)
        key_hashes = [index_key_hash(key)]
        self._slot_pages.reserve_few(self._mapped, key_hashes)
        if epos + INDEX_ENTRY_SIZE > self._reserved_end:
            self._reserve(epos + INDEX_ENTRY_SIZE)
        self._put_each(buf, key_hashes, [commit_pos], [store_ts_ms], (begin_ts, begin_pos, slots_used, count))

    def put_hashes(self, key_hashes: np.ndarray, commit_positions: np.ndarray,
                   store_ts_ms: np.ndarray) -> int:
        """put_key for many precomputed index_key_hash values, in order; returns how many fit.

        The same bytes as that many put_key calls: chains inside the batch are linked with one
        stable sort by slot. Entries, then slots, then the header are written, as put_key does.
        DiskFullError (nothing written) when the disk has no room for the entries or slots.
        """
        buf = self._wbuf
        if buf is None:
            self._raise_not_writable()
        begin_ts, _, begin_pos, _, slots_used, count = _header_unpack(buf, 0)
        m = max(0, min(len(key_hashes), self.entry_count - count))
        if m == 0:
            return 0
        start = entry_pos(self.slot_count, count)
        end = start + m * INDEX_ENTRY_SIZE
        if m <= FEW_INDEX_KEYS:
            few_hashes = key_hashes[:m].tolist()
            self._slot_pages.reserve_few(self._mapped, few_hashes)
            if end > self._reserved_end:
                self._reserve(end)
            self._put_each(buf, few_hashes, commit_positions[:m].tolist(),
                           store_ts_ms[:m].tolist(), (begin_ts, begin_pos, slots_used, count))
            return m
        hashes, positions = key_hashes[:m].astype(np.int64), commit_positions[:m].astype(np.int64)
        slots = hashes % self.slot_count
        self._slot_pages.reserve_slots(self._mapped, slots)
        if end > self._reserved_end:
            self._reserve(end)
        times = store_ts_ms[:m].astype(np.int64)
        numbers = count + np.arange(m, dtype=np.int64)
        order = np.argsort(slots, kind="stable")
        heads = self._slot_table()
        prev = _chain_links(heads, slots, numbers, order)
        diff_begin = np.full(m, begin_ts, dtype=np.int64)
        if count <= 1:
            begin_ts, begin_pos = int(times[0]), int(positions[0])
            diff_begin[1:] = begin_ts
        diffs = np.where(diff_begin <= 0, 0, np.clip((times - diff_begin) // 1000, 0, INT32_MAX))
        entries = np.empty(m, dtype=INDEX_ENTRY_DTYPE)
        entries["key_hash"], entries["commit_pos"] = hashes, positions
        entries["time_diff_s"], entries["prev_index"] = diffs, prev
        buf[start:end] = entries.tobytes()
        _set_slot_heads(heads, slots, numbers, order)
        _header_pack(buf, 0, begin_ts, int(times[-1]), begin_pos, int(positions[-1]),
                     slots_used + int(np.count_nonzero(prev == 0)), count + m)
        return m

    def _put_each(self, buf, hashes: list[int], positions: list[int], times: list[int],
                  header: tuple[int, int, int, int]) -> None:
        """Put keys one by one with struct (put_key, and put_hashes of a few keys, where numpy's
        fixed cost is more than the keys). `header`: (begin_ts, begin_pos, slots_used, count)
        before the batch; room for the entries is already reserved."""
        begin_ts, begin_pos, slots_used, count = header
        slot_count = self.slot_count
        first_keys = count <= 1  # the file's first key sets its begin, as in put_hashes
        for key_hash, commit_pos, store_ts in zip(hashes, positions, times, strict=True):
            spos = slot_pos(key_hash % slot_count)
            head = _slot_unpack(buf, spos)[0]
            if head <= 0 or head > count:
                head = 0
            # entry, then slot, then header: a concurrent reader never follows a slot to an unwritten entry
            _entry_pack(buf, entry_pos(slot_count, count), key_hash, commit_pos,
                        time_diff_s(store_ts, begin_ts), head)
            _slot_pack(buf, spos, count)
            if first_keys:
                begin_ts, begin_pos, first_keys = store_ts, commit_pos, False
            slots_used += head == 0
            count += 1
        _header_pack(buf, 0, begin_ts, times[-1], begin_pos, positions[-1], slots_used, count)

    def select(self, key: str, begin_ms: int, end_ms: int, max_count: int) -> list[int]:
        """Commit positions of entries with key's hash stored in [begin_ms, end_ms], newest first."""
        return self.select_hash(index_key_hash(key), begin_ms, end_ms, max_count)

    def select_hash(self, key_hash: int, begin_ms: int, end_ms: int, max_count: int) -> list[int]:
        """`select` for a precomputed `index_key_hash` (a shard hashes a key once for all files).

        RocketMQ's chain walk and stop rules, with two corrections that change nothing on a
        sound file: entry 1's time is the header's begin exactly (its own store time; RocketMQ
        adds a time_diff measured from the seed), and a `prev` that does not point to an older
        entry ends the chain (RocketMQ only stops on `prev == current`, so garbage could loop).
        """
        buf = self._live_buf()
        found: list[int] = []
        begin_ts, _, _, _, _, count = _header_unpack(buf, 0)
        if count <= 1 or max_count <= 0:
            return found
        slot_count = self.slot_count
        spos = slot_pos(key_hash % slot_count)
        if self._slot_pages.has_blocks[spos // PAGE_BYTES]:
            index_no = _slot_unpack(buf, spos)[0]
        elif self._wbuf is not None:  # the writer allocates every slot page: one it does not know is a hole
            index_no = 0
        else:  # maybe a hole, or a page the writer allocated since: read it without a fault
            index_no = self._slot_pages.unknown_slot_head(self._read_fd, spos)
        if index_no <= 0 or index_no > count:
            return found
        while len(found) < max_count:
            entry_hash, commit_pos, diff_s, prev = _entry_unpack(buf, entry_pos(slot_count, index_no))
            if diff_s < 0:
                break
            time_read = begin_ts + diff_s * 1000 if index_no > 1 else begin_ts
            if entry_hash == key_hash and begin_ms <= time_read <= end_ms:
                found.append(commit_pos)
            if prev <= 0 or prev >= index_no or time_read < begin_ms:
                break
            index_no = prev
        return found

    # -- trim (DESIGN §5.4) ---------------------------------------------------------------------

    def trim_from(self, cut_pos: int) -> int:
        """Remove every entry with commit_pos >= cut_pos (a suffix); return how many went.

        Entries past the last sync may be garbage after a power loss (unflushed pages read as
        zeros, entries torn at a sector boundary): the kept entries are the longest valid prefix
        below the cut (`index_trim.kept_count`, a forward scan from a durable entry); every slot
        head that points past them is set to its slot's newest kept entry
        (`index_trim.heads_after_trim`); then every entry past them that holds data is zeroed,
        past index_count too. Only bytes that hold data are written, so a trim needs no new disk
        blocks (recovery works on a full disk).

        The end fields come from the last kept entry: end_commit_pos exactly; end_ts_ms as
        begin + time_diff x 1000, which can be up to 999 ms below the true store time (entry 1's
        is exact: it is begin). A file trimmed empty gets the header of a fresh unseeded file.
        """
        if self._wbuf is None:
            self._raise_not_writable()
        old_count = self.index_count
        entries = self._entry_array()
        count = kept_count(entries, self.slot_count, old_count, cut_pos)
        removed = old_count - count
        repaired = self._repair_slot_heads(entries, count)  # walks the chains of the removed entries
        self._zero_entries_from(count)
        if removed or repaired:
            self._rewrite_header_after_trim(count)
        return removed

    def _zero_entries_from(self, count: int) -> None:
        """Zero every entry from `count` on that holds data, past the old index_count too (a power
        loss may have kept entries behind an older header): the bytes past the kept entries must
        be zeros, as the next power loss may revert a page to what they are now."""
        start = entry_pos(self.slot_count, count)
        ranges = self._mapped.data_ranges(start)
        if not ranges or self._mapped.is_zero(start):
            return
        self._mapped.zero_nonzero(start, ranges[-1][1])
        last = -(-(ranges[-1][1] - entry_pos(self.slot_count, 0)) // INDEX_ENTRY_SIZE)
        self._changes.entries_zeroed(count, min(last, self.entry_count))

    def restore_header(self, header: IndexHeader) -> None:
        """Put back the exact header saved before a batch that was taken back (trim_from has
        restored entries and slots, but can only recompute end_ts_ms to the second)."""
        if self._wbuf is None:
            self._raise_not_writable()
        _header_pack(self._wbuf, 0, header.begin_ts_ms, header.end_ts_ms, header.begin_commit_pos,
                     header.end_commit_pos, header.hash_slot_count, header.index_count)
        self._changes.header_changed = True

    def _entry_array(self) -> np.ndarray:
        """Every entry of the file (row n is entry number n), a view of the mapping."""
        return np.frombuffer(self._buf, dtype=INDEX_ENTRY_DTYPE, count=self.entry_count,
                             offset=entry_pos(self.slot_count, 0))

    def _slot_table(self) -> np.ndarray:
        return np.frombuffer(self._buf, dtype=SLOT_DTYPE, count=self.slot_count, offset=slot_pos(0))

    def slot_heads_problem(self, cut_pos: int) -> str | None:
        """Why the slot heads disagree with the header (a page of heads zeroed), checked only where
        `trim_from(cut_pos)` would leave both as they are: its header then counts the non-zero
        heads exactly (hash_slot_count). None when they agree or when the trim rewrites them."""
        count = self.index_count
        heads = stored_slot_heads(self._mapped, self.slot_count)
        if kept_count(self._entry_array(), self.slot_count, count, cut_pos) != count \
                or ((heads < 0) | (heads >= count)).any():
            return None
        used, counted = int(np.count_nonzero(heads)), self.header.hash_slot_count
        return None if used == counted else f"{used} slot heads are set, the header counts {counted}"

    def _repair_slot_heads(self, entries: np.ndarray, count: int) -> bool:
        """Point every slot head outside [0, count) at its slot's newest entry below count."""
        heads = stored_slot_heads(self._mapped, self.slot_count)
        stale = np.flatnonzero((heads < 0) | (heads >= count))
        if not len(stale):
            return False
        # stale heads are set, so their pages have blocks: the write needs none
        self._slot_table()[stale] = heads_after_trim(entries, self.slot_count, stale, heads[stale], count)
        self._changes.header_changed = True
        return True

    def _reserve(self, end_pos: int) -> None:
        """Allocate disk blocks for the entries up to end_pos, in the steps of a region starting
        at entry 0 (DiskFullError if there is no room)."""
        self._reserved_end = self._mapped.reserve(end_pos, entry_pos(self.slot_count, 0))

    def _rewrite_header_after_trim(self, count: int) -> None:
        begin_ts, _, begin_pos, _, _, _ = _header_unpack(self._buf, 0)
        if count <= 1:
            _header_pack(self._buf, 0, 0, 0, 0, 0, 0, 1)
        else:
            _, end_pos, diff_s, _ = _entry_unpack(self._buf, entry_pos(self.slot_count, count - 1))
            end_ts = begin_ts if count == 2 else max(begin_ts, begin_ts + diff_s * 1000)
            slots_used = int(np.count_nonzero(stored_slot_heads(self._mapped, self.slot_count)))
            _header_pack(self._buf, 0, begin_ts, end_ts, begin_pos, end_pos, slots_used, count)
        self._changes.header_changed = True

    # -- lifecycle ------------------------------------------------------------------------------

    def sync(self) -> None:
        """Make what changed since the last sync durable: header and slots, and the new or
        zeroed entries (one fdatasync of the file)."""
        taken = self.take_dirty_ranges()
        if taken is None:
            return
        try:
            self._mapped.sync()
        except BaseException:
            self.untake(taken)
            raise

    def take_dirty_ranges(self) -> TakenRanges | None:
        """The byte ranges changed since the last sync or take (engine.index.changes.ChangedRanges),
        now counted as synced: the caller syncs them (`sync_range`, piece by piece) or gives them
        back with `untake`. None when nothing changed."""
        return None if self._wbuf is None else self._changes.take(self.index_count)

    def untake(self, taken: TakenRanges) -> None:
        """Ranges taken but not all synced are changed again (the next sync or take has them)."""
        self._changes.untake(taken)

    def sync_range(self, start_pos: int, end_pos: int) -> None:
        """Make file bytes [start_pos, end_pos) durable, and no others (a piece of a taken range)."""
        self._mapped.sync_range(start_pos, end_pos)

    def close(self) -> None:
        if self._buf is not None:
            self._buf = self._wbuf = None
            self._close_read_fd()
            self._mapped.close()

    def delete(self) -> None:
        """Unmap and remove the file durably."""
        self._buf = self._wbuf = None
        self._close_read_fd()
        self._mapped.delete()

    def _close_read_fd(self) -> None:
        if self._read_fd >= 0:
            os.close(self._read_fd)
            self._read_fd = -1

    def _live_buf(self) -> memoryview:
        if self._buf is None:
            raise StoreClosedError("index file is closed", path=str(self.path))
        return self._buf

    def _raise_not_writable(self) -> NoReturn:
        self._live_buf()
        raise ReadOnlyStoreError("index file is mapped read-only", path=str(self.path))

    def __repr__(self) -> str:
        state = "closed" if self._buf is None else f"{self.index_count - 1} keys"
        return f"IndexFile({self.path.name}, {state})"


def _chain_links(heads: np.ndarray, slots: np.ndarray, numbers: np.ndarray,
                 order: np.ndarray) -> np.ndarray:
    """prev_index of each new entry: the batch's previous entry in the same slot, else the
    slot's head when it is a valid older entry (0 < head <= the entry's number), else 0.
    `order` sorts the entries by slot, stably."""
    sorted_slots = slots[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = sorted_slots[1:] != sorted_slots[:-1]
    prev_sorted = np.empty(len(order), dtype=np.int64)
    prev_sorted[1:] = numbers[order[:-1]]
    old = heads[sorted_slots[first]].astype(np.int64)
    ok = (old > 0) & (old <= numbers[order][first])
    prev_sorted[first] = np.where(ok, old, 0)
    prev = np.empty(len(order), dtype=np.int64)
    prev[order] = prev_sorted
    return prev


def _set_slot_heads(heads: np.ndarray, slots: np.ndarray, numbers: np.ndarray,
                    order: np.ndarray) -> None:
    """Point each touched slot at its newest entry of the batch (`order`: by slot, stable)."""
    sorted_slots = slots[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = sorted_slots[1:] != sorted_slots[:-1]
    heads[sorted_slots[last]] = numbers[order][last]


def _open_read_fd(mapped: MappedFile) -> int:
    """An O_RDONLY fd of the mapped file; the mapping is closed if the file is gone (a reader
    that lost a race with retention gets FileNotFoundError, as from MappedFile.open)."""
    try:
        return os.open(mapped.path, os.O_RDONLY)
    except OSError:
        mapped.close()
        raise


def raise_if_disk_full(exc: OSError, what: str, path: Path) -> None:
    """ENOSPC/EDQUOT from creating a file or directory is DiskFullError; anything else is not."""
    if exc.errno in DISK_FULL_ERRNOS:
        raise DiskFullError(f"no space left to {what}", path=str(path)) from exc


def is_blank(path: Path, slot_count: int, entry_count: int) -> bool:
    """True for an empty file, or one of the right size with no header and no slots: what a crash
    inside create() leaves (before the ftruncate, or before the header reached the disk)."""
    if path.stat().st_size == 0:
        return True
    try:
        mapped = MappedFile.open(path, Access.READ_ONLY, index_file_size(slot_count, entry_count))
    except SegmentLayoutError:
        return False
    try:
        return mapped.is_zero(0, slot_pos(slot_count))  # the header included, holes not read
    finally:
        mapped.close()
