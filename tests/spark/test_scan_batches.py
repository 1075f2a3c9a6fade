"""The fast read path (batch scanner + Arrow columns) returns exactly the scalar path's rows.

No Spark needed: the reader's partitions are read in-process with both `scan.read_batches`
and `scan.read_scalar_batches` (record.decode_record one record at a time).
"""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.formats.properties import decode_properties
from engine.formats.record import BODY_OFFSET
from engine.formats.record.encode_many import encode_records
from engine.formats.record.stamp_many import stamp_records
from tests.spark.stores import T0_MS, engine_records
from tools.spark.arrow_columns import parse_pieces
from tools.spark.bench_scan import make_store
from tools.spark.options import parse_options
from tools.spark.read_plan import RowSelection
from tools.spark.scan import read_scalar_batches
from tools.spark.source import MqstoreReader

OPTION_SETS = [
    {}, {"view": "dispatch"}, {"verify": "fail"}, {"verify": "report"},
    {"verify": "report", "view": "dispatch"}, {"topics": "orders,audit"},
    {"startTime": str(T0_MS + 30_000), "endTime": str(T0_MS + 90_000), "view": "dispatch"},
    {"maxPartitionBytes": "3000"}, {"maxPartitionBytes": "3000", "splitMode": "walk"},
]


def both_paths(root, **options) -> tuple[list[dict], list[dict]]:
    """Rows of every partition by the batch path and by the reference path; a
    maxPartitionBytes below the option's floor is set on the parsed options."""
    target_bytes = options.pop("maxPartitionBytes", None)
    opts = parse_options({"path": str(root), **options})
    if target_bytes is not None:
        opts = replace(opts, target_bytes=int(target_bytes))
    reader = MqstoreReader(opts)
    fast, scalar = [], []
    for part in reader.partitions():
        fast += [row for batch in reader.read(part) for row in batch.drop_columns("store").to_pylist()]
        scalar += [row for rng, source in zip(part.value, part.sources, strict=True)
                   for batch in read_scalar_batches(rng, source.spec) for row in batch.to_pylist()]
    return fast, scalar


