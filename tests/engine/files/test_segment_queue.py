"""SegmentQueue and MappedFile: a port of RocketMQ's MappedFileQueueTest (1 KiB files)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.errors import SegmentLayoutError
from engine.files.mapped_file import Access, MappedFile, ReadAhead
from engine.files.naming import TEMP_SUFFIX, offset_to_name
from engine.files.segment_queue import SegmentQueue

SIZE = 1024


def _queue(tmp_path, access=Access.READ_WRITE) -> SegmentQueue:
    return SegmentQueue.load(tmp_path / "segs", SIZE, access)


def _names(tmp_path) -> list[str]:
    return sorted(os.listdir(tmp_path / "segs"))


def _filled(tmp_path, count: int, start: int = 0) -> SegmentQueue:
    queue = _queue(tmp_path)
    for i in range(count):
        segment = queue.create(start + i * SIZE)
        segment.write(0, bytes([i + 1]) * SIZE)
    return queue


def test_segment_queue_missing_directory_loads_empty():
    queue = SegmentQueue.load("/nonexistent/segs", SIZE, Access.READ_ONLY)
    assert (queue.segments, queue.min_pos, queue.end_pos, queue.last()) == ([], 0, 0, None)


def test_segment_queue_create_rolls_to_files_named_by_base(tmp_path):
    queue = _filled(tmp_path, 3)
    assert _names(tmp_path) == [offset_to_name(0), offset_to_name(1024), offset_to_name(2048)]
    assert (queue.min_pos, queue.end_pos) == (0, 3 * SIZE)
    assert queue.base_of(queue.last()) == 2048
    assert all(os.path.getsize(s.path) == SIZE for s in queue.segments)


def test_segment_queue_create_refuses_gap_and_misalignment(tmp_path):
    queue = _filled(tmp_path, 1)
    with pytest.raises(ValueError):
        queue.create(2048)
    with pytest.raises(ValueError):
        queue.create(1000)


def test_segment_queue_find_at_boundaries_and_past_end_is_none(tmp_path):
    queue = _filled(tmp_path, 3)
    for pos, base in [(0, 0), (1023, 0), (1024, 1024), (2047, 1024), (2048, 2048), (3071, 2048)]:
        assert queue.base_of(queue.find(pos)) == base, pos
    assert queue.find(3072) is None
    assert queue.find(-1) is None


def test_segment_queue_nonzero_start_finds_none_below(tmp_path):
    queue = _filled(tmp_path, 2, start=1024)
    assert queue.min_pos == 1024
    assert queue.find(0) is None
    assert queue.find(1023) is None
    assert queue.base_of(queue.find(1024)) == 1024
    assert queue.base_of(queue.find(2048 + 1023)) == 2048


def test_segment_queue_reload_maps_same_bytes(tmp_path):
    _filled(tmp_path, 3).close()
    queue = _queue(tmp_path, Access.READ_ONLY)
    assert [bytes(s.read(0, 2)) for s in queue.segments] == [b"\x01\x01", b"\x02\x02", b"\x03\x03"]
    assert queue.end_pos == 3 * SIZE


@pytest.mark.parametrize("damage, message", [
    (lambda d: os.truncate(d / offset_to_name(1024), 100), "expected 1024"),
    (lambda d: os.remove(d / offset_to_name(1024)), "gap"),
    (lambda d: (d / "notes.txt").write_text("x"), "foreign"),
    (lambda d: os.rename(d / offset_to_name(2048), d / offset_to_name(2000)), "multiple"),
])
def test_segment_queue_load_bad_layout_raises_with_path(tmp_path, damage, message):
    _filled(tmp_path, 3).close()
    damage(tmp_path / "segs")
    with pytest.raises(SegmentLayoutError) as info:
        _queue(tmp_path)
    assert message in str(info.value)
    assert info.value.path.startswith(str(tmp_path / "segs"))


def test_segment_queue_remove_after_drops_later_files(tmp_path):  # testReset
    queue = _filled(tmp_path, 3)
    removed = queue.remove_after(1024)
    assert [p.name for p in removed] == [offset_to_name(2048), offset_to_name(1024)]
    assert _names(tmp_path) == [offset_to_name(0)]
    assert (queue.end_pos, queue.find(1024)) == (SIZE, None)
    assert queue.create(1024) is queue.last()  # the queue extends again from the cut


def test_segment_queue_remove_first_moves_min_pos(tmp_path):
    queue = _filled(tmp_path, 3)
    assert queue.remove_first().name == offset_to_name(0)
    assert queue.min_pos == 1024
    assert queue.find(0) is None
    assert _names(tmp_path) == [offset_to_name(1024), offset_to_name(2048)]


def test_segment_queue_preallocated_file_is_adopted_by_create(tmp_path):
    queue = _filled(tmp_path, 1)
    queue.preallocate_next()
    assert _names(tmp_path) == [offset_to_name(0), offset_to_name(1024)]
    assert queue.end_pos == SIZE  # not adopted yet
    segment = queue.create(1024)
    assert queue.base_of(segment) == 1024 and queue.end_pos == 2 * SIZE


def test_segment_queue_sync_range_spans_segments_and_reaches_file(tmp_path):
    queue = _filled(tmp_path, 2)
    queue.segments[0].write(1000, b"A" * 24)
    queue.segments[1].write(0, b"B" * 40)
    queue.sync_range(1000, 1064)
    with open(tmp_path / "segs" / offset_to_name(1024), "rb") as f:
        assert f.read(40) == b"B" * 40
    queue.sync_range(3000, 5000)  # past the end: nothing to do, no error


def test_segment_queue_read_only_refresh_adopts_and_forgets(tmp_path):
    writer = _filled(tmp_path, 1)
    reader = _queue(tmp_path, Access.READ_ONLY)
    writer.create(1024).write(0, b"new")
    reader.refresh()
    assert bytes(reader.find(1024).read(0, 3)) == b"new"
    writer.remove_first()
    reader.refresh()
    assert reader.min_pos == 1024 and reader.find(0) is None


def test_mapped_file_zero_and_read_clamp(tmp_path):
    segment = MappedFile.create(tmp_path / offset_to_name(0), SIZE)
    segment.write(0, b"\xff" * SIZE)
    segment.zero(100, 5000)
    assert bytes(segment.read(98, 4)) == b"\xff\xff\x00\x00"
    assert len(segment.read(1000, 100)) == 24
    segment.close()
    with open(tmp_path / offset_to_name(0), "rb") as f:
        data = f.read()
    assert data[:100] == b"\xff" * 100 and data[100:] == bytes(SIZE - 100)


def test_mapped_file_create_existing_refuses(tmp_path):
    MappedFile.create(tmp_path / "f", SIZE).close()
    with pytest.raises(FileExistsError):
        MappedFile.create(tmp_path / "f", SIZE)


def test_a_temp_file_is_a_leftover_to_the_writer_and_a_create_in_progress_to_a_reader(tmp_path):
    """MappedFile.create sizes a segment under `<name>.tmp` and renames it. A reader that lists
    the directory meanwhile must neither fail on it nor delete it from under the writer."""
    _filled(tmp_path, 2).close()
    in_progress = tmp_path / "segs" / (offset_to_name(2 * SIZE) + TEMP_SUFFIX)
    in_progress.write_bytes(bytes(SIZE))
    reader = _queue(tmp_path, Access.READ_ONLY)
    try:
        assert len(reader.segments) == 2 and in_progress.exists()
    finally:
        reader.close()
    _queue(tmp_path).close()  # the writer's load after a crash
    assert not in_progress.exists()
    assert _names(tmp_path) == [offset_to_name(0), offset_to_name(SIZE)]


def own_page_mappings(path) -> list[bool]:
    """For each mapping of `path` in this process: is it MADV_RANDOM ("rr" in smaps VmFlags)?"""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.endswith(" " + str(path))]
    flags = [next(line for line in lines[i:] if line.startswith("VmFlags:")) for i in starts]
    return ["rr" in line.split() for line in flags]


def test_only_the_last_segment_of_an_own_page_queue_reads_its_own_page_only(tmp_path):
    """Its reserved tail is the one a read-around would zero-fill; the full segments before it
    read ahead, as a cold catch-up read wants. Writer and reader alike, across a roll."""
    writer = SegmentQueue.load(tmp_path / "segs", SIZE * 16, Access.READ_WRITE, ReadAhead.OWN_PAGE)
    writer.create(0)
    reader = SegmentQueue.load(tmp_path / "segs", SIZE * 16, Access.READ_ONLY, ReadAhead.OWN_PAGE)
    try:
        first = tmp_path / "segs" / offset_to_name(0)
        second = tmp_path / "segs" / offset_to_name(SIZE * 16)
        writer.create(SIZE * 16)
        reader.refresh()
        for queue in (writer, reader):
            assert [s.path for s in queue.segments] == [first, second]
        assert own_page_mappings(second) == [True, True]  # the writer's and the reader's
        assert own_page_mappings(first) == [False, False]
    finally:
        reader.close()
        writer.close()
