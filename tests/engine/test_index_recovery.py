"""Routine recovery of damaged index shards (DESIGN §5.4): a trim that meets a damaged entry
re-indexes what it takes; a shard whose files are gone or whose slot table disagrees with its
header is rebuilt from the commitlog. After each, every key is found and `check` is clean."""

from __future__ import annotations

from pathlib import Path

from engine.check import check
from engine.formats.index_file import decode_index_header, entry_pos
from engine.message import Message
from engine.naming import index_shard_dir
from engine.store import MessageStore
from tests.helpers import SMALL_CONFIG, TOPIC, die
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
