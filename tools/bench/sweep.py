"""Scaling sweeps (bar 6): one `mqstore bench --start` per value of producers or body size, each
repeated --runs times, then the median table and the scaling plot (tools.bench.plot.render_scaling).

    python -m tools.bench.sweep --axis producers --values 1,2,4,8,16 --runs 3 --out sweep-p --peer redis
    python -m tools.bench.sweep --axis size --values 64,256,1024,4096,16384,65536 --out sweep-s

Every other flag is the bench's (defaults: no consumers, --keys, --batch 64, --flush sync,
--index-shards 2, 8 s after a 2 s warm-up; 4 producers on the size axis, 256 B on the producers
axis); add more after `--`. Runs go round by round (every value once, then again), so a machine
that gets busier mid-sweep weighs on every value alike. Each run's document is kept as
OUT/<axis>-<value>-<run>.json; one already there (a sweep that was stopped) is reused, not
re-run. Then OUT/<axis>.md (the table), OUT/<axis>.json (the medians) and OUT/<axis>.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tools.bench import report
from tools.bench.harness import REPO_ROOT, child_env

AXES = {"producers": "--producers", "size": "--size"}
BASE_ARGS = ("--start", "--consumers", "0", "--keys", "--batch", "64", "--flush", "sync",
             "--index-shards", "2", "--seconds", "8", "--warmup", "2")
FIXED = {"producers": ("--size", "256"), "size": ("--producers", "4")}
X_LABELS = {"producers": "producers", "size": "body bytes"}
RUN_TIMEOUT_S = 900.0


class SweepError(Exception):
    """A sweep that cannot run or did not finish (the message says which and why)."""


def parse_values(text: str) -> list[int]:
    """"1,2,4" -> [1, 2, 4]: positive integers, each once."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise SweepError(f"--values: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1 or len(set(values)) != len(values):
        raise SweepError(f"--values: expected distinct positive integers, got {text!r}")
    return values


def bench_args(axis: str, value: int, extra: list[str], json_path: Path) -> list[str]:
    """The bench's arguments for one run (the later of a repeated flag wins, as argparse does)."""
    return [*BASE_ARGS, *FIXED[axis], *extra, AXES[axis], str(value), "--json", str(json_path)]


