"""engine.check.fsck: the offline fsck finds each kind of damage, changes nothing, and reads RocketMQ stores.

Damage is patched at offsets taken from the format constants. Each damage test then lets
`MessageStore.open` recover and asks check again: recovery is crash recovery, so damage a crash
can leave (past the last checkpoint) must be repaired, while damage to data the checkpoint
already calls durable is repaired by a rebuild recovery (RecoveryMode.REBUILD).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from engine.check import fsck
from engine.check.findings import FindingKind, findings_to_json
from engine.check.fsck import check, check_summary
from engine.check.index import expected_time_diffs_s
from engine.config import StoreConfig
from engine.errors import NotAStoreError
from engine.files.naming import (
    CHECKPOINT_FILE,
    INDEX_DIR,
    commitlog_dir,
    consume_queue_dir,
    index_shard_dir,
    offset_to_name,
)
from engine.formats.checkpoint import MQSTORE_PART_POS, Checkpoint, decode_checkpoint
from engine.formats.cq_entry import CQ_ENTRY_SIZE, encode_cq_entry
from engine.formats.index_file import (
    INDEX_ENTRY,
    INDEX_ENTRY_SIZE,
    INT32_MAX,
    decode_index_header,
    entry_pos,
    index_key_hash_of,
    shard_of,
    time_diff_s,
)
from engine.formats.record import BODY_OFFSET, encode_record
from engine.recovery.checkpoint import write_checkpoint
from engine.recovery.recover import RecoveryMode
from engine.store import MessageStore, close_parts
from tests.conftest import ROCKETMQ_SAMPLES
from tests.helpers import open_refused

SAMPLES = ROCKETMQ_SAMPLES
SEGMENT_BYTES = 4096
CONFIG = StoreConfig(commitlog_file_size=SEGMENT_BYTES, consume_queue_entries=10, index_slot_count=64,
                     index_entry_count=256, index_shards=2, queue_count=4,
                     cq_flush_interval_ms=10**9)  # checkpoints only at open and close
TOPIC = "T"
RECOVERY_LEAVES_DURABLE_DAMAGE = (
    "recovery scans the commitlog only from the checkpoint's lowest durable position (DESIGN "
    "§5.5, bounded work), so damage to data already durable at a clean stop is not seen by "
    "MessageStore.open; it needs a rebuild, which recovery does not do")


# ------------------------------------------------------------------------------ helpers


def make_store(root: Path, count: int = 25, *, close: bool = True) -> tuple[MessageStore, list]:
    """`count` messages over two queues, each with tags and one key; several segments."""
    store = MessageStore.open(root, CONFIG)
    results = [store.put(TOPIC, f"body-{i}".encode() * 20, tags=f"tag{i % 3}", keys=(f"key{i}",),
                         queue_id=i % 2) for i in range(count)]
    assert all(r.ok for r in results)
    if close:
        store.close()
    return store, results


def die(store: MessageStore) -> None:
    """What process death leaves: written pages stay (the page cache has them), the lock goes,
    `abort` and the last checkpoint stay; nothing is flushed or checkpointed on the way out."""
    store._lock.release()
    close_parts(store._parts)


def segment_path(root: Path, commit_pos: int) -> tuple[Path, int]:
    base = commit_pos - commit_pos % SEGMENT_BYTES
    return commitlog_dir(root) / offset_to_name(base), commit_pos - base


def patch(path: Path, file_pos: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(file_pos)
        fh.write(data)


def read(path: Path, file_pos: int, size: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(file_pos)
        return fh.read(size)


def cq_entry_path(root: Path, queue_id: int, queue_offset: int) -> tuple[Path, int]:
    lpos = queue_offset * CQ_ENTRY_SIZE
    file_bytes = CONFIG.consume_queue_entries * CQ_ENTRY_SIZE
    return consume_queue_dir(root, TOPIC, queue_id) / offset_to_name(lpos - lpos % file_bytes), \
        lpos % file_bytes


def index_entry_of(root: Path, key: str) -> tuple[Path, int]:
    """The index file and file position of the entry for TOPIC#key."""
    directory = index_shard_dir(root, shard_of(TOPIC, key, CONFIG.index_shards))
    want = index_key_hash_of(TOPIC, key)
    for path in sorted(directory.iterdir()):
        data = path.read_bytes()
        count = decode_index_header(data).index_count
        for n in range(1, count):
            pos = entry_pos(CONFIG.index_slot_count, n)
            if INDEX_ENTRY.unpack_from(data, pos)[0] == want:
                return path, pos
    raise AssertionError(f"no index entry for {key}")