@pytest.mark.parametrize("options", OPTION_SETS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_fast_path_rows_equal_scalar_rows(store_dir, records, options):
    """Rolled segments with fillers, three topics, four queues, keys, tags, varied bodies."""
    fast, scalar = both_paths(store_dir, **options)
    assert fast == scalar
    assert len(fast) > 50


def test_fast_path_reports_the_same_bad_record(store_dir, records, tmp_path):
    copy = tmp_path / "flipped"
    shutil.copytree(store_dir, copy)
    victim = sorted(records)[40]
    with open(copy / "commitlog" / f"{0:020d}", "r+b") as f:
        f.seek(victim + BODY_OFFSET)
        byte = f.read(1)
        f.seek(victim + BODY_OFFSET)
        f.write(bytes([byte[0] ^ 0x40]))
    fast, scalar = both_paths(copy, verify="report")
    assert fast == scalar
    assert [(r["commit_pos"], r["error"]) for r in fast if r["error"]] == [(victim, "BODYCRC mismatch")]
    fast, _ = both_paths(copy)  # verify=none checks structure only: the record reads as is
    assert len(fast) == len(records)
    reader = MqstoreReader(parse_options({"path": str(copy), "verify": "fail"}))
    with pytest.raises(Exception, match="BODYCRC mismatch"):
        for part in reader.partitions():
            list(reader.read(part))


def asked_rows(root, columns: tuple[str, ...], **options) -> list[dict]:
    """Rows of a read whose user-given schema asks for `columns` (the fast path only)."""
    reader = MqstoreReader(parse_options({"path": str(root), **options}), RowSelection(columns=columns))
    return [row for part in reader.partitions() for batch in reader.read(part) for row in batch.to_pylist()]


COLUMN_SETS = [("body",), ("topic", "body"), ("keys", "commit_pos", "tags"), ("msg_id", "store_host"),
               ("born_host", "size", "store_ts"), ("properties", "uniq_key", "queue_id", "store")]


@pytest.mark.parametrize("options", [{}, {"topics": "orders,audit"}, {"verify": "report"}],
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
@pytest.mark.parametrize("columns", COLUMN_SETS, ids=",".join)
def test_asked_columns_equal_the_reference_rows(store_dir, records, columns, options):
    """A read that decodes only the asked columns gives the reference decoder's values of them."""
    _, scalar = both_paths(store_dir, **options)
    wanted = [c for c in columns if c != "store"]
    expected = [{c: row[c] for c in wanted} for row in scalar]
    got = asked_rows(store_dir, columns, **options)
    assert [{c: row[c] for c in wanted} for row in got] == expected
    assert all(list(row) == list(columns) for row in got)
    assert len(got) > 50


def test_pushed_down_predicates_read_columns_the_schema_lacks(store_dir, records):
    """A queue_id or queue_offset predicate keeps its rows when the schema asks for bodies only."""
    selection = RowSelection(columns=("body",), queue_ids=frozenset({1}), min_queue_offset=3)
    reader = MqstoreReader(parse_options({"path": str(store_dir)}), selection)
    got = [row for part in reader.partitions() for batch in reader.read(part) for row in batch.to_pylist()]
    kept = [r for _, r in sorted(records.items()) if r.queue_id == 1 and r.queue_offset >= 3]
    assert got == [{"body": r.body} for r in kept] and 0 < len(kept) < len(records)


def test_bodies_alone_skip_the_properties(store_dir, records, monkeypatch):
    """Asking for bodies decodes no properties, hosts or msgIds (the scan of bodies pays for
    bodies only), and makes no Python object per body (`slices`); asking for tags does parse
    the properties."""
    def refuse(*_args):
        raise AssertionError("decoded a column nobody asked for")

    for name in ("parse_pieces", "packed_hosts", "msg_id_array", "slices"):
        monkeypatch.setattr(f"tools.spark.arrow_columns.{name}", refuse)
    bodies = asked_rows(store_dir, ("body",))
    assert sorted(len(row["body"]) for row in bodies) == sorted(len(r.body) for r in records.values())
    with pytest.raises(AssertionError, match="nobody asked"):
        asked_rows(store_dir, ("tags",))


def _segment(props_raws: list[bytes], topics: list[bytes], segment_bytes: int = 1 << 16) -> bytes:
    """Records with raw properties (duplicates allowed) stamped at positions 0.., then zeros."""
    n = len(props_raws)
    enc = encode_records(topics, [b"body-%d" % i for i in range(n)], props_raws, [i % 2 for i in range(n)],
                         born_ts_ms=T0_MS, born_host=("10.1.2.3", 4242), store_host=("192.168.0.9", 10911))
    stamp_records(enc.buf, enc.starts, enc.sizes, np.arange(n), enc.starts, T0_MS + 5)
    return bytes(enc.buf) + bytes(segment_bytes - len(enc.buf))


def test_odd_properties_and_text_fall_back_or_match(tmp_path, monkeypatch):
    """Empty keys or values, stray separators, KEYS with runs of spaces (fast path), a
    non-ASCII topic (reference decoder), repeated keys (a dict keeps the later value in the
    first one's place: the run goes to the reference decoder): the same rows on both paths."""
    monkeypatch.setattr("tools.spark.scan.SCALAR_RUN", 0)  # back to the batch path at once
    props = [b"KEYS\x01a  b \x02TAGS\x01t\x02", b"\x01x\x02k\x01\x02\x02\x02UNIQ_KEY\x01u1\x02",
             b"TAGS\x01\x01v\x02KEYS\x01 \x02", b"p\x01q\x02", b"p\x01q\x02",
             b"a\x01x\x02b\x01z\x02a\x01y\x02"] * 3
    topics = [b"plain", b"plain", b"other", b"plain", "t\u00e9".encode(), b"plain"] * 3
    (tmp_path / "commitlog").mkdir()
    (tmp_path / "commitlog" / f"{0:020d}").write_bytes(_segment(props, topics))
    for options in ({}, {"verify": "fail"}, {"view": "dispatch"}, {"verify": "report"}):
        fast, scalar = both_paths(tmp_path, **options)
        assert fast == scalar and len(fast) == len(props)
    assert fast[5]["properties"] == [("a", "y"), ("b", "z")]
    assert fast[0]["keys"] == ["a", "b"] and fast[2]["tags"] == "\x01v" and fast[2]["keys"] == []


_PIECE = st.text(alphabet="ab \x01\x02", max_size=6)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_PIECE, max_size=5).map("\x02".join), min_size=1, max_size=6))
def test_parse_pieces_agrees_with_decode_properties(raws):
    blobs = [raw.encode() for raw in raws]
    u8 = np.frombuffer(b"".join([*blobs, bytes(8)]), dtype=np.uint8)
    row_ends = np.cumsum([len(b) for b in blobs])
    found = parse_pieces(u8, row_ends)
    expected = [decode_properties(raw) for raw in blobs]
    if found is None:  # only when some record repeats a key
        pairs = [raw.split(b"\x02") for raw in blobs]
        assert any(len(d) < sum(0 < p.find(b"\x01") < len(p) - 1 for p in ps)
                   for d, ps in zip(expected, pairs, strict=True))
        return
    rows, starts, kv, ends, _ = found
    got = [{} for _ in blobs]
    data = u8.tobytes()
    for row, s, k, e in zip(rows.tolist(), starts.tolist(), kv.tolist(), ends.tolist(), strict=True):
        got[row][data[s:k].decode()] = data[k + 1:e].decode()
    assert [list(d.items()) for d in got] == [list(d.items()) for d in expected]


def test_records_of_half_a_kib_are_walked_not_searched(tmp_path, monkeypatch):
    """Records of ~700 bytes are found by walking their TOTALSIZE chain, which costs less
    than the search over every byte from ~350-byte records up (engine.tuning.WALK_MIN_AVG_BYTES)."""
    root = tmp_path / "store"
    make_store(root, 2, 1, body_bytes=500)

    def refuse(*_args):
        raise AssertionError("searched every byte for record starts")

    monkeypatch.setattr("engine.formats.record.spans._search_starts", refuse)
    reader = MqstoreReader(parse_options({"path": str(root)}), RowSelection(columns=("body",)))
    bodies = [body for part in reader.partitions() for batch in reader.read(part)
              for body in batch.column("body").to_pylist()]
    assert sorted(bodies) == sorted(r.body for r in engine_records(root).values())


def test_text_in_record_order_is_copied_without_a_gather(store_dir, records, monkeypatch):
    """Topics and KEYS tokens lie in record order: one Arrow take copies them, not a gather
    index of every byte (`take_spans`, left for spans out of order)."""
    def refuse(*_args):
        raise AssertionError("gathered spans that lie in order")

    monkeypatch.setattr("tools.spark.arrow_columns.take_spans", refuse)
    rows = asked_rows(store_dir, ("topic", "keys"))
    assert rows == [{"topic": r.topic, "keys": list(r.keys)} for _, r in sorted(records.items())]
