"""Damage below the durable line, in a power-loss round (DESIGN §4 "a store never shrinks by
surprise"): after the simulated power loss, flip one byte in the last record the checkpoint
calls flushed, then check what an operator would see and do:

1. `mqstore start` refuses: it exits non-zero naming the record's commit position and the
   rebuild command, and leaves the data files (commitlog, queues, index, checkpoint, abort,
   quarantine) byte-identical;
2. `mqstore recover --rebuild` cuts the log at that record: the log before it is unchanged and
   the quarantine file holds the log's bytes from it on, byte for byte (zeros past its end);
   or, when a valid record follows the damaged one, the caller may choose `mqstore recover
   --salvage`: it accepts a damaged span starting at that record and keeps every byte before
   its cut (the torn tail past the last valid record, if any) in place.

The acknowledged messages from the cut on (rebuild), or inside the accepted spans (salvage),
are then lost by the operator's choice: the caller records an OperatorCut or AcceptedDamage so
that verification counts them apart from real losses.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from engine.config import StoreConfig
from engine.files.naming import ABORT_FILE, CHECKPOINT_FILE, commitlog_dir, segment_files
from engine.recovery.accepted_damage import load_accepted
from engine.recovery.checkpoint import load_checkpoint
from tools.store_process import TIMEOUT_S, StoreProcess, wait_until
from tools.torture.faults import flip_byte, record_spans
from tools.torture.processes import TortureError
from workers.child_env import REPO_ROOT, child_env

DATA_DIRS = ("commitlog", "consumequeue", "index", "quarantine")


class Damage(NamedTuple):
    """The damaged record's commit position, and whether a valid record follows it (what a
    salvage needs: without one, the damage is a tail and there is nothing to salvage)."""

    commit_pos: int
    followed: bool


def damage_below_line(root: Path, config: StoreConfig, rng: random.Random) -> Damage | None:
    """Flip one byte (random place, random mask) in the last record ending at or before the
    checkpoint's flushed position; None when there is no such record. Recovery verifies that
    record whatever it scans: it is the last one below the line."""
    loaded = load_checkpoint(root).checkpoint
    if loaded is None:
        return None
    spans = record_spans(root, config)
    below = [s for s in spans if s[3] + s[2] <= loaded.commitlog_flushed_pos]
    if not below:
        return None
    path, file_pos, size, commit_pos = below[-1]
    flip_byte(path, file_pos + rng.randrange(size), rng.randrange(1, 256))
    return Damage(commit_pos, len(spans) > len(below))


def expect_refused_start(store: StoreProcess, commit_pos: int) -> None:
    """`mqstore start` must exit non-zero, name `commit_pos` and the rebuild, change no data."""
    before = data_files(store.root)
    store.start()
    wait_until(lambda: store.proc.poll() is not None, "the start on a damaged store to exit",
               TIMEOUT_S)
    text = store.log_text()
    if store.proc.returncode == 0 or f"commit_pos {commit_pos}" not in text \
            or "recover --rebuild" not in text:
        raise TortureError(f"start on damage at commit_pos {commit_pos}, below the durable line, "
                           f"exited {store.proc.returncode} without refusing it:\n{text[-3000:]}")
    after = data_files(store.root)
    if after != before:
        changed = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
        raise TortureError(f"the refused start changed the store's data files: {changed}")


def rebuild_and_compare(store: StoreProcess, commit_pos: int) -> tuple[int, int]:
    """`mqstore recover --rebuild`; check the cut (at the damage, or at the first span an earlier
    salvage accepted before it: a rebuild keeps no damage) and the quarantine against the log's
    bytes before it; return (cut_pos, quarantined byte count)."""
    cut_pos = min([commit_pos, *(span.start_pos for span in load_accepted(store.root))])
    base, damaged = log_bytes(store.root)
    report = run_recover(store, "rebuild")
    if (report["mode"], report["cut_pos"]) != ("rebuild", cut_pos):
        raise TortureError(f"the rebuild cut at {report['cut_pos']}, not at {cut_pos} (damage at "
                           f"{commit_pos})")
    cut = cut_pos - base
    kept = log_bytes(store.root)[1][:cut]
    quarantined = Path(report["quarantine_path"]).read_bytes() if report["quarantine_path"] else b""
    end = cut + len(quarantined)
    if kept != damaged[:cut] or quarantined != damaged[cut:end] or damaged[end:].strip(b"\0"):
        raise TortureError(f"the rebuild at {cut_pos} did not keep the log before it and "
                           "quarantine the rest byte for byte")
    return cut_pos, len(quarantined)


def salvage_and_compare(store: StoreProcess, commit_pos: int) -> tuple[int, list[tuple[int, int]]]:
    """`mqstore recover --salvage`; check that it accepted damage from `commit_pos` and kept
    the log before its cut in place; return (cut_pos, the accepted spans as (start, end))."""
    base, damaged = log_bytes(store.root)
    report = run_recover(store, "salvage")
    spans = [(d["start_pos"], d["end_pos"]) for d in report["damage_accepted"]]
    if report["mode"] != "salvage" or commit_pos not in [start for start, _ in spans]:
        raise TortureError(f"the salvage accepted {spans}, not the damage at {commit_pos}")
    cut = report["cut_pos"] - base
    if log_bytes(store.root)[1][:cut] != damaged[:cut]:
        raise TortureError(f"the salvage of the damage at {commit_pos} changed the log before "
                           f"its cut at {report['cut_pos']}")
    return report["cut_pos"], spans


def run_recover(store: StoreProcess, mode: str) -> dict:
    """Run `mqstore recover --<mode> --json` on the stopped store and return its parsed report;
    a non-zero exit is a torture failure."""
    done = subprocess.run([sys.executable, "-m", "tools.cli", "recover", "--store", str(store.root),
                           "--config", str(store.config_path), f"--{mode}", "--json"],
                          cwd=REPO_ROOT, env=child_env(store.env), capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    if done.returncode != 0:
        raise TortureError(f"mqstore recover --{mode} exited {done.returncode}: {done.stderr}")
    return json.loads(done.stdout)


def data_files(root: Path) -> dict[str, str]:
    """sha256 of every data file (not the lock, log or run files a start may write)."""
    out = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            rel = os.path.relpath(Path(dirpath) / name, root)
            if rel.split(os.sep)[0] in DATA_DIRS or rel.startswith(CHECKPOINT_FILE) or rel == ABORT_FILE:
                out[rel] = hashlib.sha256((Path(dirpath) / name).read_bytes()).hexdigest()
    return out


def log_bytes(root: Path) -> tuple[int, bytes]:
    """(first segment's base, the segments end to end): the log indexed by commit_pos - base."""
    directory = commitlog_dir(root)
    files = segment_files(directory)
    return (files[0].base_pos if files else 0, b"".join(file.path.read_bytes() for file in files))
