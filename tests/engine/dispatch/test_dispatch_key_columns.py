"""Key columns per shard (what the dispatcher hands the index builders through the key ring)
index exactly what the record-by-record path indexes, however the blocks are cut, repeated or
overlapped; queue grouping keeps each queue's records in order."""

from __future__ import annotations

import numpy as np
import pytest

from engine.dispatch.record import KeyColumns, keys_by_shard, put_key_columns, queue_groups, shard_key_columns
from engine.formats.index_file import index_key
from engine.formats.java_hash import index_key_hash
from engine.formats.record import Verify
from engine.formats.record.dispatch_columns import columns_from_headers
from tests.engine.dispatch.test_dispatch_batch import (
    SHARDS,
    close_all,
    derived_files,
    dispatch_scalar,
    open_derived,
    write_log,
)


def blocks_of(log, end: int, shard_count: int) -> list[tuple[int, int, list[KeyColumns]]]:
    """(start_pos, end_pos, per-shard key columns) of each run, as the dispatcher publishes them."""
    blocks = []
    scanner = log.scan_batches(0, end, Verify.STRUCTURE)
    run_start = scanner.pos
    for run in scanner:
        blocks.append((run_start, scanner.pos, shard_key_columns(run.columns(), shard_count)))
        run_start = scanner.pos
    return blocks


def apply_blocks(shards, blocks) -> None:
    for start, end, per_shard in blocks:
        for shard, keys in zip(shards, per_shard, strict=True):
            if start <= shard.processed_pos < end:
                put_key_columns(shard, keys, end)


def index_files(root) -> dict[str, bytes]:
    return {name: data for name, data in derived_files(root).items() if name.startswith("index")}


def test_key_columns_index_what_the_scalar_path_indexes(tmp_path):
    log = write_log(tmp_path / "log", 500, seed=11)
    end = log.written_pos
    queues, shards = open_derived(tmp_path / "scalar")
    dispatch_scalar(log, 0, end, queues, shards)
    close_all(queues, shards)
    log_runs = blocks_of(log, end, SHARDS)
    assert len(log_runs) > 3  # several runs (segments of 16 KiB): several blocks
    queues, shards = open_derived(tmp_path / "ring")
    apply_blocks(shards, log_runs)
    close_all(queues, shards)
    assert index_files(tmp_path / "ring") == index_files(tmp_path / "scalar")
    assert index_files(tmp_path / "ring")


def test_repeated_and_straddling_blocks_change_nothing(tmp_path):
    """A restarted dispatcher re-publishes from further back, cut at other places: blocks wholly
    behind are skipped and one that straddles the position puts only the keys past it."""
    log = write_log(tmp_path / "log", 500, seed=12)
    end = log.written_pos
    queues, shards = open_derived(tmp_path / "scalar")
    dispatch_scalar(log, 0, end, queues, shards)
    close_all(queues, shards)
    positions = [h.commit_pos for h in log.scan_headers(0, end)]
    first = blocks_of(log, positions[300], SHARDS)
    queues, shards = open_derived(tmp_path / "ring")
    apply_blocks(shards, first)
    # the "restarted dispatcher": one block over records 100..400, then the rest run by run
    cols = columns_from_headers(list(log.scan_headers(positions[100], positions[400])))
    straddling = [(positions[100], positions[400], shard_key_columns(cols, SHARDS))]
    apply_blocks(shards, straddling)
    assert all(shard.processed_pos == positions[400] for shard in shards)
    rest = [b for b in blocks_of(log, end, SHARDS) if b[1] > positions[400]]
    apply_blocks(shards, rest)
    apply_blocks(shards, first)  # wholly behind: nothing happens
    close_all(queues, shards)
    assert index_files(tmp_path / "ring") == index_files(tmp_path / "scalar")


def test_rollbacks_have_no_keys_and_shards_split_every_other_key(tmp_path):
    log = write_log(tmp_path / "log", 300, seed=13)
    headers = list(log.scan_headers(0, log.written_pos))
    cols = columns_from_headers(headers)
    per_shard = shard_key_columns(cols, SHARDS)
    for shard_no, keys in enumerate(per_shard):
        expected = [(index_key_hash(index_key(h.topic, k)), h.commit_pos, h.store_ts_ms)
                    for h in headers for k in keys_by_shard(h, SHARDS).get(shard_no, [])]
        got = list(zip(keys.key_hash.tolist(), keys.commit_pos.tolist(), keys.store_ts_ms.tolist(),
                       strict=True))
        assert got == expected
        assert got  # every shard gets keys
    assert len(shard_key_columns(cols, 1)) == 1


def test_put_key_columns_never_moves_the_position_back(tmp_path):
    _, shards = open_derived(tmp_path)
    shard = shards[0]
    shard.mark_processed(1000)
    empty = np.zeros(0, dtype=np.int64)
    assert put_key_columns(shard, KeyColumns(empty, empty, empty), 900) == 0
    assert shard.processed_pos == 1000
    keys = KeyColumns(np.array([5, 6]), np.array([950, 1000]), np.array([1, 2]))
    assert put_key_columns(shard, keys, 1100) == 1  # only the key at 1000 is new
    assert shard.processed_pos == 1100


@pytest.mark.parametrize("pattern", ["one", "stretches", "interleaved"])
def test_queue_groups_keep_record_order_per_queue(tmp_path, pattern):
    log = write_log(tmp_path / "log", 200, seed=14)
    cols = columns_from_headers(list(log.scan_headers(0, log.written_pos)))
    n = cols.count
    topic_index = cols.topic_index
    if pattern == "one":
        queue_ids, topic_index = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    elif pattern == "stretches":  # batches: runs of 20 records per queue, joined per queue
        queue_ids, topic_index = (np.arange(n) // 20) % 3, (np.arange(n) // 60) % 2
    else:  # every record to another queue: more stretches than the join takes, sorted instead
        queue_ids = np.arange(n) % 5
    cols = type(cols)(**{**{f: getattr(cols, f) for f in cols.__dataclass_fields__},
                         "queue_id": queue_ids.astype(np.int64), "topic_index": topic_index})
    rows = np.flatnonzero(np.arange(n) % 7 != 3)  # a subset, as recovery passes
    groups = queue_groups(cols, rows)
    expected: dict[tuple[str, int], list[int]] = {}
    for row in rows.tolist():
        key = (cols.topics[int(cols.topic_index[row])], int(cols.queue_id[row]))
        expected.setdefault(key, []).append(row)
    assert {key: sel.tolist() for key, sel in groups} == expected
    assert len(groups) == len(expected)
    assert queue_groups(cols, rows[:0]) == []
