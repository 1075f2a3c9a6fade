"""Ordered fixed-size segments in one directory, named by their first position (MappedFileQueue).

Used by the commitlog (positions are commit positions) and by consume queues (positions are
logical bytes, entry index x 20). The queue only manages files; what is written where is the
caller's business.
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path

from engine.errors import SegmentLayoutError
from engine.files.filesystem import ensure_dir
from engine.files.mapped_file import Access, MappedFile, ReadAhead, settled_names
from engine.files.naming import (
    check_segment_bases,
    is_segment_name,
    name_to_offset,
    offset_to_name,
    segment_files,
)
from engine.files.open_files import OpenFileBudget


class SegmentQueue:
    """The segments of one directory, sorted by base position, each `segment_bytes` long; with a
    `budget`, at most that many of them (and of the other queues sharing it) stay mapped."""

    def __init__(self, directory: Path, segment_bytes: int, access: Access,
                 read_ahead: ReadAhead = ReadAhead.KERNEL, budget: OpenFileBudget | None = None):
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.access = access
        self.read_ahead = read_ahead  # of the last segment; the full ones before it read ahead
        self.budget = budget
        self.segments: list[MappedFile] = []
        self._bases: list[int] = []

    @classmethod
    def load(cls, directory: Path, segment_bytes: int, access: Access,
             read_ahead: ReadAhead = ReadAhead.KERNEL, budget: OpenFileBudget | None = None) -> SegmentQueue:
        """Map every segment; a wrong size, a misaligned name, a gap or a foreign file is an error
        (a `.tmp` file is none of these: settled_names). A reader that finds a listed segment
        gone when it opens it lost a race with retention, which deletes from the front: that
        segment and every one before it are forgotten, and the load goes on."""
        queue = cls(directory, segment_bytes, access, read_ahead, budget)
        if not queue.directory.is_dir():
            return queue
        names = settled_names(queue.directory, access)
        foreign = [n for n in names if not is_segment_name(n)]
        if foreign:
            raise SegmentLayoutError(f"foreign file {foreign[0]!r} among segments",
                                     path=str(queue.directory / foreign[0]))
        files = segment_files(queue.directory)
        check_segment_bases(files, segment_bytes)
        for file in files:
            try:
                queue._append(MappedFile.open(file.path, access, segment_bytes, read_ahead, budget))
            except FileNotFoundError:
                if access is not Access.READ_ONLY:
                    raise
                queue.close()  # behind the retention line, with all before it
        return queue

    def _append(self, segment: MappedFile) -> None:
        """Adopt `segment` (mapped with self.read_ahead) as the last; the one before it is full,
        with no reserved tail, so it reads ahead again (a cold catch-up read needs that)."""
        if self.read_ahead is not ReadAhead.KERNEL and self.segments:
            self.segments[-1].advise(ReadAhead.KERNEL)
        self.segments.append(segment)
        self._bases.append(name_to_offset(segment.path.name))

    @property
    def min_pos(self) -> int:
        """First position still held on disk (0 for an empty queue)."""
        return self._bases[0] if self._bases else 0

    @property
    def end_pos(self) -> int:
        """Position just past the last segment."""
        return self._bases[-1] + self.segment_bytes if self._bases else 0

    def front_deleted(self) -> bool:
        """Whether the first mapped segment's file is gone: retention deletes from the front, so
        this one stat tells a read-only view when a refresh must list the directory."""
        return bool(self.segments) and not os.path.exists(self.segments[0].path)

    def base_of(self, segment: MappedFile) -> int:
        return name_to_offset(segment.path.name)

    def find(self, pos: int) -> MappedFile | None:
        """The segment holding `pos`, or None when `pos` is outside every segment."""
        located = self.locate(pos)
        return None if located is None else located[0]

    def locate(self, pos: int) -> tuple[MappedFile, int] | None:
        """find(pos) and that segment's base position (without parsing its name, as base_of does)."""
        i = bisect.bisect_right(self._bases, pos) - 1
        if i < 0 or pos >= self._bases[i] + self.segment_bytes:
            return None
        return self.segments[i], self._bases[i]

    def last(self) -> MappedFile | None:
        return self.segments[-1] if self.segments else None

    def create(self, base_pos: int) -> MappedFile:
        """Create the segment starting at `base_pos`; it must extend the queue without a gap."""
        if base_pos % self.segment_bytes:
            raise ValueError(f"base_pos {base_pos} not aligned to {self.segment_bytes}")
        if self._bases and base_pos != self.end_pos:
            raise ValueError(f"segment {base_pos} would leave a gap after {self.end_pos}")
        ensure_dir(self.directory)
        path = self.directory / offset_to_name(base_pos)
        if path.exists():  # preallocated earlier but not yet adopted
            segment = MappedFile.open(path, self.access, self.segment_bytes, self.read_ahead,
                                      self.budget)
        else:
            segment = MappedFile.create(path, self.segment_bytes, self.read_ahead, self.budget)
        self._append(segment)
        return segment

    def preallocate_next(self) -> None:
        """Create the file after the last segment without adopting it (cheap: it is sparse)."""
        if not self._bases:
            return
        path = self.directory / offset_to_name(self.end_pos)
        if not path.exists():
            MappedFile.create(path, self.segment_bytes).close()

    def remove_after(self, pos: int) -> list[Path]:
        """Delete every segment that starts at or beyond `pos` (recovery's cut)."""
        removed = []
        while self._bases and self._bases[-1] >= pos:
            segment = self.segments.pop()
            self._bases.pop()
            segment.delete()
            removed.append(segment.path)
        return removed

    def remove_first(self) -> Path:
        """Delete the oldest segment (retention never removes from the middle)."""
        segment = self.segments.pop(0)
        self._bases.pop(0)
        segment.delete()
        return segment.path

    def refresh(self) -> None:
        """Read-only views adopt segments the writer created since load (and forget deleted ones)."""
        if not self.directory.is_dir():
            return
        files = segment_files(self.directory)
        bases = {file.base_pos for file in files}
        gone = [i for i, base_pos in enumerate(self._bases) if base_pos not in bases]
        for i in reversed(gone):
            self.segments.pop(i).close()
            self._bases.pop(i)
        for base_pos, path in files:
            if (not self._bases or base_pos == self.end_pos) and base_pos not in self._bases:
                try:
                    self._append(MappedFile.open(path, self.access,
                                                 self.segment_bytes, self.read_ahead, self.budget))
                except (FileNotFoundError, SegmentLayoutError):
                    break  # being created right now; adopt it next time

    def sync_range(self, start_pos: int, end_pos: int) -> None:
        """msync the bytes [start_pos, end_pos) across however many segments they span."""
        pos = start_pos
        while pos < end_pos:
            located = self.locate(pos)
            if located is None:
                return
            segment, base_pos = located
            stop = min(end_pos, base_pos + self.segment_bytes)
            segment.sync(pos - base_pos, stop - base_pos)
            pos = stop

    def close(self) -> None:
        for segment in self.segments:
            segment.close()
        self.segments.clear()
        self._bases.clear()
