"""engine.files.naming's segment lister: one listing, one contiguity and size check, one inference of
the segment size, for the commitlog, check and the Spark layout alike."""

from __future__ import annotations

import pytest

from engine.check.fsck import check_summary
from engine.errors import SegmentLayoutError
from engine.files.naming import (
    ROCKETMQ_SEGMENT_BYTES,
    SegmentFile,
    check_segment_bases,
    check_segment_sizes,
    infer_segment_bytes,
    offset_to_name,
    segment_files,
)
from tools.spark.layout import read_layout

SEG = 4096


def make(directory, bases, size=SEG) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for base in bases:
        (directory / offset_to_name(base)).write_bytes(bytes(size))


def test_segment_files_lists_segment_names_by_position(tmp_path):
    make(tmp_path, [2 * SEG, 0, SEG])
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / (offset_to_name(3 * SEG) + ".tmp")).write_bytes(b"")
    expected = [SegmentFile(base, tmp_path / offset_to_name(base)) for base in (0, SEG, 2 * SEG)]
    assert segment_files(tmp_path) == expected
    assert segment_files(tmp_path / "missing") == []


def test_bases_must_be_aligned_and_contiguous(tmp_path):
    make(tmp_path, [SEG, 2 * SEG])
    check_segment_bases(segment_files(tmp_path), SEG)  # a log need not start at 0 (retention)
    make(tmp_path, [4 * SEG])
    with pytest.raises(SegmentLayoutError, match="gap in segments") as info:
        check_segment_bases(segment_files(tmp_path), SEG)
    assert info.value.path.endswith(offset_to_name(4 * SEG))
    with pytest.raises(SegmentLayoutError, match="not a multiple"):
        check_segment_bases([SegmentFile(100, tmp_path / offset_to_name(100))], SEG)


def test_sizes_are_checked_and_inferred(tmp_path):
    make(tmp_path, [0, SEG])
    files = segment_files(tmp_path)
    assert infer_segment_bytes(files) == SEG
    check_segment_sizes(files, SEG)
    with pytest.raises(SegmentLayoutError, match="not 8192"):
        check_segment_sizes(files, 2 * SEG)
    assert infer_segment_bytes([]) == ROCKETMQ_SEGMENT_BYTES
    make(tmp_path, [2 * SEG], size=SEG // 2)
    with pytest.raises(SegmentLayoutError, match="share one"):
        infer_segment_bytes(segment_files(tmp_path))


def test_an_empty_rocketmq_segment_is_a_layout_error_for_spark_and_a_finding_for_check(tmp_path):
    """A RocketMQ store records no segment size: an empty file gives none to infer."""
    make(tmp_path / "commitlog", [0], size=0)
    with pytest.raises(SegmentLayoutError, match="share one, not zero"):
        read_layout(tmp_path)
    summary = check_summary(tmp_path)
    assert [f.kind.name for f in summary.findings] == ["LAYOUT"]
