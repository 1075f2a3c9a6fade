"""An index shard: the ordered index files of one shard, put with rolls, queried, trimmed, expired.

Files live in `<root>/index/<shard>/<yyyyMMddHHmmssSSS>`, oldest first; each is an
`engine.index.file.IndexFile`. A key belongs to shard CRC32C(`topic#key`) % shard_count.

The index is derived: it can always be rebuilt from the commitlog. Recovery instead trims a shard
back to its durable position (`trim_from`, DESIGN §5.4) and re-dispatches from there. A shard
takes back the keys a batch already put when a later part of it meets a full disk, so the batch
can simply be retried.

A query returns candidate commit positions (hashes collide); the caller reads each record back
and keeps exact topic and key matches. Times are stored as whole seconds since a file's begin, so
a query may also return positions up to `TIME_SLACK_MS` before `begin_ms` (RocketMQ #5174); a
caller that needs exact bounds compares the record's store time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from engine.errors import DiskFullError, ReadOnlyStoreError, SegmentLayoutError, StoreClosedError
from engine.files.filesystem import ensure_dir, remove_file
from engine.files.mapped_file import Access, settled_names
from engine.files.naming import index_file_name, index_shard_dir, is_index_file_name
from engine.formats.index_file import IndexHeader, check_geometry, index_key
from engine.formats.java_hash import index_key_hash
from engine.index.file import IndexFile, IndexFileFullError, is_blank, raise_if_disk_full
from engine.index.sync import PacedSync

INT64_MAX = 2**63 - 1
TIME_SLACK_MS = 1000  # time_diff is whole seconds: a stored time is up to 999 ms below the true one
DEFAULT_MAX_COUNT = 64  # RocketMQ maxMsgsNumBatch



def _name_after(name: str) -> str:
    """The index file name 1 ms after `name` (naive calendar arithmetic, so always sorts after)."""
    stamp = datetime.strptime(name[:14], "%Y%m%d%H%M%S") + timedelta(milliseconds=int(name[14:]) + 1)
    return stamp.strftime("%Y%m%d%H%M%S") + f"{stamp.microsecond // 1000:03d}"


class ShardIndex:
    """The index files of one shard, `<root>/index/<shard>/<yyyyMMddHHmmssSSS>`, oldest first.

    `processed_pos` is the commit position up to which records are indexed in this shard; the
    caller advances it with `mark_processed` after putting a record's keys. `load` knows no
    position (it starts at 0): recovery calls `trim_for_recovery(durable_pos)`, which sets it.
    """

    def __init__(self, directory: Path, shard: int, slot_count: int, entry_count: int,
                 access: Access, clock_ms: Callable[[], int] | None = None):
        check_geometry(slot_count, entry_count)
        self.directory = Path(directory)
        self.shard = shard
        self.slot_count = slot_count
        self.entry_count = entry_count
        self.access = access
        self._clock_ms = clock_ms
        self._files: list[IndexFile] = []
        self._processed_pos = 0
        self._closed = False
        self._paced: PacedSync | None = None

    @classmethod
    def load(cls, root: Path, shard: int, slot_count: int, entry_count: int, access: Access, *,
             clock_ms: Callable[[], int] | None = None) -> ShardIndex:
        """Open the shard's files in name order. A last file left blank by a crash inside
        create() is removed (read-write) or ignored (read-only), and so is a `.tmp` file
        (settled_names); any other bad file raises. A reader that finds a listed file gone
        lost a race with retention (it deletes from the front): that file and the ones before
        it are forgotten."""
        index = cls(index_shard_dir(root, shard), shard, slot_count, entry_count, access, clock_ms)
        if not index.directory.is_dir():
            return index
        names = settled_names(index.directory, access)
        for name in names:
            if not is_index_file_name(name):
                raise SegmentLayoutError(f"foreign file {name!r} among index files",
                                         path=str(index.directory / name))
        if names and is_blank(index.directory / names[-1], slot_count, entry_count):
            if access is Access.READ_WRITE:
                remove_file(index.directory / names[-1])
            names.pop()
        try:
            for name in names:
                try:
                    index._files.append(IndexFile.open(index.directory / name, slot_count,
                                                       entry_count, access))
                except FileNotFoundError:
                    if access is not Access.READ_ONLY:
                        raise
                    index.forget_opened()
        except BaseException:
            index.close()
            raise
        return index

    @property
    def files(self) -> list[IndexFile]:
        return list(self._files)

    @property
    def processed_pos(self) -> int:
        return self._processed_pos

    def mark_processed(self, end_pos: int) -> None:
        """Every record ending at or before `end_pos` has its keys (of this shard) put."""
        if end_pos < self._processed_pos:
            raise ValueError(f"processed position may not go back: {end_pos} < {self._processed_pos}")
        self._processed_pos = end_pos

    # -- write ----------------------------------------------------------------------------------

    def put(self, topic: str, key: str, commit_pos: int, store_ts_ms: int) -> None:
        """Index `topic#key` at `commit_pos`, rolling to a new file when the last one is full."""
        full_key = index_key(topic, key)
        if self._files:
            try:
                self._files[-1].put_key(full_key, commit_pos, store_ts_ms)
                return
            except IndexFileFullError:
                pass
        self._roll().put_key(full_key, commit_pos, store_ts_ms)

    def put_record_keys(self, topic: str, keys: Iterable[str], commit_pos: int, store_ts_ms: int) -> int:
        """Put each of a record's keys; returns how many. All or nothing on a full disk."""
        keys = list(keys)
        filled = self._header_if_overflowing(len(keys))
        count = 0
        try:
            for key in keys:
                self.put(topic, key, commit_pos, store_ts_ms)
                count += 1
        except DiskFullError:
            if count:
                self._take_back(commit_pos, filled)
            raise
        return count

    def put_hashes(self, key_hashes: np.ndarray, commit_positions: np.ndarray,
                   store_ts_ms: np.ndarray) -> None:
        """`put` for many keys whose index_key_hash is known, in order, rolling files as they fill.

        All or nothing: DiskFullError with none of the keys left in (a retry puts them again)."""
        done, total = 0, len(key_hashes)
        filled = None
        try:
            while done < total:
                target = self._files[-1] if self._files else None
                room = target.room if target is not None else 0
                if room == 0:
                    target = self._roll()
                elif filled is None and total - done > room:
                    filled = (target, target.header)  # this batch fills it: a roll follows
                done += target.put_hashes(key_hashes[done:], commit_positions[done:], store_ts_ms[done:])
        except DiskFullError:
            if done:
                self._take_back(int(commit_positions[0]), filled)
            raise

    def _header_if_overflowing(self, key_count: int) -> tuple[IndexFile, IndexHeader] | None:
        """The last file and its header when `key_count` more keys will not all fit in it."""
        last = self._files[-1] if self._files else None
        return (last, last.header) if last is not None and 0 < last.room < key_count else None

    def _take_back(self, first_commit_pos: int, filled: tuple[IndexFile, IndexHeader] | None) -> None:
        """Remove the keys of a batch that failed part way: they start at `first_commit_pos` and
        nothing indexed before the batch is at or past it. `filled`: the file the batch filled
        before its roll failed, with its header from before the batch, put back exactly."""
        processed = self._processed_pos
        self.trim_from(first_commit_pos)
        self._processed_pos = processed
        if filled is not None and self._files and self._files[-1] is filled[0] \
                and filled[0].index_count == filled[1].index_count:
            filled[0].restore_header(filled[1])

    def _roll(self) -> IndexFile:
        """Sync the full last file and start a new one seeded with its end (RocketMQ)."""
        self._require_writable()
        self._cancel_paced_sync()
        seed_pos = seed_ts = 0
        if self._files:
            prev = self._files[-1]
            prev.sync()
            seed_pos, seed_ts = prev.end_commit_pos, prev.end_ts_ms
        try:
            ensure_dir(self.directory)
        except OSError as exc:
            raise_if_disk_full(exc, "create an index shard directory", self.directory)
            raise
        new = IndexFile.create(self.directory / self._new_file_name(), self.slot_count,
                               self.entry_count, seed_pos, seed_ts)
        self._files.append(new)
        return new

    def _new_file_name(self) -> str:
        """Named by the clock; bumped by a millisecond until unique and after the last file."""
        now_ms = self._clock_ms() if self._clock_ms is not None else None
        name = index_file_name(now_ms)
        if self._files and name <= self._files[-1].path.name:
            name = _name_after(self._files[-1].path.name)
        while (self.directory / name).exists():
            name = _name_after(name)
        return name

    # -- read -----------------------------------------------------------------------------------

    def query(self, topic: str, key: str, begin_ms: int = 0, end_ms: int | None = None,
              max_count: int = DEFAULT_MAX_COUNT) -> list[int]:
        """Candidate commit positions for `topic#key`, newest file first, at most `max_count`.

        Candidates include hash collisions and entries stored up to TIME_SLACK_MS before
        `begin_ms`; the caller reads each record back to keep exact matches.
        """
        self._require_open()
        end_ms = INT64_MAX if end_ms is None else end_ms
        low_ms = begin_ms - TIME_SLACK_MS
        key_hash = index_key_hash(index_key(topic, key))
        found: list[int] = []
        for index_file in reversed(self._files):
            if len(found) >= max_count:
                break
            count, begin_ts_ms, end_ts_ms = index_file.query_bounds
            if count <= 1 or end_ts_ms + TIME_SLACK_MS < begin_ms or begin_ts_ms - TIME_SLACK_MS > end_ms:
                continue
            found += index_file.select_hash(key_hash, low_ms, end_ms, max_count - len(found))
        return found

    # -- durability, recovery, retention --------------------------------------------------------

    def sync(self) -> int:
        """Make whatever changed durable now (a paced sync under way is folded in); return
        processed_pos, now durable."""
        self._require_open()
        self._cancel_paced_sync()
        durable_pos = self._processed_pos
        for index_file in self._files:
            index_file.sync()
        return durable_pos

    @property
    def syncing(self) -> bool:
        """A paced sync is under way (begin_paced_sync ... the sync_piece that finishes it)."""
        return self._paced is not None

    def begin_paced_sync(self, piece_bytes: int) -> None:
        """Start making what changed durable in pieces of at most `piece_bytes` (sync_piece),
        so the disk gets a little at a time instead of every changed page in one sync, which
        the commitlog's group commit would queue behind (see docs/DECISIONS.md#paced-index-sync).
        The durable position is processed_pos now: every key below it is in the pages taken,
        and a piece synced later holds later keys too, which recovery trims."""
        self._require_writable()
        if self._paced is not None:
            raise ValueError("a paced sync is already under way")
        taken = [(f, t) for f in self._files if (t := f.take_dirty_ranges()) is not None]
        self._paced = PacedSync.of(self._processed_pos, taken, piece_bytes)

    def sync_piece(self) -> int | None:
        """Sync the next piece of the paced sync; when none is left, end it and return the
        position it made durable (None while pieces remain)."""
        paced = self._paced
        if paced is None:
            raise ValueError("no paced sync is under way")
        if not paced.sync_next():
            return None
        self._paced = None
        return paced.target_pos

    def _cancel_paced_sync(self) -> None:
        """Give back what a paced sync took and did not finish: the next sync has it again."""
        paced, self._paced = self._paced, None
        if paced is not None:
            paced.cancel()

    def trim_from(self, cut_pos: int) -> int:
        """Drop every entry with commit_pos >= cut_pos; returns the number of entries removed.

        Newest first: a file whose begin_commit_pos >= cut_pos is deleted (all of its entries go),
        and so is a last file left with no entry, unless it is the only one, which is trimmed
        empty; then the last remaining file is trimmed. processed_pos drops to cut_pos if it
        was past it.
        """
        self._require_writable()
        self._cancel_paced_sync()
        removed = 0
        while self._files:
            last = self._files[-1]
            if len(self._files) == 1 or (last.begin_commit_pos < cut_pos and last.index_count > 1):
                removed += last.trim_from(cut_pos)
                if len(self._files) == 1 or last.index_count > 1:
                    break
            removed += last.index_count - 1
            self._files.pop().delete()
        self._processed_pos = min(self._processed_pos, cut_pos)
        return removed

    def trim_for_recovery(self, durable_pos: int) -> int:
        """Recovery's trim (DESIGN §5.4): `trim_from(durable_pos)`, and when that took entries, the
        newest kept record's too, so processed_pos (that record's position, or 0 when none is
        kept) is where re-indexing puts back every key taken, none twice: a damaged entry below
        durable_pos ends the kept entries early. Returns the entries removed."""
        removed = taken = self.trim_from(durable_pos)
        reindex_pos = durable_pos
        while taken:
            reindex_pos = self.newest_commit_pos
            if reindex_pos is None:
                reindex_pos = 0
                break
            at_newest = self._entries_at_end(reindex_pos)
            taken = self.trim_from(reindex_pos)
            removed += taken
            if taken <= at_newest:  # more: the trim also took entries below it, go back further
                break
        self._processed_pos = reindex_pos
        return removed

    @property
    def newest_commit_pos(self) -> int | None:
        """The commit_pos of the newest entry of the shard (None when it holds none)."""
        return next((f.newest_commit_pos for f in reversed(self._files) if f.index_count > 1), None)

    def _entries_at_end(self, commit_pos: int) -> int:
        """How many of the shard's newest entries, in a row and across files, point at commit_pos."""
        count = 0
        for index_file in reversed(self._files):
            at_end = index_file.entries_at_end(commit_pos)
            count += at_end
            if at_end < index_file.index_count - 1:
                break
        return count

    def delete_expired(self, min_commit_pos: int) -> int:
        """Delete the oldest files whose end_commit_pos < min_commit_pos (never the last one)."""
        self._require_writable()
        deleted = 0
        while len(self._files) > 1 and self._files[0].end_commit_pos < min_commit_pos:
            self._cancel_paced_sync()  # its pieces may lie in the file that goes
            self._files.pop(0).delete()
            deleted += 1
        return deleted

    def forget_opened(self) -> None:
        """Close and drop every file opened so far (a reader's load, behind the retention line)."""
        for index_file in self._files:
            index_file.close()
        self._files.clear()

    def close(self) -> None:
        for index_file in self._files:
            index_file.close()
        self._closed = True

    def _require_open(self) -> None:
        if self._closed:
            raise StoreClosedError("index shard is closed", path=str(self.directory))

    def _require_writable(self) -> None:
        self._require_open()
        if self.access is not Access.READ_WRITE:
            raise ReadOnlyStoreError("index shard is open read-only", path=str(self.directory))

    def __repr__(self) -> str:
        return f"ShardIndex({self.directory}, {len(self._files)} files, processed {self._processed_pos})"
