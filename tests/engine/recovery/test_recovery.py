"""Recovery (DESIGN §5): RocketMQ's testRecover in three phases, the extra scenarios its code
suggests (reference §10), checkpoint fallbacks, rebuilt consume queues and a power loss.

Damage is placed with the record codec's constants. A crash is `die()` (process death: the
files hold what the process wrote, `abort` stays, the last checkpoint is the one written at
open unless a test takes one) or a real child process that `os._exit`s. Every test ends with
`check(root) == []` after the reopened store is closed.
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from engine.check.findings import FindingKind
from engine.check.fsck import check
from engine.files.naming import ABORT_FILE, CHECKPOINT_FILE, INDEX_DIR, consume_queue_dir, index_shard_dir
from engine.formats.checkpoint import MQSTORE_PART_POS, Checkpoint
from engine.formats.cq_entry import CQ_ENTRY_SIZE, encode_cq_entry
from engine.formats.index_file import INDEX_ENTRY, decode_index_header, entry_pos
from engine.formats.record import (
    BLANK_MAGIC,
    BODY_CRC_OFFSET,
    BODY_OFFSET,
    FILLER_FMT,
    FILLER_SIZE,
    MAGIC_OFFSET,
    PHYSICAL_OFFSET_OFFSET,
    TOTAL_SIZE_OFFSET,
)
from engine.log import tail as log_tail
from engine.message import Message
from engine.recovery.checkpoint import CheckpointSource, write_checkpoint
from engine.recovery.recover import RecoveryMode
from engine.status import GetStatus
from engine.store import MessageStore
from tests.helpers import (
    SEGMENT_BYTES,
    SMALL_CONFIG,
    TOPIC,
    copy_store,
    cq_entry_of,
    die,
    log_bytes,
    open_refused,
    patch,
    quarantined,
    queue_bodies,
    read,
    rebuild,
    reopen,
    scan_start_after_index_trim,
    segment_of,
)
from workers.child_env import REPO_ROOT, child_env


def body(i: int) -> bytes:
    return b"message-%03d|" % i + b"." * (i % 7)


def write(store: MessageStore, start: int, count: int) -> list:
    """Messages start..start+count-1, alternating queues 0 and 1, each with key k<i>."""
    results = store.put_batch([Message(TOPIC, body(i), keys=(f"k{i}",), tags="TAG1", queue_id=i % 2)
                               for i in range(start, start + count)])
    assert all(r.ok for r in results)
    return results


def build(root: Path, count: int, *, crash: bool) -> list:
    store = MessageStore.open(root, SMALL_CONFIG)
    results = write(store, 0, count)
    if crash:
        die(store)
    else:
        store.close()
    return results


def expected_queues(count: int) -> dict[int, list[bytes]]:
    return {q: [body(i) for i in range(count) if i % 2 == q] for q in (0, 1)}


def assert_holds_exactly(store: MessageStore, count: int) -> None:
    """Messages 0..count-1 are all there, in order, and nothing else is."""
    for queue_id, bodies in expected_queues(count).items():
        assert queue_bodies(store, queue_id) == bodies
        assert store.max_offset(TOPIC, queue_id) == len(bodies)
    for i in range(count):
        assert [m.body for m in store.query_by_key(TOPIC, f"k{i}")] == [body(i)]


def record_size(root: Path, commit_pos: int) -> int:
    path, file_pos = segment_of(root, commit_pos)
    return int.from_bytes(read(path, file_pos + TOTAL_SIZE_OFFSET, 4), "big")


def tail_after(root: Path, pos: int) -> bytes:
    """The bytes a cut at `pos` removes: from pos to the last non-zero byte of the log."""
    return log_bytes(root)[pos:].rstrip(b"\0")


# ------------------------------------------------------------------------------ testRecover


def damage_last_record(root: Path, last, body_len: int) -> None:
    """RocketMQ's damageCommitLog: 16 zero bytes at the last record's TOPICLENGTH position."""
    path, file_pos = segment_of(root, last.commit_pos)
    patch(path, file_pos + BODY_OFFSET + body_len, bytes(16))


def test_recover_phase1_clean_restart_keeps_every_position(tmp_path):
    store = MessageStore.open(tmp_path, SMALL_CONFIG)
    results = write(store, 0, 30)
    written = store.commitlog.written_pos
    store.close()
    with reopen(tmp_path) as store:
        report = store.recovery_report
        assert (report.shutdown, report.cut_reason, report.quarantine_path) == ("clean", None, None)
        assert store.commitlog.written_pos == written > results[-1].commit_pos
        assert_holds_exactly(store, 30)
    assert check(tmp_path) == []


@pytest.mark.parametrize("abort", [False, True], ids=["clean_restart", "abort_file"])
def test_recover_phase2_and_3_damaged_last_record_is_refused_then_cut_by_rebuild(tmp_path, abort):
    results = build(tmp_path, 30, crash=False)
    last = results[-1]
    damage_last_record(tmp_path, last, len(body(29)))
    damaged = log_bytes(tmp_path)[last.commit_pos:last.commit_pos + record_size(tmp_path, last.commit_pos)]
    if abort:
        (tmp_path / ABORT_FILE).write_text("12345\n")
    # the clean stop's checkpoint calls the record durable: no silent cut, the operator rebuilds
    refused = open_refused(tmp_path)
    assert (refused.commit_pos, refused.path) == (last.commit_pos,
                                                  str(segment_of(tmp_path, last.commit_pos)[0]))
    store = rebuild(tmp_path)
    report = store.recovery_report
    assert report.shutdown == ("crash" if abort else "clean")
    assert report.cut_pos == last.commit_pos and report.cut_reason
    assert store.commitlog.written_pos == last.commit_pos  # back to where the record began
    assert quarantined(tmp_path) == [damaged]
    assert_holds_exactly(store, 29)
    again = store.put(TOPIC, b"after recovery", queue_id=last.queue_id)
    assert (again.queue_offset, again.commit_pos) == (last.queue_offset, last.commit_pos)
    assert store.read_at(again.commit_pos).body == b"after recovery"
    store.close()
    assert check(tmp_path) == []


# ------------------------------------------------------------------------------ torn records


def _flip(root: Path, pos: int) -> bytes:
    path, file_pos = segment_of(root, pos)
    return bytes([read(path, file_pos, 1)[0] ^ 0x5A])


DAMAGES = {
    # name: (victim index among 30, damage(root, commit_pos, size) -> None)
    "half_written_last": (29, lambda root, pos, size: patch(*segment_of(root, pos + size // 2),
                                                            bytes(size - size // 2))),
    "totalsize_too_big_last": (29, lambda root, pos, size: patch(
        *segment_of(root, pos + TOTAL_SIZE_OFFSET), (size + 8).to_bytes(4, "big"))),
    "totalsize_too_small_mid": (12, lambda root, pos, size: patch(
        *segment_of(root, pos + TOTAL_SIZE_OFFSET), (size - 1).to_bytes(4, "big"))),
    "body_crc_mid": (12, lambda root, pos, size: patch(*segment_of(root, pos + BODY_OFFSET),
                                                       _flip(root, pos + BODY_OFFSET))),
    "bodycrc_field_mid": (12, lambda root, pos, size: patch(*segment_of(root, pos + BODY_CRC_OFFSET),
                                                            _flip(root, pos + BODY_CRC_OFFSET))),
    "crc32c_digit_mid": (12, lambda root, pos, size: patch(
        *segment_of(root, pos + size - 2), b"0" if read(*segment_of(root, pos + size - 2), 1) != b"0"
        else b"1")),
    "physical_offset_mid": (12, lambda root, pos, size: patch(
        *segment_of(root, pos + PHYSICAL_OFFSET_OFFSET), (pos + 1).to_bytes(8, "big"))),
    "magic_mid": (12, lambda root, pos, size: patch(*segment_of(root, pos + MAGIC_OFFSET),
                                                    b"\xde\xad\xbe\xef")),
}


@pytest.mark.parametrize("name", sorted(DAMAGES))
def test_torn_or_corrupt_record_after_crash_cuts_everything_from_it(tmp_path, name):
    """Half-written, length mismatch, CRC-corrupt (in the middle of a segment), wrong position or
    magic: recovery keeps the prefix before the bad record, quarantines exactly the removed bytes
    (valid records after it included) and the queues continue from the cut."""
    victim, damage = DAMAGES[name]
    results = build(tmp_path, 30, crash=True)
    pos = results[victim].commit_pos
    _, file_pos = segment_of(tmp_path, pos)
    if victim != 29:
        assert file_pos > 0 and segment_of(tmp_path, results[victim + 1].commit_pos)[1] > file_pos
    damage(tmp_path, pos, record_size(tmp_path, pos))
    removed = tail_after(tmp_path, pos)
    store = reopen(tmp_path)
    report = store.recovery_report
    assert (report.cut_pos, store.commitlog.written_pos) == (pos, pos)
    assert report.cut_reason and report.quarantined_bytes == len(removed)
    assert quarantined(tmp_path) == [removed]
    if victim < 25:  # later segments that held records are gone and reported
        assert report.segments_removed
    assert_holds_exactly(store, victim)
    for i in range(victim, 30):
        assert store.query_by_key(TOPIC, f"k{i}") == []  # index entries past the cut went too
    nxt = store.put(TOPIC, b"next", queue_id=victim % 2)
    assert (nxt.commit_pos, nxt.queue_offset) == (pos, results[victim].queue_offset)
    store.close()
    assert check(tmp_path) == []


@pytest.mark.parametrize("chunk_bytes", [97, SEGMENT_BYTES + 7])
def test_quarantine_is_streamed_in_chunks_byte_identical_with_the_same_count(tmp_path, monkeypatch,
                                                                             chunk_bytes):
    """A tail of several segments copied in chunks smaller (and larger, not aligned) than a
    segment: the quarantine file and the report equal those of the default 8 MiB chunk."""
    victim, count = 3, 120
    results = build(tmp_path / "a", count, crash=True)
    pos = results[victim].commit_pos
    patch(*segment_of(tmp_path / "a", pos + BODY_OFFSET), _flip(tmp_path / "a", pos + BODY_OFFSET))
    removed = tail_after(tmp_path / "a", pos)
    assert len(removed) > 3 * max(chunk_bytes, SEGMENT_BYTES)  # several chunks and segments
    copy_store(tmp_path / "a", tmp_path / "b")  # a plain copy: no holes in its last segment
    with reopen(tmp_path / "b") as store:
        default = store.recovery_report
    monkeypatch.setattr(log_tail, "QUARANTINE_CHUNK_BYTES", chunk_bytes)
    with reopen(tmp_path / "a") as store:
        chunked = store.recovery_report
    assert quarantined(tmp_path / "a") == quarantined(tmp_path / "b") == [removed]
    assert chunked.quarantined_bytes == default.quarantined_bytes == len(removed)
    assert chunked.quarantined_records == default.quarantined_records == count - 1 - victim
    assert not list((tmp_path / "a" / "quarantine").glob("*.tmp"))  # written under a temporary name
    assert check(tmp_path / "a") == [] and check(tmp_path / "b") == []


# ------------------------------------------------------------------------------ fillers


def _first_roll(results) -> int:
    """Index of the first message in the second segment."""
    return next(i for i, r in enumerate(results) if r.commit_pos >= SEGMENT_BYTES)


def test_blank_filler_at_segment_boundary_is_crossed(tmp_path):
    results = build(tmp_path, 30, crash=True)
    k = _first_roll(results)
    filler_pos = results[k - 1].commit_pos + record_size(tmp_path, results[k - 1].commit_pos)
    assert results[k].commit_pos == SEGMENT_BYTES
    path, file_pos = segment_of(tmp_path, filler_pos)
    size, magic = struct.unpack(FILLER_FMT, read(path, file_pos, FILLER_SIZE))
    assert (size, magic) == (SEGMENT_BYTES - file_pos, BLANK_MAGIC)
    store = reopen(tmp_path)
    assert store.recovery_report.cut_reason is None and quarantined(tmp_path) == []
    assert_holds_exactly(store, 30)
    store.close()
    assert check(tmp_path) == []


@pytest.mark.parametrize("how", ["zeroed", "wrong_size"])
def test_damaged_filler_cuts_at_the_filler(tmp_path, how):
    results = build(tmp_path, 30, crash=True)
    k = _first_roll(results)
    filler_pos = results[k - 1].commit_pos + record_size(tmp_path, results[k - 1].commit_pos)
    path, file_pos = segment_of(tmp_path, filler_pos)
    if how == "zeroed":
        patch(path, file_pos, bytes(FILLER_SIZE))
    else:
        patch(path, file_pos + TOTAL_SIZE_OFFSET, (SEGMENT_BYTES - file_pos - 4).to_bytes(4, "big"))
    removed = tail_after(tmp_path, filler_pos)
    store = reopen(tmp_path)
    assert store.commitlog.written_pos == filler_pos
    assert quarantined(tmp_path) == [removed]
    assert_holds_exactly(store, k)
    store.put(TOPIC, b"x" * 600, queue_id=k % 2)  # does not fit: a new filler and a roll
    store.close()
    assert check(tmp_path) == []


def test_first_record_of_a_segment_damaged_cut_at_the_segment_base(tmp_path):
    results = build(tmp_path, 30, crash=True)
    k = _first_roll(results)
    pos = results[k].commit_pos
    patch(*segment_of(tmp_path, pos + BODY_OFFSET), _flip(tmp_path, pos + BODY_OFFSET))
    store = reopen(tmp_path)
    assert store.commitlog.written_pos == pos == SEGMENT_BYTES
    assert_holds_exactly(store, k)
    assert store.put(TOPIC, b"next", queue_id=k % 2).commit_pos == SEGMENT_BYTES
    store.close()
    assert check(tmp_path) == []


def test_damaged_last_record_at_a_segment_base_after_a_clean_stop_is_refused_then_cut(tmp_path):
    """The re-verified last record (see phase 2) is the first of its segment: a segment base is a
    record boundary, so the damage is named there (and a rebuild cuts there), not taken for an
    untrustworthy scan start."""
    k = _first_roll(build(tmp_path / "probe", 30, crash=False))
    results = build(tmp_path / "store", k + 1, crash=False)
    pos = results[k].commit_pos
    assert pos == SEGMENT_BYTES
    patch(*segment_of(tmp_path / "store", pos + BODY_OFFSET), _flip(tmp_path / "store", pos + BODY_OFFSET))
    removed = tail_after(tmp_path / "store", pos)
    assert open_refused(tmp_path / "store").commit_pos == pos  # below the clean stop's line
    store = rebuild(tmp_path / "store")
    assert (store.recovery_report.cut_pos, store.commitlog.written_pos) == (pos, pos)
    assert store.recovery_report.cut_reason and quarantined(tmp_path / "store") == [removed]
    assert_holds_exactly(store, k)
    store.close()
    assert check(tmp_path / "store") == []


# ------------------------------------------------------------------------------ consume queues


def test_empty_last_cq_file_after_crash(tmp_path):
    """RocketMQ #9728: a crash right after a consume-queue file is created leaves it empty."""
    store = MessageStore.open(tmp_path, SMALL_CONFIG)
    store.put_batch([Message(TOPIC, body(i), keys=(f"k{i}",)) for i in range(10)])  # one full file
    die(store)
    next_file, _ = cq_entry_of(tmp_path, 0, 10)
    assert not next_file.exists()
    next_file.write_bytes(bytes(SMALL_CONFIG.consume_queue_entries * CQ_ENTRY_SIZE))
    (consume_queue_dir(tmp_path, TOPIC, 1)).mkdir()  # and a queue whose only file is empty
    cq_entry_of(tmp_path, 1, 0)[0].write_bytes(bytes(SMALL_CONFIG.consume_queue_entries * CQ_ENTRY_SIZE))
    store = reopen(tmp_path)
    assert (store.min_offset(TOPIC, 0), store.max_offset(TOPIC, 0)) == (0, 10)
    assert (store.min_offset(TOPIC, 1), store.max_offset(TOPIC, 1)) == (0, 0)
    assert store.put(TOPIC, b"eleventh").queue_offset == 10
    assert store.put(TOPIC, b"first of 1", queue_id=1).queue_offset == 0
    assert queue_bodies(store, 0)[-1] == b"eleventh"
    store.close()
    assert check(tmp_path) == []