def kinds(findings) -> set[FindingKind]:
    return {f.kind for f in findings}


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every file's content hash and mtime (ns)."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            out[str(path)] = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
    return out


def reopen_and_check(root: Path) -> list:
    MessageStore.open(root, CONFIG).close()
    return check(root)


def rebuild_and_check(root: Path) -> list:
    """Damage inside what the checkpoint calls durable is repaired by a rebuild recovery."""
    MessageStore.open(root, CONFIG, recovery=RecoveryMode.REBUILD).close()
    return check(root)


# ------------------------------------------------------------------------------ clean stores


def test_check_clean_store_finds_nothing_and_changes_nothing(tmp_path):
    make_store(tmp_path)
    before = snapshot(tmp_path)
    summary = check_summary(tmp_path)
    assert summary.findings == ()
    assert summary.records == 25 and summary.store_kind == "mqstore"
    assert snapshot(tmp_path) == before


def test_check_open_store_does_not_take_the_lock(tmp_path):
    store, _ = make_store(tmp_path, close=False)
    try:
        assert check(tmp_path) == []
    finally:
        store.close()


def test_check_empty_new_store_finds_nothing(tmp_path):
    MessageStore.open(tmp_path, CONFIG).close()
    assert check(tmp_path) == []


def test_check_not_a_store_raises(tmp_path):
    with pytest.raises(NotAStoreError):
        check(tmp_path / "absent")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(NotAStoreError):
        check(tmp_path)


def test_check_progress_reaches_total(tmp_path):
    make_store(tmp_path)
    calls = []
    check(tmp_path, progress=lambda done, total: calls.append((done, total)))
    assert calls and calls[-1][0] == calls[-1][1] > 0


@pytest.mark.parametrize("sample", ["store-2021", "store-2019"])
def test_check_rocketmq_sample_reads_all_records_and_changes_nothing(sample):
    root = SAMPLES / sample
    before = snapshot(root)
    summary = check_summary(root)
    assert summary.store_kind == "rocketmq"
    assert summary.findings == ()
    assert summary.records == 47
    assert snapshot(root) == before


def test_check_rocketmq_sample_copy_with_flipped_body_byte(tmp_path):
    """The RocketMQ path verifies BODYCRC: a copy with one body byte flipped is caught."""
    root = tmp_path / "rmq"
    (root / "commitlog").mkdir(parents=True)
    data = bytearray((SAMPLES / "store-2021/commitlog" / offset_to_name(0)).read_bytes())
    size = int.from_bytes(data[:4], "big")
    data[size + BODY_OFFSET] ^= 0xFF  # the second record's first body byte
    (commitlog_dir(root) / offset_to_name(0)).write_bytes(bytes(data))
    findings = check(root)
    assert [(f.kind, f.pos) for f in findings] == [(FindingKind.CORRUPT_RECORD, size)]
    assert "BODYCRC" in findings[0].detail


# ------------------------------------------------------------------------------ commitlog damage


def test_check_flipped_record_byte_crash_region_is_corrupt_then_recovered(tmp_path):
    store, results = make_store(tmp_path, 10, close=False)
    die(store)  # the only checkpoint is the one written at open: everything is past it
    victim = results[4].commit_pos
    path, file_pos = segment_path(tmp_path, victim)
    patch(path, file_pos + BODY_OFFSET, bytes([read(path, file_pos + BODY_OFFSET, 1)[0] ^ 0x01]))
    findings = check(tmp_path)
    assert [(f.kind, f.pos) for f in findings] == [(FindingKind.CORRUPT_RECORD, victim)]
    assert reopen_and_check(tmp_path) == []


