"""Shared helpers of the fault suite (`tests.faults.fault_harness`): torture runs in tmp dirs,
sized for `make test`, and in-process stores with their ledger.

`make test` runs a short version of every fault (a few rounds of a few kills each, see
docs/RELIABILITY.md for the figures); `MQSTORE_TORTURE_SCALE=N` multiplies the rounds (the
soak uses `python -m tools.torture soak` for the long version of the kill rounds).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tools.torture.figures import Figures
from tools.torture.rounds import TortureRun, TortureSettings

SCALE = max(1, int(os.environ.get("MQSTORE_TORTURE_SCALE", "1")))


def scaled(rounds: int) -> int:
    return rounds * SCALE


def run_torture(tmp_path: Path, **settings) -> Figures:
    """One torture run on a new store under tmp_path; prints its figures (pytest -s shows them)."""
    settings.setdefault("seed", int(os.environ.get("MQSTORE_TORTURE_SEED", "20240611")))
    run = TortureRun(TortureSettings(store_dir=tmp_path / "store",
                                     progress=lambda line: print(line, file=sys.stderr),
                                     **settings))
    figures = run.run()
    print("\n".join(figures.lines()), file=sys.stderr)
    return figures


def assert_passed(figures: Figures) -> None:
    assert figures.passed, "\n".join(figures.lines())
    assert figures.lost == 0 and figures.duplicated == 0 and figures.check_findings == 0


# ------------------------------------------------------------------------------ in-process stores
SMALL_CONFIG = dict(commitlog_file_size=64 * 1024, consume_queue_entries=64, index_slot_count=64,
                    index_entry_count=256, index_shards=2, queue_count=4,
                    cq_flush_interval_ms=10**9, max_body_bytes=8192)
TOPICS = ("FlipA", "FlipB")


def fill_store(store, rng, count: int, *, first: int = 0, max_body_bytes: int = 64) -> list:
    """Put `count` messages like the torture load does (identity property and keys, random tags,
    queues and bodies); return their ledger entries."""
    from engine.formats.record import Verify
    from tools.torture.ledger import IDENTITY_PROPERTY, STATUS_OK, LedgerEntry, body_digest

    entries = []
    for i in range(first, first + count):
        identity = f"m-{i}"
        topic, tags = rng.choice(TOPICS), rng.choice((None, "TagA", "TagB"))
        body, keys = rng.randbytes(rng.randint(1, max_body_bytes)), (identity, f"{identity}.k2")
        result = store.put(topic, body, tags=tags, keys=keys, queue_id=rng.randrange(4),
                           properties={IDENTITY_PROPERTY: identity})
        assert result.ok, result
        size = store.commitlog.read_at(result.commit_pos, verify=Verify.STRUCTURE).total_size
        entries.append(LedgerEntry(identity, topic, result.queue_id, result.queue_offset,
                                   result.commit_pos, size, body_digest(body), keys, tags,
                                   STATUS_OK, 0))
    return entries


def verify_ledger(root: Path, entries: list) -> None:
    """check(root) == [] and every entry present once, in place, intact, indexed."""
    from tools.torture.verify import VerifyState, verify_store

    report = verify_store(root, entries, VerifyState())
    assert not report.problems, report.problems
    assert report.acknowledged == len(entries)