def test_empty_last_cq_file_whose_entries_were_lost_is_redispatched(tmp_path):
    store = MessageStore.open(tmp_path, SMALL_CONFIG)
    store.put_batch([Message(TOPIC, body(i), keys=(f"k{i}",)) for i in range(14)])
    die(store)
    path, _ = cq_entry_of(tmp_path, 0, 10)
    path.write_bytes(bytes(path.stat().st_size))  # entries 10..13 never reached the disk
    store = reopen(tmp_path)
    assert queue_bodies(store, 0) == [body(i) for i in range(14)]
    store.close()
    assert check(tmp_path) == []


def test_consume_queue_missing_after_crash_is_rebuilt(tmp_path):
    build(tmp_path, 30, crash=True)
    shutil.rmtree(tmp_path / "consumequeue" / TOPIC)
    store = reopen(tmp_path)
    assert store.recovery_report.cq_entries_redispatched == 30
    assert_holds_exactly(store, 30)
    store.close()
    assert check(tmp_path) == []


def test_consume_queue_missing_with_durable_entries_is_flagged_then_rebuilt(tmp_path):
    """Entries the checkpoint calls durable are not re-dispatched by routine recovery (bounded
    work); check reports what is missing and a rebuild recovery restores the queue."""
    store = MessageStore.open(tmp_path, SMALL_CONFIG)
    write(store, 0, 14)
    store.checkpoint()
    write(store, 14, 16)
    die(store)
    shutil.rmtree(tmp_path / "consumequeue" / TOPIC)
    reopen(tmp_path).close()
    assert FindingKind.CQ_MISSING_ENTRY in {f.kind for f in check(tmp_path)}
    store = MessageStore.open(tmp_path, SMALL_CONFIG, recovery=RecoveryMode.REBUILD)
    assert_holds_exactly(store, 30)
    store.close()
    assert check(tmp_path) == []


