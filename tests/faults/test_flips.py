"""Torn and flipped bytes, one at a time: records, consume-queue entries, index entries, checkpoint.

Every flip in a record is detected (check reports the record); a flipped record the checkpoint
calls durable makes a routine open refuse (StoreCorruptError, nothing changed), and a rebuild
(`mqstore recover --rebuild`) cuts it, everything from it kept in quarantine byte for byte; a
bad consume-queue or index entry (its time included) is found by check and rebuilt from the
commitlog (RecoveryMode.REBUILD); a bad checkpoint
falls back to its backup, or to a full scan when both are bad. Positions come from the files'
structure (tools.torture.faults), masks from a seeded rng; `MQSTORE_TORTURE_SCALE` > 1 sweeps
more records and entries.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.check.findings import FindingKind
from engine.check.fsck import check
from engine.config import StoreConfig
from engine.files.naming import BACKUP_SUFFIX, commitlog_dir
from engine.formats.checkpoint import CRC_SIZE, SHARD_POS_SIZE, SHARDS_POS
from engine.formats.cq_entry import CQ_ENTRY_SIZE
from engine.formats.index_file import INDEX_ENTRY
from engine.formats.record import Verify, decode_record
from engine.recovery.checkpoint import CheckpointSource, checkpoint_path, load_checkpoint
from engine.recovery.recover import RecoveryMode
from engine.store import MessageStore
from tests.faults.fault_harness import SCALE, SMALL_CONFIG, fill_store, verify_ledger
from tests.helpers import open_refused
from tools.torture.faults import flip_byte, index_entry_spans, queue_entry_spans, record_spans

CONFIG = StoreConfig(**SMALL_CONFIG)
REPO_ROOT = Path(__file__).resolve().parents[2]
SEED = 1234
MASKS = (0x01, 0x10, 0x80, 0xFF)
RECORD_KINDS = {FindingKind.CORRUPT_RECORD, FindingKind.TORN_TAIL}
CQ_KINDS = {FindingKind.CQ_ENTRY_MISMATCH, FindingKind.CQ_MISSING_ENTRY, FindingKind.CQ_PAST_END,
            FindingKind.CQ_GAP, FindingKind.CQ_DUPLICATE}
INDEX_KINDS = {FindingKind.INDEX_FILE_CORRUPT, FindingKind.INDEX_ENTRY_UNRESOLVED,
               FindingKind.INDEX_ENTRY_TIME, FindingKind.INDEX_KEY_MISSING}
# index entry: key_hash 4 | commit_pos 8 | time_diff_s 4 | prev_index 4 (formats.index_file)
TIME_DIFF_BYTES = range(INDEX_ENTRY.size - 4 - 4, INDEX_ENTRY.size - 4)


@pytest.fixture
def store(tmp_path):
    """A cleanly stopped store of 40 messages, and their ledger entries."""
    rng = random.Random(SEED)
    root = tmp_path / "store"
    with MessageStore.open(root, CONFIG) as st:
        entries = fill_store(st, rng, 40)
    verify_ledger(root, entries)
    return root, entries, rng


def rebuild(root) -> None:
    with MessageStore.open(root, CONFIG, recovery=RecoveryMode.REBUILD):
        pass


def kinds_after_flip(path, file_pos: int, mask: int) -> set:
    flip_byte(path, file_pos, mask)
    try:
        return {f.kind for f in check(_root_of(path))}
    finally:
        flip_byte(path, file_pos, mask)


def _root_of(path):
    for parent in path.parents:
        if (parent / "store.json").exists():
            return parent
    raise AssertionError(f"{path} is not inside a store")


def test_every_flip_in_the_last_records_is_detected(store):
    root, _entries, rng = store
    spans = record_spans(root, CONFIG)
    for n, (path, file_pos, size, commit_pos) in enumerate(reversed(spans[-2 * SCALE:])):
        for i in range(0, size, 1 if n == 0 or SCALE > 1 else 3):  # the last one: every byte
            mask = rng.choice(MASKS)
            flip_byte(path, file_pos + i, mask)
            findings = check(root)
            flip_byte(path, file_pos + i, mask)
            assert any(f.pos == commit_pos and f.kind in RECORD_KINDS for f in findings), \
                (commit_pos, i, hex(mask), [str(f) for f in findings])
    assert check(root) == []


def test_flipped_last_record_is_refused_then_cut_at_its_start_and_quarantined(store):
    """The clean stop's checkpoint calls the last record durable: a routine open refuses and
    names it, changing nothing; the operator's rebuild cuts it and keeps it in quarantine/."""
    root, entries, rng = store
    path, file_pos, size, commit_pos = record_spans(root, CONFIG)[-1]
    flip_byte(path, file_pos + rng.randrange(size))
    flipped = path.read_bytes()[file_pos:file_pos + size]
    refused = open_refused(root, CONFIG)
    assert (refused.commit_pos, refused.path, refused.records_after) == (commit_pos, str(path), 0)
    with MessageStore.open(root, CONFIG, recovery=RecoveryMode.REBUILD) as st:
        report = st.recovery_report
        assert report.cut_pos == commit_pos and report.cut_reason
        assert report.quarantine_path and report.quarantined_bytes == size
        assert report.quarantined_records == 0  # nothing valid came after it
        with open(report.quarantine_path, "rb") as fh:
            assert fh.read() == flipped  # the damaged record is kept, not thrown away
        more = fill_store(st, rng, 3, first=1000)  # the store accepts writes again
    assert entries[-1].commit_pos == commit_pos
    verify_ledger(root, entries[:-1] + more)


