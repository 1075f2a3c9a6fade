"""Recovery never silently cuts durable data (DESIGN §4 "a store never shrinks by surprise").

Below the durable line (the checkpoint's flushed position; without a checkpoint, the consume
queues' last entries) a bad record, zeros, a missing segment or a missing commitlog make the
open refuse with StoreCorruptError naming the path and position, and leave every file as it
was; the operator's rebuild (RecoveryMode.REBUILD) then cuts there and quarantines the rest.
Past the line, the torn tail of a crash is still cut by routine recovery.
"""

from __future__ import annotations

import dataclasses
import shutil

from engine.check.fsck import check
from engine.errors import StoreCorruptError
from engine.files.naming import ABORT_FILE, BACKUP_SUFFIX, CHECKPOINT_FILE, commitlog_dir, offset_to_name
from engine.formats.record import BODY_OFFSET, TOTAL_SIZE_OFFSET
from engine.message import Message
from engine.recovery.checkpoint import load_checkpoint, write_checkpoint
from engine.store import MessageStore
from tests.helpers import (
    SEGMENT_BYTES,
    SMALL_CONFIG,
    TOPIC,
    die,
    log_bytes,
    open_refused,
    patch,
    quarantined,
    queue_bodies,
    read,
    rebuild,
    reopen,
    segment_of,
)


def body(i: int) -> bytes:
    return b"durable-%03d|" % i + b"." * (i % 5)


def crashed_store(root, count: int, checkpoint_after: int) -> list:
    """`count` messages over queues 0 and 1; a checkpoint after the first `checkpoint_after`;
    then the process dies (abort stays; the checkpoint is the line)."""
    store = MessageStore.open(root, SMALL_CONFIG)
    results = store.put_batch([Message(TOPIC, body(i), keys=(f"k{i}",), queue_id=i % 2)
                               for i in range(checkpoint_after)])
    line = store.checkpoint().commitlog_flushed_pos
    results += store.put_batch([Message(TOPIC, body(i), keys=(f"k{i}",), queue_id=i % 2)
                                for i in range(checkpoint_after, count)])
    assert all(r.ok for r in results)
    die(store)
    assert (root / ABORT_FILE).exists() and line > results[checkpoint_after - 1].commit_pos
    return results


def lag_derived_positions(root, pos: int) -> None:
    """Rewrite the checkpoint as the supervisor writes it while its dispatcher and index
    builders lag: consume queues and index durable only up to `pos`, the commitlog further.
    Routine recovery then scans (and re-dispatches) from `pos`."""
    cp = load_checkpoint(root).checkpoint
    write_checkpoint(root, dataclasses.replace(
        cp, cq_durable_pos=pos, index_durable_pos=tuple(pos for _ in cp.index_durable_pos)))


def flip_body(root, commit_pos: int) -> None:
    path, file_pos = segment_of(root, commit_pos + BODY_OFFSET)
    patch(path, file_pos, bytes([read(path, file_pos, 1)[0] ^ 0x20]))


def test_flip_below_the_line_after_a_crash_is_refused_unchanged_and_rebuild_cuts_there(tmp_path):
    """Issue 19 item 2: a crashed sync store, one byte flipped in a record the checkpoint calls
    flushed. Today's routine recovery cut there and quarantined every later acknowledged record."""
    results = crashed_store(tmp_path, 60, checkpoint_after=50)
    lag_derived_positions(tmp_path, results[20].commit_pos)
    victim = 30
    pos = results[victim].commit_pos
    flip_body(tmp_path, pos)
    tail = log_bytes(tmp_path)[pos:].rstrip(b"\0")
    refused = open_refused(tmp_path)
    assert (refused.commit_pos, refused.path) == (pos, str(segment_of(tmp_path, pos)[0]))
    assert refused.durable_pos >= results[49].commit_pos and refused.records_after == 60 - victim - 1
    assert "mqstore recover --rebuild" in str(refused) and str(pos) in str(refused)
    assert not (tmp_path / "quarantine").exists()
    with rebuild(tmp_path) as store:  # the operator's choice: cut there, quarantine the rest
        assert (store.recovery_report.cut_pos, store.commitlog.written_pos) == (pos, pos)
        assert queue_bodies(store, 0) + queue_bodies(store, 1) == \
            [body(i) for i in range(victim) if i % 2 == 0] + [body(i) for i in range(victim) if i % 2]
    assert quarantined(tmp_path) == [tail]
    assert check(tmp_path) == []


def test_a_refused_start_leaves_a_crash_s_temp_files_and_an_unreadable_index_shard_alone(tmp_path):
    """Opening for writing removes `.tmp` leftovers and moves an unreadable index shard to
    quarantine/; a start refused for damage below the line must do neither (it did: the
    refusal came only after the store was opened for writing)."""
    results = crashed_store(tmp_path, 60, checkpoint_after=50)
    lag_derived_positions(tmp_path, results[20].commit_pos)
    flip_body(tmp_path, results[30].commit_pos)
    leftovers = [tmp_path / "index" / "0" / "00000000000000000000.tmp",
                 next((tmp_path / "consumequeue" / TOPIC).iterdir()) / "00000000000000000000.tmp"]
    for path in leftovers:
        path.write_bytes(b"half made")
    shard_file = next(p for p in sorted((tmp_path / "index" / "1").iterdir()) if p.suffix != ".tmp")
    patch(shard_file, 0, b"\xff" * 40)  # an unreadable index header
    open_refused(tmp_path)  # every file byte for byte, the leftovers and the shard included
    assert all(path.exists() for path in leftovers) and not (tmp_path / "quarantine").exists()