def test_consume_queue_entry_pointing_to_another_record_is_rebuilt(tmp_path):
    results = build(tmp_path, 30, crash=True)
    other = results[8]  # queue 0, offset 4
    patch(*cq_entry_of(tmp_path, 0, 2), encode_cq_entry(other.commit_pos,
                                                        record_size(tmp_path, other.commit_pos), 0))
    store = reopen(tmp_path)
    assert store.recovery_report.queues_rebuilt == [f"{TOPIC}/0"]
    assert_holds_exactly(store, 30)
    store.close()
    assert check(tmp_path) == []



# ------------------------------------------------------------------------------ index


def _index_files(root: Path) -> list[Path]:
    return sorted(p for shard in sorted((root / INDEX_DIR).iterdir()) for p in sorted(shard.iterdir()))


def test_index_entries_past_the_checkpoint_lost_are_reindexed(tmp_path):
    store = MessageStore.open(tmp_path, SMALL_CONFIG)
    write(store, 0, 15)
    durable = store.checkpoint().index_durable_pos
    write(store, 15, 15)
    die(store)
    for shard, path in enumerate(_index_files(tmp_path)):
        data = path.read_bytes()
        count = decode_index_header(data).index_count
        first_lost = next(n for n in range(1, count)
                          if INDEX_ENTRY.unpack_from(data, entry_pos(SMALL_CONFIG.index_slot_count, n))[1]
                          >= durable[shard])
        lost_at = entry_pos(SMALL_CONFIG.index_slot_count, first_lost)
        patch(path, lost_at, bytes(len(data) - lost_at))  # torn: the header still counts them
    store = reopen(tmp_path)
    assert store.recovery_report.index_keys_redispatched >= 15
    assert_holds_exactly(store, 30)
    store.close()
    assert check(tmp_path) == []