def test_check_flipped_record_byte_durable_region_after_reopen_is_clean(tmp_path):
    _, results = make_store(tmp_path)
    victim = results[3].commit_pos
    path, file_pos = segment_path(tmp_path, victim)
    patch(path, file_pos + BODY_OFFSET, bytes([read(path, file_pos + BODY_OFFSET, 1)[0] ^ 0x01]))
    findings = check(tmp_path)
    assert [(f.kind, f.pos) for f in findings] == [(FindingKind.CORRUPT_RECORD, victim)]
    assert rebuild_and_check(tmp_path) == []


def test_check_flipped_byte_in_last_record_is_torn_tail(tmp_path):
    _, results = make_store(tmp_path, 5)
    victim = results[-1].commit_pos
    path, file_pos = segment_path(tmp_path, victim)
    patch(path, file_pos + BODY_OFFSET, b"\xff")
    end = victim + int.from_bytes(read(path, file_pos, 4), "big")  # TOTALSIZE
    findings = check(tmp_path)  # the checkpoint calls the damaged record durable: reported too
    assert [(f.kind, f.pos) for f in findings] == [(FindingKind.TORN_TAIL, victim),
                                                    (FindingKind.CHECKPOINT_INCONSISTENT, end)]
    # recovery re-verifies the last record after a clean stop, and it is below the durable line
    assert open_refused(tmp_path, CONFIG).commit_pos == victim
    assert rebuild_and_check(tmp_path) == []


def test_check_garbage_after_last_record_is_torn_tail_then_recovered(tmp_path):
    _, results = make_store(tmp_path, 5)
    end = _end_of_log(tmp_path)
    assert end > results[-1].commit_pos
    path, file_pos = segment_path(tmp_path, end)
    patch(path, file_pos, b"\x5a" * 37)
    before = snapshot(tmp_path)
    findings = check(tmp_path)
    assert [(f.kind, f.pos) for f in findings] == [(FindingKind.TORN_TAIL, end)]
    assert snapshot(tmp_path) == before  # a damaged store is not touched either
    assert reopen_and_check(tmp_path) == []
    assert any((tmp_path / "quarantine").iterdir())


def test_check_half_written_record_is_torn_tail_then_recovered(tmp_path):
    make_store(tmp_path, 5)
    end = _end_of_log(tmp_path)
    record = encode_record(TOPIC, b"half", queue_id=0, born_ts_ms=1, born_host=("127.0.0.1", 1),
                           store_host=("127.0.0.1", 10911))
    path, file_pos = segment_path(tmp_path, end)
    patch(path, file_pos, bytes(record[:BODY_OFFSET]))
    assert kinds(check(tmp_path)) == {FindingKind.TORN_TAIL}
    assert reopen_and_check(tmp_path) == []


def test_check_resynchronises_after_a_bad_totalsize(tmp_path):
    """A TOTALSIZE that points nowhere: the scan finds the next record by its magic."""
    store, results = make_store(tmp_path, 6, close=False)
    die(store)
    victim = results[1].commit_pos
    path, file_pos = segment_path(tmp_path, victim)
    patch(path, file_pos, (7).to_bytes(4, "big"))
    findings = check(tmp_path)
    corrupt = [f for f in findings if f.kind in (FindingKind.CORRUPT_RECORD, FindingKind.TORN_TAIL)]
    assert [(f.kind, f.pos) for f in corrupt] == [(FindingKind.CORRUPT_RECORD, victim)]
    assert check_summary(tmp_path).records == 5
    assert reopen_and_check(tmp_path) == []


def test_check_foreign_file_in_commitlog_is_layout(tmp_path):
    make_store(tmp_path, 3)
    (commitlog_dir(tmp_path) / "notes.txt").write_text("x")
    findings = check(tmp_path)
    assert kinds(findings) == {FindingKind.LAYOUT}
    assert findings[0].path.endswith("notes.txt")