def test_torn_tail_past_the_line_is_still_cut_by_routine_recovery(tmp_path):
    results = crashed_store(tmp_path, 60, checkpoint_after=50)
    pos = results[55].commit_pos
    flip_body(tmp_path, pos)
    tail = log_bytes(tmp_path)[pos:].rstrip(b"\0")
    with reopen(tmp_path) as store:
        report = store.recovery_report
        assert (report.cut_pos, report.mode) == (pos, "routine") and report.durable_pos < pos
    assert quarantined(tmp_path) == [tail]
    assert check(tmp_path) == []


def test_missing_commitlog_is_refused_and_the_queues_are_kept(tmp_path):
    """Issue 19 item 3: the commitlog moved away after a clean stop; today's start trimmed the
    queues and index and called the empty store consistent."""
    with MessageStore.open(tmp_path, SMALL_CONFIG) as store:
        assert store.put(TOPIC, b"only", keys=("k",)).ok
    shutil.move(commitlog_dir(tmp_path), tmp_path.parent / "moved-away")
    refused = open_refused(tmp_path)
    assert refused.path == str(commitlog_dir(tmp_path)) and "missing" in refused.reason
    assert refused.durable_pos > 0
    assert not commitlog_dir(tmp_path).exists()  # not even an empty directory was made
    shutil.move(tmp_path.parent / "moved-away", commitlog_dir(tmp_path))
    with reopen(tmp_path) as store:  # put back, the store opens with its message
        assert queue_bodies(store, 0) == [b"only"]
    assert check(tmp_path) == []


def test_missing_commitlog_without_a_checkpoint_is_refused_from_the_queues(tmp_path):
    """No checkpoint either: the consume queues' entries prove data was durable."""
    with MessageStore.open(tmp_path, SMALL_CONFIG) as store:
        result = store.put(TOPIC, b"only", keys=("k",))
    size = int.from_bytes(read(*segment_of(tmp_path, result.commit_pos + TOTAL_SIZE_OFFSET), 4), "big")
    for name in (CHECKPOINT_FILE, CHECKPOINT_FILE + BACKUP_SUFFIX):
        (tmp_path / name).unlink(missing_ok=True)
    shutil.rmtree(commitlog_dir(tmp_path))
    refused = open_refused(tmp_path)
    assert refused.durable_pos == result.commit_pos + size
    assert "consume queues" in refused.reason


def test_missing_last_segment_below_the_line_is_refused(tmp_path):
    results = crashed_store(tmp_path, 60, checkpoint_after=50)
    last_base = results[49].commit_pos - results[49].commit_pos % SEGMENT_BYTES
    assert last_base > 0
    segment = commitlog_dir(tmp_path) / offset_to_name(last_base)
    later = sorted(p for p in commitlog_dir(tmp_path).iterdir() if p.name >= segment.name)
    for path in later:
        path.unlink()
    refused = open_refused(tmp_path)
    assert (refused.path, refused.commit_pos) == (str(segment), last_base)


def test_zeroed_segment_below_the_line_is_refused(tmp_path):
    """Recovery's own scan starts at the line here (nothing lags); the last record a consume
    queue points at below the line is checked too, and it is zeros."""
    results = crashed_store(tmp_path, 60, checkpoint_after=50)
    pos = results[49].commit_pos
    path, file_pos = segment_of(tmp_path, pos)
    patch(path, 0, bytes(path.stat().st_size))
    for later in (p for p in commitlog_dir(tmp_path).iterdir() if p.name > path.name):
        patch(later, 0, bytes(later.stat().st_size))
    refused = open_refused(tmp_path)
    assert (refused.path, refused.commit_pos) == (str(path), pos - file_pos)
    assert "zeros" in refused.reason


def test_refusal_is_a_store_corrupt_error_with_its_fields(tmp_path):
    exc = StoreCorruptError("no valid record (bad CRC)", commit_pos=7, durable_pos=9, path="seg",
                            records_after=3)
    text = str(exc)
    assert "commit_pos 7" in text and "durable position 9" in text and "3 valid record(s)" in text
    assert "[seg]" in text and "nothing was changed" in text


def test_short_segment_is_refused_and_rebuild_pads_it_then_cuts(tmp_path):
    """A segment that lost its end (no crash makes one: segments are sized under a temporary
    name): refused naming it and where its bytes stop; the rebuild reads the lost bytes as
    zeros, cuts at the first record they break and quarantines every later segment's bytes."""
    results = crashed_store(tmp_path, 60, checkpoint_after=50)
    victim = next(r for r in results[5:] if r.commit_pos % SEGMENT_BYTES > SEGMENT_BYTES // 2)
    path, file_pos = segment_of(tmp_path, victim.commit_pos)
    assert path.name < max(p.name for p in commitlog_dir(tmp_path).iterdir())  # not the last one
    original = log_bytes(tmp_path)
    with open(path, "r+b") as fh:
        fh.truncate(file_pos + 10)  # 10 bytes of the victim record are left
    refused = open_refused(tmp_path)
    assert (refused.path, refused.commit_pos, refused.durable_pos) == \
        (str(path), victim.commit_pos + 10, None)
    with rebuild(tmp_path) as store:
        assert store.recovery_report.cut_pos == victim.commit_pos
        kept = [r for r in results if r.commit_pos < victim.commit_pos]
        assert sum(store.max_offset(TOPIC, q) for q in (0, 1)) == len(kept)
    assert path.stat().st_size == SEGMENT_BYTES
    assert log_bytes(tmp_path)[:victim.commit_pos] == original[:victim.commit_pos]
    next_base = victim.commit_pos - file_pos + SEGMENT_BYTES
    pos = victim.commit_pos  # the 10 bytes left, zeros for the lost ones, the later segments
    assert quarantined(tmp_path) == [original[pos:pos + 10] + bytes(next_base - pos - 10)
                                     + original[next_base:].rstrip(b"\0")]
    assert check(tmp_path) == []