@pytest.mark.parametrize("how", ["deleted", "zeroed"])
def test_index_file_created_after_the_checkpoint_lost_is_rebuilt(tmp_path, how):
    config = SMALL_CONFIG.replace(index_entry_count=8, index_shards=1)  # 7 keys a file
    store = MessageStore.open(tmp_path, config)
    write(store, 0, 6)  # 12 keys: two files
    store.checkpoint()
    write(store, 6, 10)
    die(store)
    files = sorted(index_shard_dir(tmp_path, 0).iterdir())
    assert len(files) >= 4
    newest = files[-1]
    if how == "deleted":
        newest.unlink()
    else:
        newest.write_bytes(bytes(newest.stat().st_size))
    store = MessageStore.open(tmp_path, config)
    assert_holds_exactly(store, 16)
    store.close()
    assert check(tmp_path) == []


# ------------------------------------------------------------------------------ checkpoint


def _crashed_with_two_checkpoints(root: Path) -> tuple[Checkpoint, Checkpoint]:
    """Checkpoint A after 10 messages (left as .bak), B after 20, crash after 30."""
    store = MessageStore.open(root, SMALL_CONFIG)
    write(store, 0, 10)
    a = store.checkpoint()
    write(store, 10, 10)
    b = store.checkpoint()
    write(store, 20, 10)
    die(store)
    return a, b