def test_check_foreign_and_misaligned_files_in_a_consume_queue_are_layout(tmp_path):
    """A name that is no segment's, and a segment whose base is not a multiple of the file
    size, are each one LAYOUT finding; the queue's real files are still read (no other finding)."""
    make_store(tmp_path, 6)
    directory = consume_queue_dir(tmp_path, TOPIC, 0)
    (directory / "notes.txt").write_text("x")
    misaligned = directory / offset_to_name(CQ_ENTRY_SIZE * CONFIG.consume_queue_entries * 7 + 20)
    misaligned.write_bytes(b"\0" * CQ_ENTRY_SIZE * CONFIG.consume_queue_entries)
    findings = check(tmp_path)
    assert sorted((f.kind, Path(f.path).name) for f in findings) == \
        [(FindingKind.LAYOUT, misaligned.name), (FindingKind.LAYOUT, "notes.txt")]
    assert all(f.detail == "not a consume-queue file name" for f in findings)


def _end_of_log(root: Path) -> int:
    """End of valid data, from check itself (the last record's end or a filler's)."""
    return check_summary(root).end_pos


# ------------------------------------------------------------------------------ consume queues


def test_check_zeroed_cq_entry_is_gap_and_missing_then_recovered_after_crash(tmp_path):
    store, results = make_store(tmp_path, 20, close=False)
    die(store)
    path, file_pos = cq_entry_path(tmp_path, 0, 3)
    patch(path, file_pos, bytes(CQ_ENTRY_SIZE))
    summary = check_summary(tmp_path)
    assert FindingKind.CQ_GAP in kinds(summary.findings)
    # past the checkpoint's cq_durable_pos (taken at open): recovery re-dispatches its entry
    missing = [f for f in summary.pending if f.kind is FindingKind.CQ_MISSING_ENTRY]
    assert missing[0].pos == results[6].commit_pos  # queue 0 offset 3 is message 6
    assert reopen_and_check(tmp_path) == []


def test_check_zeroed_cq_entry_after_clean_stop_recovered(tmp_path):
    make_store(tmp_path, 20)
    path, file_pos = cq_entry_path(tmp_path, 0, 3)
    patch(path, file_pos, bytes(CQ_ENTRY_SIZE))
    assert {FindingKind.CQ_GAP, FindingKind.CQ_MISSING_ENTRY} <= kinds(check(tmp_path))
    assert rebuild_and_check(tmp_path) == []


def test_check_zeroed_last_cq_entry_is_missing(tmp_path):
    make_store(tmp_path, 20)
    path, file_pos = cq_entry_path(tmp_path, 1, 9)
    patch(path, file_pos, bytes(CQ_ENTRY_SIZE))
    assert kinds(check(tmp_path)) == {FindingKind.CQ_MISSING_ENTRY}
    assert reopen_and_check(tmp_path) == []  # the last record is re-dispatched


def test_check_cq_entry_to_wrong_record_is_mismatch_then_rebuilt_after_crash(tmp_path):
    store, results = make_store(tmp_path, 20, close=False)
    die(store)
    other = results[8]  # queue 0 offset 4
    size = int.from_bytes(read(*segment_path(tmp_path, other.commit_pos), 4), "big")  # TOTALSIZE
    patch(*cq_entry_path(tmp_path, 0, 2), encode_cq_entry(other.commit_pos, size, 0))
    findings = check(tmp_path)
    mismatch = [f for f in findings if f.kind is FindingKind.CQ_ENTRY_MISMATCH]
    assert [f.pos for f in mismatch] == [other.commit_pos]
    assert FindingKind.CQ_DUPLICATE in kinds(findings)
    assert reopen_and_check(tmp_path) == []


def test_check_cq_entry_to_wrong_record_after_clean_stop_recovered(tmp_path):
    _, results = make_store(tmp_path, 20)
    path, file_pos = cq_entry_path(tmp_path, 0, 2)
    patch(path, file_pos, encode_cq_entry(results[8].commit_pos + 1, 100, 0))
    assert FindingKind.CQ_ENTRY_MISMATCH in kinds(check(tmp_path))
    assert rebuild_and_check(tmp_path) == []


