"""Routine recovery of damaged index shards (DESIGN §5.4): a trim that meets a damaged entry
re-indexes what it takes; a shard whose files are gone or whose slot table disagrees with its
header is rebuilt from the commitlog. After each, every key is found and `check` is clean."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from engine.check.fsck import check
from engine.config import StoreConfig
from engine.files.naming import QUARANTINE_DIR, index_shard_dir
from engine.formats.index_file import decode_index_header, entry_pos, slot_pos
from engine.message import Message
from engine.recovery.recover import StoreParts
from engine.retention.expiry import run_retention
from engine.store import MessageStore
from tests.helpers import SMALL_CONFIG, TOPIC, die, patch
from tools.torture.faults import flip_byte

COMMIT_POS_FIELD = 4  # index entry: key_hash 4 | commit_pos 8 | time_diff_s 4 | prev_index 4


def fill(root: Path, count: int, *, crash: bool = False) -> None:
    """Messages 0..count-1 with key k<i>, stopped cleanly (or killed)."""
    store = MessageStore.open(root, SMALL_CONFIG)
    results = store.put_batch([Message(TOPIC, b"body-%d" % i, keys=(f"k{i}",), queue_id=i % 2)
                               for i in range(count)])
    assert all(r.ok for r in results)
    if crash:
        die(store)
    else:
        store.close()


def assert_every_key_found(store: MessageStore, count: int) -> None:
    missing = [i for i in range(count) if [m.body for m in store.query_by_key(TOPIC, f"k{i}")]
               != [b"body-%d" % i]]
    assert missing == []


def index_files(root: Path, shard: int) -> list[Path]:
    return sorted(index_shard_dir(root, shard).iterdir())


# ------------------------------------------------------------------------------ a damaged entry


def test_damaged_entry_below_the_durable_line_is_reindexed_not_dropped(tmp_path):
    """The flipped entry is the first one trim's position search reads, so the search lands on
    it: the trim takes it and every entry after it, all durable, and the re-dispatch puts back
    exactly those (it used to mark the shard indexed up to the checkpoint and lose them)."""
    fill(tmp_path, 100)
    last = index_files(tmp_path, 0)[-1]
    count = decode_index_header(last.read_bytes()).index_count
    damaged = 1 + (count - 1) // 2
    flip_byte(last, entry_pos(SMALL_CONFIG.index_slot_count, damaged) + COMMIT_POS_FIELD, 0x40)

    with MessageStore.open(tmp_path, SMALL_CONFIG) as store:
        report = store.recovery_report
        assert report.index_entries_trimmed >= count - damaged
        assert report.index_keys_redispatched == report.index_entries_trimmed
        assert report.index_shards_rebuilt == []
        assert_every_key_found(store, 100)
    assert check(tmp_path) == []


def test_damaged_entry_after_a_crash_is_reindexed_with_the_lost_tail(tmp_path):
    fill(tmp_path, 60)
    store = MessageStore.open(tmp_path, SMALL_CONFIG)
    store.put_batch([Message(TOPIC, b"body-%d" % i, keys=(f"k{i}",), queue_id=i % 2) for i in range(60, 100)])
    die(store)  # the 40 newest are past the checkpoint
    last = index_files(tmp_path, 1)[-1]
    count = decode_index_header(last.read_bytes()).index_count
    flip_byte(last, entry_pos(SMALL_CONFIG.index_slot_count, 1 + (count - 1) // 2) + COMMIT_POS_FIELD, 0x40)

    with MessageStore.open(tmp_path, SMALL_CONFIG) as store:
        assert store.recovery_report.shutdown == "crash"
        assert_every_key_found(store, 100)
    assert check(tmp_path) == []


# ------------------------------------------------------------------------------ files missing or unsound

MANY_FILES = SMALL_CONFIG.replace(index_entry_count=32)  # 31 keys a file: 200 messages make ~7 a shard


def fill_many(root: Path, count: int = 200, config: StoreConfig = MANY_FILES) -> list[int]:
    """Messages 0..count-1 with key k<i>; their commit positions."""
    with MessageStore.open(root, config) as store:
        results = store.put_batch([Message(TOPIC, b"body-%d" % i, keys=(f"k{i}",), queue_id=0)
                                   for i in range(count)])
    assert all(r.ok for r in results)
    return [r.commit_pos for r in results]


def reopen_twice(root: Path, positions: list[int], config: StoreConfig = MANY_FILES) -> tuple[list, list]:
    """index_shards_rebuilt of two routine opens in a row; after each, the key of every message
    at `positions` still in the log is found."""
    rebuilt = []
    for _ in range(2):
        with MessageStore.open(root, config) as store:
            rebuilt.append(store.recovery_report.index_shards_rebuilt)
            kept = [i for i, pos in enumerate(positions) if pos >= store.commitlog.min_pos]
            assert [i for i in kept if not store.query_by_key(TOPIC, f"k{i}")] == []
    return rebuilt[0], rebuilt[1]


@pytest.mark.parametrize("lost", ["directory", "every file", "oldest file"])
def test_missing_index_files_rebuild_the_shard_at_a_routine_open(tmp_path, lost):
    positions = fill_many(tmp_path)
    files = index_files(tmp_path, 0)
    assert len(files) >= 3
    if lost == "directory":
        shutil.rmtree(index_shard_dir(tmp_path, 0))
    else:
        for path in files if lost == "every file" else files[:1]:
            path.unlink()

    assert reopen_twice(tmp_path, positions) == ([0], [])  # rebuilt once, then left be
    assert check(tmp_path) == []
    set_aside = sorted((tmp_path / QUARANTINE_DIR).glob("index-0.*"))
    assert [sorted(p.name for p in d.iterdir()) for d in set_aside] == \
        ([[p.name for p in files[1:]]] if lost == "oldest file" else [])


def test_zeroed_slot_heads_of_the_newest_file_rebuild_the_shard(tmp_path):
    positions = fill_many(tmp_path)
    newest = index_files(tmp_path, 1)[-1]
    patch(newest, slot_pos(0), bytes(slot_pos(MANY_FILES.index_slot_count) - slot_pos(0)))
    assert reopen_twice(tmp_path, positions) == ([1], [])
    assert check(tmp_path) == []


@pytest.mark.parametrize("count", [0, 1])
def test_a_shard_no_key_went_to_is_not_rebuilt(tmp_path, count):
    """A new store, and one whose only message (two keys) left two of four shards without files
    while the checkpoint's positions for them are past it: nothing to rebuild, open after open."""
    config = MANY_FILES.replace(index_shards=4)
    positions = fill_many(tmp_path, count, config)
    assert sum(index_shard_dir(tmp_path, n).exists() for n in range(4)) <= 2 * count
    assert reopen_twice(tmp_path, positions, config) == ([], [])


def test_index_files_retention_deleted_are_not_rebuilt(tmp_path):
    positions = fill_many(tmp_path)
    with MessageStore.open(tmp_path, MANY_FILES) as store:
        parts = StoreParts(store.root, store.commitlog, store.queues, store.shards)
        report = run_retention(parts, MANY_FILES, now_ms=int(time.time() * 1000), usage_ratio=0.99,
                               max_files=4)
        assert report.index_files_removed >= 1
    assert reopen_twice(tmp_path, positions) == ([], [])
    assert check(tmp_path) == []