def _corrupt(path: Path) -> None:
    patch(path, MQSTORE_PART_POS + 8, _flip_file(path, MQSTORE_PART_POS + 8))


def _flip_file(path: Path, pos: int) -> bytes:
    return bytes([read(path, pos, 1)[0] ^ 0xFF])


@pytest.mark.parametrize(("primary", "backup", "source", "start"), [
    ("ok", "ok", CheckpointSource.PRIMARY, "b"),
    ("missing", "ok", CheckpointSource.BACKUP, "a"),
    ("corrupt", "ok", CheckpointSource.BACKUP, "a"),
    ("corrupt", "corrupt", CheckpointSource.NONE, "zero"),
    ("missing", "missing", CheckpointSource.NONE, "zero"),
    ("corrupt", "missing", CheckpointSource.NONE, "zero"),
])
def test_checkpoint_falls_back_to_bak_then_full_scan(tmp_path, primary, backup, source, start):
    a, b = _crashed_with_two_checkpoints(tmp_path)
    cp_path = tmp_path / CHECKPOINT_FILE
    bak_path = cp_path.with_name(CHECKPOINT_FILE + ".bak")
    for path, state in ((cp_path, primary), (bak_path, backup)):
        if state == "missing":
            path.unlink()
        elif state == "corrupt":
            _corrupt(path)
    expected_start = {"a": scan_start_after_index_trim(tmp_path, a),
                      "b": scan_start_after_index_trim(tmp_path, b), "zero": 0}[start]
    store = reopen(tmp_path)
    report = store.recovery_report
    assert report.checkpoint_source == source.value
    assert report.scan_start_pos == expected_start
    if source is not CheckpointSource.PRIMARY:
        assert report.checkpoint_problems  # what was wrong with the skipped files is reported
    if primary == "corrupt":
        assert any("CRC" in p for p in report.checkpoint_problems)
    assert report.cut_reason is None
    assert_holds_exactly(store, 30)  # re-dispatch from earlier adds no duplicates
    store.close()
    assert check(tmp_path) == []