def test_check_cq_entry_past_end_then_recovered(tmp_path):
    make_store(tmp_path, 25)
    end = _end_of_log(tmp_path)
    path, file_pos = cq_entry_path(tmp_path, 0, 13)  # queue 0's next offset
    patch(path, file_pos, encode_cq_entry(end + 200, 150, 0))
    findings = check(tmp_path)
    assert [(f.kind, f.pos) for f in findings] == [(FindingKind.CQ_PAST_END, end + 200)]
    assert reopen_and_check(tmp_path) == []


def test_check_missing_cq_directory_reports_every_record(tmp_path):
    make_store(tmp_path, 20)
    for path in consume_queue_dir(tmp_path, TOPIC, 1).iterdir():
        path.unlink()
    findings = check(tmp_path)
    assert [(f.kind, f.detail.split(" record")[0]) for f in findings] == \
        [(FindingKind.CQ_MISSING_ENTRY, "10")]


def test_check_missing_cq_files_after_clean_stop_recovered(tmp_path):
    make_store(tmp_path, 20)
    for path in consume_queue_dir(tmp_path, TOPIC, 1).iterdir():
        path.unlink()
    assert rebuild_and_check(tmp_path) == []


# ------------------------------------------------------------------------------ index


def test_check_zeroed_index_entry_is_key_missing_then_recovered_after_crash(tmp_path):
    store, _ = make_store(tmp_path, 20, close=False)
    die(store)
    path, pos = index_entry_of(tmp_path, "key7")
    patch(path, pos, bytes(INDEX_ENTRY_SIZE))
    summary = check_summary(tmp_path)
    assert FindingKind.INDEX_FILE_CORRUPT in kinds(summary.findings)  # the chains no longer agree
    # past the checkpoint's index positions (taken at open): recovery indexes the key again
    missing = [f for f in summary.pending if f.kind is FindingKind.INDEX_KEY_MISSING]
    assert any("key7" in f.detail for f in missing)
    assert reopen_and_check(tmp_path) == []


def test_check_zeroed_index_entry_after_clean_stop_recovered(tmp_path):
    make_store(tmp_path, 20)
    path, pos = index_entry_of(tmp_path, "key3")
    patch(path, pos, bytes(INDEX_ENTRY_SIZE))
    assert FindingKind.INDEX_KEY_MISSING in kinds(check(tmp_path))
    assert rebuild_and_check(tmp_path) == []


def test_check_index_entry_to_non_record_is_unresolved(tmp_path):
    _, results = make_store(tmp_path, 20)
    path, pos = index_entry_of(tmp_path, "key5")
    key_hash, commit_pos, time_diff, prev = INDEX_ENTRY.unpack_from(read(path, pos, INDEX_ENTRY_SIZE))
    assert commit_pos == results[5].commit_pos
    patch(path, pos, INDEX_ENTRY.pack(key_hash, commit_pos + 1, time_diff, prev))
    findings = check(tmp_path)
    assert (FindingKind.INDEX_ENTRY_UNRESOLVED, commit_pos + 1) in {(f.kind, f.pos) for f in findings}
    assert FindingKind.INDEX_KEY_MISSING in kinds(findings)


def test_check_index_entry_to_non_record_after_clean_stop_recovered(tmp_path):
    make_store(tmp_path, 20)
    path, pos = index_entry_of(tmp_path, "key5")
    key_hash, commit_pos, time_diff, prev = INDEX_ENTRY.unpack_from(read(path, pos, INDEX_ENTRY_SIZE))
    patch(path, pos, INDEX_ENTRY.pack(key_hash, commit_pos + 1, time_diff, prev))
    assert rebuild_and_check(tmp_path) == []


def _time_diff_at(path: Path, pos: int) -> int:
    return INDEX_ENTRY.unpack_from(read(path, pos, INDEX_ENTRY_SIZE))[2]


def _patch_time_diff(path: Path, pos: int, time_diff_s: int) -> None:
    key_hash, commit_pos, _, prev = INDEX_ENTRY.unpack_from(read(path, pos, INDEX_ENTRY_SIZE))
    patch(path, pos, INDEX_ENTRY.pack(key_hash, commit_pos, time_diff_s, prev))


