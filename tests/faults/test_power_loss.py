"""Power loss: what the page cache had not written back is gone (SIGKILL alone keeps it).

Two tiers. Torture runs (real processes): the whole store is frozen with SIGSTOP, its durable
positions read from the control block, everything is SIGKILLed, and tools.torture.faults
drops or reverts random pages past each structure's durable position (commitlog, consume
queues, index, checkpoint) before the restart; every other power loss also flips a byte below
the durable line, which the start must refuse and the operator's rebuild cut and quarantine.
In-process scenarios (MessageStore, async flush without timers, so exactly which bytes are
durable is decided by the test) check the cut point and the quarantine byte for byte, and each
way the atomic checkpoint replace can end.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from engine.check.fsck import check
from engine.config import FlushPolicy, StoreConfig
from engine.files.naming import INDEX_DIR
from engine.formats.cq_entry import CQ_DTYPE, CQ_ENTRY_SIZE
from engine.formats.index_file import INDEX_ENTRY, decode_index_header, entry_pos
from engine.store import MessageStore, close_parts
from tests.faults.fault_harness import SMALL_CONFIG, assert_passed, fill_store, run_torture, scaled
from tools.torture.faults import (
    SECTOR_BYTES,
    CheckpointFate,
    DurablePositions,
    record_spans,
    simulate_power_loss,
)
from tools.torture.verify import PowerLoss, VerifyState, verify_store

ASYNC_NO_TIMERS = StoreConfig(**SMALL_CONFIG, flush=FlushPolicy.ASYNC, async_flush_interval_ms=10**9,
                              async_flush_thorough_interval_ms=10**9)
SYNC = StoreConfig(**SMALL_CONFIG)


# ------------------------------------------------------------------------------ torture runs
@pytest.mark.slow
def test_power_loss_rounds_sync_flush_lose_nothing(tmp_path):
    figures = run_torture(tmp_path, target="supervisor", fault="power-loss", rounds=scaled(1),
                          kills_per_round=2, acks_before_kill=(10, 150))
    assert_passed(figures)
    assert figures.lost_unflushed == 0 and figures.kills["supervisor"] == scaled(1) * 2
    assert figures.rebuilds >= 1  # damage below the durable line: refused, then rebuilt


@pytest.mark.slow
def test_power_loss_rounds_async_flush_lose_only_unflushed(tmp_path):
    figures = run_torture(tmp_path, target="supervisor", fault="power-loss", flush="async",
                          rounds=scaled(2), kills_per_round=1, acks_before_kill=(10, 150))
    assert_passed(figures)  # lost == 0: every loss lies past the flushed position of its loss
    assert figures.rebuilds >= 1  # damage below the durable line: refused, then rebuilt
    print(f"async power loss lost {figures.lost_unflushed} unflushed acknowledged messages")


# ------------------------------------------------------------------------------ in process
def die(store: MessageStore) -> None:
    """Process death: no flush, no checkpoint, `abort` stays (as tests/helpers.die)."""
    store._lock.release()
    close_parts(store._parts)
    store._closed = True


def crash_with_unflushed_tail(root, rng, *, durable_count=30, volatile_count=40):
    """Messages made durable (flush + checkpoint), then more that only reached the page cache
    (commitlog, consume queues and index); the store then dies. Returns (durable entries,
    volatile entries, durable positions)."""
    store = MessageStore.open(root, ASYNC_NO_TIMERS)
    durable_entries = fill_store(store, rng, durable_count)
    store.commitlog.flush()
    cp = store.checkpoint()
    volatile = fill_store(store, rng, volatile_count, first=durable_count, max_body_bytes=900)
    flushed = store.commitlog.flushed_pos
    die(store)
    return durable_entries, volatile, DurablePositions(flushed, cp.cq_durable_pos, cp.index_durable_pos)


def log_bytes(root) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((root / "commitlog").iterdir()))


def expected_cut(before: bytes, after: bytes, spans) -> int:
    """Start of the first record (or end-of-segment filler) not intact after the loss."""
    items, end = [], 0
    for _path, _file_pos, size, commit_pos in spans:
        if commit_pos != end:
            items.append((end, commit_pos))  # a filler before a segment roll
        items.append((commit_pos, commit_pos + size))
        end = commit_pos + size
    for start, stop in items:
        if before[start:stop] != after[start:stop]:
            return start
    return end


def recover_and_judge(root, durable_entries, volatile, durable, before, spans):
    after = log_bytes(root)
    cut = expected_cut(before, after, spans)
    with MessageStore.open(root, SYNC) as store:
        report = store.recovery_report
        more = fill_store(store, random.Random(7), 3, first=10_000)  # writes work again
    assert report.cut_pos == cut >= durable.commitlog_flushed_pos, (report.cut_pos, cut)
    tail = np.frombuffer(after[cut:], dtype=np.uint8)
    nonzero = np.flatnonzero(tail)
    if nonzero.size:  # the torn tail is kept, byte for byte
        with open(report.quarantine_path, "rb") as fh:
            assert fh.read() == after[cut:cut + int(nonzero[-1]) + 1]
    state = VerifyState(power_losses=[PowerLoss(2**62, durable.commitlog_flushed_pos)])
    result = verify_store(root, durable_entries + volatile + more, state)
    assert not result.problems, result.problems
    survivors = {e.identity for e in volatile if e.end_pos <= cut}
    assert not survivors & set(result.lost_unflushed)  # whole records before the cut stay
    assert {e.identity for e in volatile if e.end_pos > cut} == set(result.lost_unflushed)
    assert check(root) == []
    return report


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_power_loss_cut_is_at_the_last_whole_record_and_the_tail_is_quarantined(tmp_path, seed):
    rng = random.Random(seed)
    root = tmp_path / "store"
    durable_entries, volatile, durable = crash_with_unflushed_tail(root, rng)
    before, spans = log_bytes(root), record_spans(root, SYNC)
    loss = simulate_power_loss(root, durable, SYNC, rng)
    print(loss.summary())
    recover_and_judge(root, durable_entries, volatile, durable, before, spans)


@pytest.mark.parametrize("fate", list(CheckpointFate), ids=lambda f: f.name)
def test_power_loss_checkpoint_new_old_or_torn_temp(tmp_path, fate):
    rng = random.Random(100 + list(CheckpointFate).index(fate))
    root = tmp_path / "store"
    durable_entries, volatile, durable = crash_with_unflushed_tail(root, rng)
    before, spans = log_bytes(root), record_spans(root, SYNC)
    loss = simulate_power_loss(root, durable, SYNC, rng, checkpoint_fate=fate)
    assert loss.checkpoint == fate.value
    report = recover_and_judge(root, durable_entries, volatile, durable, before, spans)
    assert report.checkpoint_source == "checkpoint"  # old or new: both are whole files
    assert not (root / "checkpoint.tmp").exists() or check(root) == []


def _tear_sectors_across_an_index_entry(root, durable: DurablePositions) -> bool:
    """Revert the sectors from the first non-durable index entry up to a sector boundary that
    falls inside a later entry's time field (a disk that wrote the later sector of the page and
    not the earlier ones): that entry keeps only its tail (time, prev). True if done."""
    for shard, durable_pos in enumerate(durable.shard_durable_pos):
        for path in sorted((root / INDEX_DIR / str(shard)).iterdir())[-1:]:  # others: synced
            data = bytearray(path.read_bytes())
            count = decode_index_header(data).index_count
            positions = [entry_pos(SYNC.index_slot_count, n) for n in range(count)]
            late = [n for n in range(1, count)
                    if INDEX_ENTRY.unpack_from(data, positions[n])[1] >= durable_pos]
            for n in late[1:]:
                boundary = (positions[n] // SECTOR_BYTES + 1) * SECTOR_BYTES
                if 12 <= boundary - positions[n] <= 16 and any(data[boundary:positions[n] + 20]):
                    data[positions[late[0]]:boundary] = bytes(boundary - positions[late[0]])
                    path.write_bytes(bytes(data))
                    return True
    return False


def test_power_loss_that_tears_index_sectors_is_trimmed(tmp_path):
    rng = random.Random(5)
    root = tmp_path / "store"
    _, _, durable = crash_with_unflushed_tail(root, rng, volatile_count=120)
    assert _tear_sectors_across_an_index_entry(root, durable)
    with MessageStore.open(root, SYNC):
        pass
    assert check(root) == []


def test_power_loss_that_tears_a_consume_queue_entry_is_repaired(tmp_path):
    rng = random.Random(8)
    root = tmp_path / "store"
    _, _, durable = crash_with_unflushed_tail(root, rng, volatile_count=300)
    # entry 25 of a file spans bytes 500..520: commit_pos and size in sector 0, tags_code in
    # sector 1 (CQ_ENTRY_SIZE x 25 + 12 == SECTOR_BYTES); sector 1 was never written back
    torn = 0
    for path in sorted((root / "consumequeue").glob("*/*/*")):
        entries = np.frombuffer(path.read_bytes(), dtype=CQ_DTYPE)
        first = (SECTOR_BYTES - 12) // CQ_ENTRY_SIZE
        if len(entries) > first + 1 and entries["tags_code"][first] != 0 \
                and entries["commit_pos"][first] >= durable.cq_durable_pos:
            data = bytearray(path.read_bytes())
            data[SECTOR_BYTES:2 * SECTOR_BYTES] = bytes(SECTOR_BYTES)
            path.write_bytes(bytes(data))
            torn += 1
    assert torn
    with MessageStore.open(root, SYNC):
        pass
    assert check(root) == []


def test_power_loss_while_an_index_file_is_being_created_keeps_it_blank(tmp_path):
    """A crash inside IndexFile.create can leave the shard's newest file shorter than its header:
    the power-loss model keeps it as it is (nothing older to go back to), and the restart
    quarantines and rebuilds that shard."""
    rng = random.Random(3)
    root = tmp_path / "store"
    _, _, durable = crash_with_unflushed_tail(root, rng, volatile_count=50)
    shard_dir = root / INDEX_DIR / "0"
    blank = shard_dir / "99999999999999999"  # sorts after every real file name: the shard's newest
    blank.write_bytes(b"")
    simulate_power_loss(root, durable, SYNC, rng)
    assert blank.read_bytes() == b""
    with MessageStore.open(root, SYNC):
        pass
    assert check(root) == []