def test_checkpoint_with_zero_positions_scans_from_the_start(tmp_path):
    build(tmp_path, 30, crash=False)
    write_checkpoint(tmp_path, Checkpoint(index_durable_pos=(0, 0)))
    store = reopen(tmp_path)
    report = store.recovery_report
    assert (report.checkpoint_source, report.scan_start_pos) == (CheckpointSource.PRIMARY.value, 0)
    assert report.records_scanned == 30 and report.cq_entries_redispatched == 0
    assert_holds_exactly(store, 30)
    store.close()
    assert check(tmp_path) == []


# ------------------------------------------------------------------------------ power loss

CHILD = r"""
import json, os, shutil, sys
from pathlib import Path
from engine.config import StoreConfig
from engine.store import MessageStore

root, synced = Path(sys.argv[1]), Path(sys.argv[2])
config = StoreConfig(**json.loads(sys.argv[3]))
count, checkpoint_at = int(sys.argv[4]), int(sys.argv[5])

def emit(**fields):
    print(json.dumps(fields), flush=True)

store = MessageStore.open(root, config)
for i in range(count):
    r = store.put("T", b"pl-%d" % i, keys=("pk%d" % i,), queue_id=i % 2)
    assert r.ok, r
    emit(kind="ack", i=i, queue_id=r.queue_id, queue_offset=r.queue_offset,
         flushed=store.commitlog.flushed_pos)
    if i == checkpoint_at:
        store.checkpoint()  # consume queues and index msync'd: copy what is now on disk
        for name in ("consumequeue", "index"):
            shutil.copytree(root / name, synced / name)
# The power goes while a put waits in msync: its bytes are in the page cache, not on disk.
store.commitlog.flush = lambda: store.commitlog.flushed_pos
store.put("T", b"in-flight", keys=("in-flight",), queue_id=0)
emit(kind="in_flight")
os._exit(0)  # no close: the process is simply gone
"""