def _found_in_own_time(root: Path, key: str, commit_pos: int) -> bool:
    """query_by_key in the record's own store time, the tightest window a reader can ask."""
    with MessageStore.open(root, CONFIG) as store:
        ts = store.read_at(commit_pos).store_ts_ms
        return commit_pos in [r.commit_pos for r in store.query_by_key(TOPIC, key, ts, ts)]


def test_check_index_entry_with_a_wrong_time_is_found_then_rebuilt(tmp_path):
    _, results = make_store(tmp_path, 20)
    path, pos = index_entry_of(tmp_path, "key5")
    assert entry_pos(CONFIG.index_slot_count, 1) < pos  # not entry 1, whose time is the header's
    _patch_time_diff(path, pos, _time_diff_at(path, pos) + 1)
    findings = check(tmp_path)
    assert [(f.kind, f.pos) for f in findings] == [(FindingKind.INDEX_ENTRY_TIME, results[5].commit_pos)]
    assert "time_diff_s" in findings[0].detail
    assert not _found_in_own_time(tmp_path, "key5", results[5].commit_pos)  # what the finding costs
    assert rebuild_and_check(tmp_path) == []
    assert _found_in_own_time(tmp_path, "key5", results[5].commit_pos)


def test_check_index_header_with_a_wrong_begin_time_is_one_finding(tmp_path):
    make_store(tmp_path, 20)
    path = next((tmp_path / INDEX_DIR / "0").iterdir())
    begin_ts_ms = decode_index_header(path.read_bytes()).begin_ts_ms
    patch(path, 0, (begin_ts_ms + 5000).to_bytes(8, "big"))  # begin_ts_ms, the header's first field
    findings = check(tmp_path)
    assert [f.kind for f in findings] == [FindingKind.INDEX_ENTRY_TIME]  # not one per entry
    assert "header begin_ts_ms" in findings[0].detail and findings[0].path == str(path)
    assert rebuild_and_check(tmp_path) == []


def test_check_caps_wrong_entry_times_per_file(tmp_path, monkeypatch):
    monkeypatch.setattr(fsck, "MAX_FINDINGS_PER_FILE", 2)
    make_store(tmp_path, 20)
    path = next((tmp_path / INDEX_DIR / "0").iterdir())
    count = decode_index_header(path.read_bytes()).index_count
    for n in range(2, count):  # every entry but the first is a second late
        pos = entry_pos(CONFIG.index_slot_count, n)
        _patch_time_diff(path, pos, _time_diff_at(path, pos) + 1)
    times = [f for f in check(tmp_path) if f.kind is FindingKind.INDEX_ENTRY_TIME]
    assert len(times) == 3 and times[-1].detail == f"... and {count - 2 - 2} more"


ROLLING = dataclasses.replace(CONFIG, index_entry_count=8)  # 7 keys per index file


def test_check_rolled_index_files_are_clean_and_entry_one_times_are_checked(tmp_path):
    """Entry 1 of a rolled file measured its time_diff_s from the seed (the previous file's end):
    a clean store has no finding, and a flip there is found."""
    with MessageStore.open(tmp_path, ROLLING) as store:
        for i in range(30):
            assert store.put(TOPIC, b"x", keys=(f"key{i}",), queue_id=i % 2).ok
    files = sorted((tmp_path / INDEX_DIR / "0").iterdir())
    assert len(files) >= 3 and check(tmp_path) == []
    entry_one = entry_pos(ROLLING.index_slot_count, 1)
    for path in files[:2]:  # the unseeded first file and a seeded one
        diff = _time_diff_at(path, entry_one)
        _patch_time_diff(path, entry_one, diff ^ 0x40000000)
        findings = check(tmp_path)
        assert FindingKind.INDEX_ENTRY_TIME in kinds(findings), path.name
        assert any(f.path == str(path) and "entry 1 " in f.detail for f in findings), findings
        _patch_time_diff(path, entry_one, diff)
    assert check(tmp_path) == []