def run_sweep(axis: str, values: list[int], runs: int, out: Path, extra: list[str],
              echo=print) -> dict[int, list[dict]]:
    """Every run's document by value, running those not already in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    docs: dict[int, list[dict]] = {value: [] for value in values}
    total, done = runs * len(values), 0
    for run in range(1, runs + 1):
        for value in values:
            done += 1
            path = out / f"{axis}-{value}-{run}.json"
            kept = _kept_document(path)
            if kept is None:
                began = time.monotonic()
                _run_one(bench_args(axis, value, extra, path), path.with_suffix(".log"))
                kept = _kept_document(path)
                if kept is None:
                    raise SweepError(f"{path.name}: the bench wrote no valid document "
                                     f"(see {path.with_suffix('.log')})")
                how = f"{time.monotonic() - began:.0f} s"
            else:
                how = "kept from an earlier sweep"
            docs[value].append(kept)
            echo(f"[{done}/{total}] {axis} {value} run {run}: " + ", ".join(
                f"{name} {doc_run['summary']['pub_msgs_per_s']:.0f} msg/s"
                for name, doc_run in kept["runs"].items()) + f" ({how})")
    return docs


def _kept_document(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if not report.check_document(doc) else None


def _run_one(args: list[str], log_path: Path) -> None:
    with log_path.open("w") as log:
        result = subprocess.run([sys.executable, "-m", "tools.bench", *args], cwd=REPO_ROOT,
                                env=child_env(), stdout=log, stderr=subprocess.STDOUT,
                                timeout=RUN_TIMEOUT_S, check=False)
    if result.returncode != 0:
        tail = log_path.read_text().strip().splitlines()[-3:]
        raise SweepError(f"bench {' '.join(args)} exited with {result.returncode}: " + " / ".join(tail))


def medians(docs: dict[int, list[dict]]) -> list[dict]:
    """Per value: median publish rate and p99 per backend over its runs, and the mqstore/peer ratio."""
    rows = []
    for value, runs in docs.items():
        row: dict = {"value": value, "runs": len(runs)}
        for name in sorted({name for doc in runs for name in doc["runs"]}):
            summaries = [doc["runs"][name]["summary"] for doc in runs if name in doc["runs"]]
            row[name] = {"msgs_per_s": statistics.median(s["pub_msgs_per_s"] for s in summaries),
                         "p99_ms": statistics.median(s["pub_latency"]["p99_ms"] for s in summaries),
                         "runs_msgs_per_s": [s["pub_msgs_per_s"] for s in summaries]}
        peer = next((name for name in row if name not in ("value", "runs", "mqstore")), None)
        if peer and "mqstore" in row and row[peer]["msgs_per_s"]:
            row["ratio"] = round(row["mqstore"]["msgs_per_s"] / row[peer]["msgs_per_s"], 2)
        rows.append(row)
    return rows


def table(axis: str, rows: list[dict]) -> str:
    """The medians as a Markdown table, one column per value."""
    names = sorted({name for row in rows for name in row if isinstance(row[name], dict)},
                   key=lambda name: name != "mqstore")
    lines = [f"| {X_LABELS[axis]} | " + " | ".join(str(row["value"]) for row in rows) + " |",
             "|---|" + "---|" * len(rows)]
    for name in names:
        lines.append(f"| {name} msg/s | " + " | ".join(
            f"{row[name]['msgs_per_s']:,.0f}" if name in row else "-" for row in rows) + " |")
        lines.append(f"| {name} publish p99 ms | " + " | ".join(
            f"{row[name]['p99_ms']:.1f}" if name in row else "-" for row in rows) + " |")
    if any("ratio" in row for row in rows):
        lines.append("| ratio | " + " | ".join(f"{row['ratio']:.2f}" if "ratio" in row else "-"
                                                 for row in rows) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(prog="python -m tools.bench.sweep", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--axis", choices=sorted(AXES), required=True, help="what varies")
    parser.add_argument("--values", required=True, help="comma-separated values of the axis")
    parser.add_argument("--runs", type=int, default=3, help="runs per value (default 3)")
    parser.add_argument("--out", type=Path, required=True, help="directory for documents, table, plot")
    parser.add_argument("--peer", choices=("redis",), help="run Redis Streams beside each run")
    parser.add_argument("--seconds", help="measured seconds per run (default 8)")
    parser.add_argument("--warmup", help="warm-up seconds per run (default 2)")
    args = parser.parse_args(argv)
    for flag in ("peer", "seconds", "warmup"):
        if getattr(args, flag) is not None:
            extra = [f"--{flag}", str(getattr(args, flag)), *extra]
    return args, extra


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        values = parse_values(args.values)
        if args.runs < 1:
            raise SweepError(f"--runs: expected at least 1, got {args.runs}")
        if args.out.exists() and not args.out.is_dir():
            raise SweepError(f"--out: {args.out} exists and is not a directory")
        docs = run_sweep(args.axis, values, args.runs, args.out, extra)
    except SweepError as exc:
        print(f"bench sweep: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"bench sweep: stopped; the runs done so far are kept in {args.out}", file=sys.stderr)
        return 130
    rows = medians(docs)
    text = table(args.axis, rows)
    (args.out / f"{args.axis}.md").write_text(text)
    summary = {"axis": args.axis, "runs": args.runs, "extra_args": extra, "rows": rows}
    (args.out / f"{args.axis}.json").write_text(json.dumps(summary, indent=1) + "\n")
    from tools.bench import plot

    plot.render_scaling(docs, str(args.out / f"{args.axis}.png"), x_label=X_LABELS[args.axis])
    print(text, end="")
    print(f"wrote {args.out / (args.axis + '.md')}, {args.axis}.json and {args.axis}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
