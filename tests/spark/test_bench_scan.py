"""The scan benchmark's store is a fair peer for Parquet: every body is its own bytes."""

from __future__ import annotations

from tests.spark.stores import engine_records
from tools.spark.bench_scan import make_store


def test_make_store_writes_distinct_bodies(tmp_path):
    """Equal bodies would be dictionary-encoded by Parquet (one value stored): its scan of
    them reads almost nothing, and the ratio against it measures nothing."""
    root = tmp_path / "store"
    make_store(root, 2, 1, body_bytes=500)
    bodies = [record.body for record in engine_records(root).values()]
    assert len(bodies) >= 3000
    assert {len(body) for body in bodies} == {500}
    assert len(set(bodies)) == len(bodies)