@pytest.mark.parametrize("begin_ts_ms", [0, -5, 1, 1_700_000_000_123])
def test_expected_time_diffs_are_what_the_index_writer_stores(begin_ts_ms):
    offsets = [-10**12, -1001, -1000, -999, -1, 0, 1, 999, 1000, 1001, 59_999, (INT32_MAX + 5) * 1000]
    store_ts = np.array([begin_ts_ms + d for d in offsets], dtype=np.int64)
    assert expected_time_diffs_s(store_ts, begin_ts_ms).tolist() == \
        [time_diff_s(int(ts), begin_ts_ms) for ts in store_ts]


def test_check_index_file_of_wrong_size_is_corrupt(tmp_path):
    make_store(tmp_path, 5)
    path = next((tmp_path / INDEX_DIR / "0").iterdir())
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size - 1)
    findings = check(tmp_path)
    assert FindingKind.INDEX_FILE_CORRUPT in kinds(findings)
    assert FindingKind.INDEX_KEY_MISSING in kinds(findings)


def test_check_index_file_of_wrong_size_after_reopen_is_clean(tmp_path):
    make_store(tmp_path, 5)
    path = next((tmp_path / INDEX_DIR / "0").iterdir())
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size - 1)
    assert reopen_and_check(tmp_path) == []


# ------------------------------------------------------------------------------ checkpoint


def test_check_corrupt_checkpoint_is_unreadable_then_recovered(tmp_path):
    make_store(tmp_path, 5)
    path = tmp_path / CHECKPOINT_FILE
    patch(path, MQSTORE_PART_POS + 6, b"\xff")  # inside the mqstore part, under the CRC
    findings = check(tmp_path)
    assert [f.kind for f in findings] == [FindingKind.CHECKPOINT_UNREADABLE]
    assert reopen_and_check(tmp_path) == []


def test_check_missing_checkpoint_is_unreadable(tmp_path):
    make_store(tmp_path, 5)
    (tmp_path / CHECKPOINT_FILE).unlink()
    assert kinds(check(tmp_path)) == {FindingKind.CHECKPOINT_UNREADABLE}
    assert reopen_and_check(tmp_path) == []


@pytest.mark.parametrize("where", ["mid_record", "past_end"])
def test_check_checkpoint_position_not_a_boundary_is_inconsistent_then_recovered(tmp_path, where):
    _, results = make_store(tmp_path, 5)
    cp = decode_checkpoint((tmp_path / CHECKPOINT_FILE).read_bytes())
    end = _end_of_log(tmp_path)
    bad = results[2].commit_pos + 3 if where == "mid_record" else end + 64
    write_checkpoint(tmp_path, Checkpoint(**{**_fields(cp), "commitlog_flushed_pos": bad}))
    findings = check(tmp_path)
    assert [(f.kind, f.pos) for f in findings] == [(FindingKind.CHECKPOINT_INCONSISTENT, bad)]
    if where == "past_end":  # the checkpoint claims durable bytes the log does not hold
        assert open_refused(tmp_path, CONFIG).commit_pos == end
        assert rebuild_and_check(tmp_path) == []
    else:
        assert reopen_and_check(tmp_path) == []


def _fields(cp: Checkpoint) -> dict:
    return {name: getattr(cp, name) for name in Checkpoint.__dataclass_fields__}


# ------------------------------------------------------------------------------ values


def test_findings_to_json_is_plain_data(tmp_path):
    make_store(tmp_path, 3)
    (tmp_path / CHECKPOINT_FILE).unlink()
    out = findings_to_json(check(tmp_path))
    assert out == [{"kind": "checkpoint_unreadable", "path": str(tmp_path / CHECKPOINT_FILE),
                    "detail": "missing", "pos": None}]


def test_check_caps_findings_per_file(tmp_path, monkeypatch):
    monkeypatch.setattr(fsck, "MAX_FINDINGS_PER_FILE", 2)
    make_store(tmp_path, 20)
    for offset in range(1, 9, 2):  # four separate gaps in queue 0's first file
        patch(*cq_entry_path(tmp_path, 0, offset), bytes(CQ_ENTRY_SIZE))
    gaps = [f for f in check(tmp_path) if f.kind is FindingKind.CQ_GAP]
    assert len(gaps) == 3 and gaps[-1].detail == "... and 2 more"
