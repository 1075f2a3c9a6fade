"""The Spark reader's walk over pread blocks (engine.log.walker over BlockReader windows):
records that run past a block are read again from their start, and what ends a segment's
data (a filler, zeros, a filler of the wrong size, zeros followed by data) is reported as the
engine's walk decides it. No Spark needed: partitions are read in-process."""

from __future__ import annotations

import shutil

from engine.formats.record import encode_filler
from tools.spark import scan
from tools.spark.scan import read_scalar_batches
from tools.spark.source import MqstoreReader, parse_options


def scalar_rows(root, **options) -> list[dict]:
    reader = MqstoreReader(parse_options({"path": str(root), **options}))
    return [row for part in reader.partitions() for rng in part.value
            for batch in read_scalar_batches(rng, reader.spec) for row in batch.to_pylist()]


def test_records_running_past_a_small_block_read_the_same(store_dir, records, monkeypatch):
    whole = scalar_rows(store_dir, verify="report")
    monkeypatch.setattr(scan, "READ_BLOCK_BYTES", 256)  # smaller than most records: most cross a block
    assert scalar_rows(store_dir, verify="report") == whole
    assert [r["commit_pos"] for r in whole] == sorted(records)


def test_segment_ends_are_reported_as_the_walk_decides(store_dir, records, tmp_path):
    copy = tmp_path / "damaged"
    shutil.copytree(store_dir, copy)
    last = max(records)
    end = last + records[last].total_size  # the first unwritten byte of the last segment
    segment_bytes = 16384
    path = copy / "commitlog" / f"{end - end % segment_bytes:020d}"
    with open(path, "r+b") as f:
        f.seek(end % segment_bytes + 64)
        f.write(b"\x01")  # zeros, then data: not a clean end
    rows = scalar_rows(copy, verify="report")
    assert (rows[-1]["commit_pos"], rows[-1]["error"]) == (end, "unwritten bytes followed by data")
    with open(path, "r+b") as f:
        f.seek(end % segment_bytes)
        f.write(encode_filler(segment_bytes - end % segment_bytes - 8))  # short of the segment end
    rows = scalar_rows(copy, verify="report")
    assert rows[-1]["commit_pos"] == end and rows[-1]["error"].startswith("filler of")
    assert rows[-1]["topic"] is None
    assert [r["commit_pos"] for r in rows[:-1]] == sorted(records)
