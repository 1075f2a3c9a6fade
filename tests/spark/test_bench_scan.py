"""The scan benchmark's store is a fair peer for Parquet: every body is its own bytes, random
or JSON-like text of the asked size."""

from __future__ import annotations

import json

import pytest

from tests.spark.stores import engine_records
from tools.spark.bench_bodies import JSON_MIN_BODY_BYTES, BodyKind, BodyMaker
from tools.spark.bench_scan import main, make_store


def test_make_store_writes_distinct_bodies(tmp_path):
    """Equal bodies would be dictionary-encoded by Parquet (one value stored): its scan of
    them reads almost nothing, and the ratio against it measures nothing."""
    root = tmp_path / "store"
    make_store(root, 2, 1, body_bytes=500)
    bodies = [record.body for record in engine_records(root).values()]
    assert len(bodies) >= 3000
    assert {len(body) for body in bodies} == {500}
    assert len(set(bodies)) == len(bodies)


def assert_json_events(bodies: list[bytes], body_bytes: int) -> None:
    """Each body is one JSON object of exactly `body_bytes`, an event with its own id, and no
    two bodies are equal."""
    assert {len(body) for body in bodies} == {body_bytes}
    events = [json.loads(body) for body in bodies]
    assert all(isinstance(e, dict) and {"event", "id", "ts", "items", "note"} <= e.keys() for e in events)
    assert len({e["id"] for e in events}) == len(events)
    assert len(set(bodies)) == len(bodies)
    assert all(len(e["note"].split()) > 10 for e in events)  # text, not padding alone


def test_make_store_writes_distinct_json_bodies_of_the_size(tmp_path):
    root = tmp_path / "store"
    make_store(root, 2, 1, body_bytes=500, body_kind=BodyKind.JSON)
    bodies = [record.body for record in engine_records(root).values()]
    assert len(bodies) >= 3000
    assert_json_events(bodies, 500)


def test_json_bodies_are_deterministic_for_a_seed():
    first = BodyMaker(BodyKind.JSON, 1000, seed=7).batch(0, 200)
    assert BodyMaker(BodyKind.JSON, 1000, seed=7).batch(0, 200) == first
    assert BodyMaker(BodyKind.JSON, 1000, seed=8).batch(0, 200) != first
    assert_json_events(first, 1000)


def test_too_small_json_bodies_are_refused_before_the_store_is_made(tmp_path):
    root = tmp_path / "store"
    with pytest.raises(ValueError, match=f"at least {JSON_MIN_BODY_BYTES} bytes, asked 300"):
        make_store(root, 1, 1, body_bytes=300, body_kind=BodyKind.JSON)
    assert not root.exists()


def test_cli_makes_a_store_of_json_bodies(tmp_path, capsys):
    root = tmp_path / "store"
    assert main(["--store", str(root), "--make-mb", "1", "--segment-mb", "1", "--body-kind", "json",
                 "--skip-planning", "--skip-decode", "--runs", "0", "--body-runs", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["make_s"] >= 0
    bodies = [record.body for record in engine_records(root).values()]
    assert len(bodies) >= 800
    assert_json_events(bodies, 1000)
