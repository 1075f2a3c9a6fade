"""Freezes of a running store's pipeline, seen from outside: samples the control block's flushed,
dispatched and index positions every --interval-ms for --seconds, and reports each span longer
than --min-ms in which a stage's position stood still while the stage before it was ahead
(flushed past dispatched, or written past it under async flush: the dispatcher owed work;
dispatched past a shard's processed position: that index builder did). The supervisor's own
freezes are spans in which flushed_pos stood still while written_pos was ahead.

    .venv/bin/python -m tools.bench.probes.stalls --store ./data --seconds 120 [--min-ms 30] [--json FILE]

Run it beside a load (`mqstore bench --store ./data ...`): it found the dispatcher frozen 46-110
ms at every consume-queue file, which led to reserve() dropping its read-ahead
(docs/DECISIONS.md#reserve-blocks-ahead). Reads only; costs the store nothing but one core's share.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from engine.config import FlushPolicy
from engine.errors import StoreError
from ipc.control_block import ControlBlock
from ipc.producer import attach_running_store


def freezes(times_s: np.ndarray, upstream: np.ndarray, own: np.ndarray, min_s: float
            ) -> list[tuple[float, float]]:
    """(start_s, length_s) of each span longer than `min_s` in which `own` did not move while
    `upstream` was ahead of it at the span's start (samples in time order)."""
    if len(times_s) < 2:
        return []
    moved = np.flatnonzero(np.diff(own) != 0) + 1  # the samples at which `own` changed
    edges = np.concatenate([[0], moved, [len(own) - 1]])
    starts, ends = edges[:-1], edges[1:]
    lengths = times_s[ends] - times_s[starts]
    owed = upstream[starts] > own[starts]
    keep = np.flatnonzero(owed & (lengths > min_s))
    return [(float(times_s[starts[k]] - times_s[0]), float(lengths[k])) for k in keep]


def sample(ctl: ControlBlock, seconds: float, interval_s: float) -> dict[str, np.ndarray]:
    """Every position, every `interval_s`, for `seconds` (each group read consistently)."""
    rows = []
    deadline = time.monotonic() + seconds
    while (now := time.monotonic()) < deadline:
        p = ctl.snapshot()
        rows.append((now, p.written_pos, p.flushed_pos, p.dispatched_pos, *p.shard_processed_pos))
        time.sleep(interval_s)
    table = np.array(rows, dtype=np.float64).reshape(len(rows), -1)
    columns = {"t": table[:, 0], "written": table[:, 1], "flushed": table[:, 2],
               "dispatched": table[:, 3]}
    # what the dispatcher may dispatch up to: flushed under sync flush, written under async
    columns["dispatchable"] = columns["flushed" if ctl.flush_policy is FlushPolicy.SYNC else "written"]
    for shard in range(table.shape[1] - 4):
        columns[f"index[{shard}]"] = table[:, 4 + shard]
    return columns


def report(columns: dict[str, np.ndarray], min_s: float) -> dict:
    """Each stage's freezes and samples taken, as a JSON-ready dict."""
    t = columns["t"]
    stages = {"supervisor": ("written", "flushed"), "dispatcher": ("dispatchable", "dispatched")}
    stages.update({name: ("dispatched", name) for name in columns if name.startswith("index[")})
    out = {"samples": len(t), "seconds": float(t[-1] - t[0]) if len(t) else 0.0,
           "min_ms": min_s * 1000, "stages": {}}
    for stage, (upstream, own) in stages.items():
        spans = freezes(t, columns[upstream], columns[own], min_s)
        out["stages"][stage] = {"freezes": len(spans),
                                "longest_ms": round(max((s for _, s in spans), default=0.0) * 1000, 1),
                                "spans": [{"at_s": round(a, 3), "ms": round(s * 1000, 1)} for a, s in spans]}
    return out


def attach(store: Path, wait_s: float) -> ControlBlock:
    """The running store's control block (ipc.producer.attach_running_store, with its errors),
    waiting up to `wait_s` for a store that is starting (the probe is usually started beside
    `mqstore bench --start`)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return attach_running_store(store)[0]
        except StoreError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.probes.stalls",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval-ms", type=float, default=0.5)
    parser.add_argument("--min-ms", type=float, default=30.0)
    parser.add_argument("--wait-s", type=float, default=10.0, help="for a store that is starting")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.interval_ms <= 0 or args.min_ms <= 0 or args.wait_s < 0:
        parser.error("--seconds, --interval-ms and --min-ms must be > 0, --wait-s >= 0")
    with attach(args.store, args.wait_s) as ctl:
        out = report(sample(ctl, args.seconds, args.interval_ms / 1000), args.min_ms / 1000)
    print(f"{out['samples']} samples over {out['seconds']:.1f} s; freezes over {args.min_ms:g} ms:")
    for stage, row in out["stages"].items():
        spans = ", ".join(f"{s['ms']:.0f} ms at {s['at_s']:.1f} s" for s in row["spans"][:12])
        print(f"  {stage:<12} {row['freezes']:>3} (longest {row['longest_ms']:.0f} ms) {spans}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    try:
        main()
    except StoreError as exc:
        sys.exit(f"stalls: {exc}")