def test_rebuild_after_a_flip_in_a_middle_record_cuts_there_and_quarantines_the_rest_intact(store):
    """Bit rot inside the durable region: check names the record; a rebuild cuts the log at it
    (DESIGN §5.6: the records after it cannot move, their msgIds are their commit positions and
    a queue may not have a hole) and keeps every byte from the cut, valid records included, in
    quarantine/, and the report counts them."""
    root, entries, rng = store
    spans = record_spans(root, CONFIG)
    middle = len(spans) // 2
    path, file_pos, size, commit_pos = spans[middle]
    assert entries[middle].commit_pos == commit_pos
    flip_byte(path, file_pos + size // 2)
    checked = _cli("check", "--store", str(root), "--json")
    assert checked.returncode == 1, (checked.stdout, checked.stderr)
    findings = json.loads(checked.stdout)["findings"]
    assert {"kind": FindingKind.CORRUPT_RECORD.value, "pos": commit_pos} in [
        {"kind": f["kind"], "pos": f["pos"]} for f in findings], findings
    tail = _log_bytes(root)[commit_pos:].rstrip(b"\0")
    with MessageStore.open(root, CONFIG, recovery=RecoveryMode.REBUILD) as st:
        report = st.recovery_report
        assert (report.cut_pos, report.quarantined_bytes) == (commit_pos, len(tail))
        assert report.cut_reason and report.quarantined_records == len(spans) - middle - 1
        assert f"holding {report.quarantined_records} valid record(s)" in "\n".join(report.summary_lines())
        with open(report.quarantine_path, "rb") as fh:
            kept = fh.read()
        more = fill_store(st, rng, 3, first=1000)  # the store accepts writes again
    assert kept == tail  # byte for byte, the damaged record and everything after it
    for _path, _file_pos, record_size, pos in spans[middle + 1:]:  # each one readable by hand
        record = decode_record(kept, pos - commit_pos, verify=Verify.MQSTORE, base_pos=commit_pos)
        assert (record.commit_pos, record.total_size) == (pos, record_size)
    assert more[0].commit_pos == commit_pos  # the log goes on from the cut
    verify_ledger(root, entries[:middle] + more)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.cli", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)


def _log_bytes(root) -> bytes:
    """The whole commitlog from position 0, segment after segment."""
    return b"".join(p.read_bytes() for p in sorted(commitlog_dir(root).iterdir()))


def _flip_find_rebuild(root, entries, spans, rng, kinds: set, entry_bytes: int) -> None:
    """Flip each byte of each span (one at a time): check must report one of `kinds`; the first
    span is also rebuilt after each flip (the others are only checked, to bound the time)."""
    for n, (path, file_pos) in enumerate(spans):
        for i in range(entry_bytes):
            mask = rng.choice(MASKS)
            flip_byte(path, file_pos + i, mask)
            found = {f.kind for f in check(root)}
            assert found & kinds, (path.name, file_pos, i, hex(mask), found)
            if n == 0:
                rebuild(root)
                assert check(root) == [], (path.name, file_pos, i)
            else:
                flip_byte(path, file_pos + i, mask)
    verify_ledger(root, entries)


def test_every_flipped_consume_queue_byte_is_found_and_rebuilt(store):
    root, entries, rng = store
    spans = queue_entry_spans(root)
    chosen = [spans[-1], spans[0], *rng.sample(spans[1:-1], 2 * SCALE - 2)]
    _flip_find_rebuild(root, entries, chosen, rng, CQ_KINDS, CQ_ENTRY_SIZE)


@pytest.mark.parametrize("field_byte", [0, 8], ids=["commit_pos", "size"])
def test_an_entry_a_flip_makes_invalid_is_put_back_by_a_routine_open(store, field_byte):
    """A flipped sign bit makes an entry invalid, with valid entries behind it: recovery ends the
    queue there, and re-dispatch puts it and those behind it back from their records (neither
    lost nor their queue offsets given out again)."""
    root, entries, rng = store
    spans = queue_entry_spans(root)
    for path, file_pos in [spans[0], *rng.sample(spans[1:], 2 * SCALE)]:
        flip_byte(path, file_pos + field_byte, 0x80)
        topic, queue_id = path.parent.parent.name, int(path.parent.name)
        with MessageStore.open(root, CONFIG) as st:
            assert st.recovery_report.queues_cut == [f"{topic}/{queue_id}"]
            next_offset = max(e.queue_offset for e in entries
                              if (e.topic, e.queue_id) == (topic, queue_id)) + 1
            assert st.max_offset(topic, queue_id) == next_offset
        verify_ledger(root, entries)


def test_every_flipped_index_byte_is_found_and_rebuilt(store):
    root, entries, rng = store
    spans = index_entry_spans(root, CONFIG)
    chosen = [spans[-1], spans[0], *rng.sample(spans[1:-1], 2 * SCALE - 2)]
    _flip_find_rebuild(root, entries, chosen, rng, INDEX_KINDS, INDEX_ENTRY.size)


def test_flipped_index_time_is_found(store):
    root, _entries, _rng = store
    path, file_pos = index_entry_spans(root, CONFIG)[-1]
    for i in TIME_DIFF_BYTES:
        assert FindingKind.INDEX_ENTRY_TIME in kinds_after_flip(path, file_pos + i, 0x01), i


def test_every_flipped_checkpoint_byte_is_detected_and_recovery_falls_back(store):
    root, entries, rng = store
    path = checkpoint_path(root)
    used = SHARDS_POS + CONFIG.index_shards * SHARD_POS_SIZE + CRC_SIZE
    for i in range(used):  # every byte under the CRC, and the CRC
        mask = rng.choice(MASKS)
        flip_byte(path, i, mask)
        try:
            assert FindingKind.CHECKPOINT_UNREADABLE in {f.kind for f in check(root)}, i
            assert load_checkpoint(root).source is CheckpointSource.BACKUP, i
        finally:
            flip_byte(path, i, mask)
    for i in sorted(rng.sample(range(used), 6 * SCALE)):  # recovery falls back to the backup
        flip_byte(path, i, rng.choice(MASKS))
        with MessageStore.open(root, CONFIG) as st:
            assert st.recovery_report.checkpoint_source == CheckpointSource.BACKUP.value, i
            assert st.recovery_report.checkpoint_problems, i
        assert check(root) == [], i
    verify_ledger(root, entries)


def test_checkpoint_and_backup_both_bad_fall_back_to_a_full_scan(store):
    root, entries, rng = store
    path = checkpoint_path(root)
    backup = path.with_name(path.name + BACKUP_SUFFIX)
    flip_byte(path, rng.randrange(SHARDS_POS))
    shutil.copyfile(path, backup)
    with MessageStore.open(root, CONFIG) as st:
        report = st.recovery_report
        assert report.checkpoint_source == CheckpointSource.NONE.value
        assert report.scan_start_pos == 0 and len(report.checkpoint_problems) == 2
    verify_ledger(root, entries)


def test_flips_in_the_checkpoint_padding_change_nothing(store):
    root, _entries, rng = store
    path = checkpoint_path(root)
    before = load_checkpoint(root).checkpoint
    used = SHARDS_POS + CONFIG.index_shards * SHARD_POS_SIZE + CRC_SIZE
    for i in rng.sample(range(used, path.stat().st_size), 16):
        flip_byte(path, i)
    assert load_checkpoint(root).checkpoint == before  # the padding is outside the CRC
    with MessageStore.open(root, CONFIG):
        pass
    assert check(root) == []