def run_child(tmp_path: Path, count: int, checkpoint_at: int) -> tuple[Path, Path, list[dict]]:
    root, synced = tmp_path / "crashed", tmp_path / "synced"
    synced.mkdir()
    config = json.dumps({k: str(v) if k == "flush" else v
                         for k, v in dataclasses.asdict(SMALL_CONFIG).items()})
    proc = subprocess.run([sys.executable, "-c", CHILD, str(root), str(synced), config, str(count),
                           str(checkpoint_at)], cwd=REPO_ROOT, capture_output=True, text=True,
                          env=child_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert events[-1]["kind"] == "in_flight"
    assert (root / ABORT_FILE).exists()
    return root, synced, events[:-1]


def lose_unsynced_pages(root: Path, synced: Path, flushed_end: int, rng: random.Random) -> int:
    """Power loss: every page holding bytes that were never msync'd independently reverts to its
    last synced content (or keeps the new one). The commitlog is synced up to `flushed_end`
    (zeros after it before the crash); consume queues and index files were last synced at the
    checkpoint (`synced` holds that copy; files created since were created as zeros)."""
    page, lost = 4096, 0
    log = sorted((root / "commitlog").iterdir())
    for path in log:
        base = int(path.name)
        data = bytearray(path.read_bytes())
        for start in range(0, len(data), page):
            durable_until = min(max(flushed_end - base - start, 0), page)
            if durable_until < page and any(data[start + durable_until:start + page]) \
                    and rng.random() < 0.5:
                data[start + durable_until:start + page] = bytes(page - durable_until)
                lost += 1
        path.write_bytes(bytes(data))
    for name in ("consumequeue", "index"):
        for path in sorted(p for p in (root / name).rglob("*") if p.is_file()):
            old_path = synced / path.relative_to(root)
            data = bytearray(path.read_bytes())
            old = old_path.read_bytes() if old_path.exists() else bytes(len(data))
            for start in range(0, len(data), page):
                if data[start:start + page] != old[start:start + page] and rng.random() < 0.5:
                    data[start:start + page] = old[start:start + page]
                    lost += 1
            path.write_bytes(bytes(data))
    return lost


def test_power_loss_loses_nothing_acknowledged(tmp_path):
    """A real child process puts under sync flush, reporting each acknowledged message, takes one
    checkpoint, then dies (os._exit) while a put is stuck in msync. Copies of the crash state
    then lose unsynced pages with different seeds (seed None: process death only)."""
    crashed, synced, acks = run_child(tmp_path, count=40, checkpoint_at=15)
    flushed_end = acks[-1]["flushed"]
    for seed in (None, 1, 2, 3, 4):
        root = tmp_path / f"seed-{seed}"
        shutil.copytree(crashed, root)
        if seed is not None:
            assert lose_unsynced_pages(root, synced, flushed_end, random.Random(seed)) > 0, seed
        store = reopen(root)
        try:
            assert store.recovery_report.shutdown == "crash"
            for ack in acks:
                got = store.get_messages(TOPIC, ack["queue_id"], ack["queue_offset"], 1)
                assert got.status is GetStatus.FOUND, (seed, ack)
                assert got.messages[0].body == b"pl-%d" % ack["i"], (seed, ack)
                assert [m.body for m in store.query_by_key(TOPIC, f"pk{ack['i']}")] == \
                    [b"pl-%d" % ack["i"]], (seed, ack)
            acked = {q: sum(1 for a in acks if a["queue_id"] == q) for q in (0, 1)}
            assert store.max_offset(TOPIC, 1) == acked[1], seed
            assert store.max_offset(TOPIC, 0) in (acked[0], acked[0] + 1), seed  # + the in-flight
        finally:
            store.close()
        assert check(root) == [], seed
