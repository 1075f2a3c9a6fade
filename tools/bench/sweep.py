"""Scaling sweeps (the scaling target of docs/BENCHMARKS.md): one `mqstore bench --start` per value
of producers or body size, each repeated --runs times, then the median table and the scaling plot
(tools.bench.plot.render_scaling).

    python -m tools.bench.sweep --axis producers --values 1,2,4,8,16 --out sweep-p --peer redis,sqlite
    python -m tools.bench.sweep --axis size --values 64,256,1024,4096,16384,65536 --out sweep-s

Each run is `mqstore bench --start --consumers 0 --keys --batch 64 --flush sync --index-shards 2`,
8 s after a 2 s warm-up (--seconds, --warmup), 4 producers on the size axis and 256 B on the
producers axis; bench flags after `--` are added (or override those), except the ones the sweep
sets itself (the axis, --seconds, --warmup, --peer, --json, --plot, --store, --start, --keep).
All arguments are checked with the bench's own parser before anything is written.

Runs go round by round (every value once, then again), so a machine that gets busier mid-sweep
weighs on every value alike. Each run's document is kept as OUT/<axis>-<value>-<run>.json, and
a sweep stopped half-way resumes: a document already there is reused if the same bench command
made it (a different one is an error, not a silent mix). Then OUT/<axis>.md (the table),
OUT/<axis>.json (the medians) and OUT/<axis>.png.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from engine.errors import StoreError
from tools.bench import report
from tools.bench.peers import parse_peers
from tools.bench.plot import backend_names
from workers.child_env import REPO_ROOT, child_env

PROG = "python -m tools.bench.sweep"
AXES = {"producers": "--producers", "size": "--size"}
BASE_ARGS = ("--start", "--consumers", "0", "--keys", "--batch", "64", "--flush", "sync",
             "--index-shards", "2")
FIXED = {"producers": ("--size", "256"), "size": ("--producers", "4")}
SWEEP_FLAGS = ("--seconds", "--warmup", "--peer", "--json", "--plot", "--store", "--start", "--keep")
X_LABELS = {"producers": "producers", "size": "body bytes"}
RUN_MARGIN_S = 180.0  # per backend: store start, drain, stop, a --disk probe
STOP_GRACE_S = 60.0  # what a stopped bench gets to stop its store before it is killed


class SweepError(Exception):
    """A sweep that cannot run or did not finish (the message says which and why)."""


def parse_values(text: str) -> list[int]:
    """"4,1,2" -> [1, 2, 4]: distinct positive integers, in order."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise SweepError(f"--values: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1 or len(set(values)) != len(values):
        raise SweepError(f"--values: expected distinct positive integers, got {text!r}")
    return sorted(values)


def bench_args(axis: str, value: int, common: list[str], json_path: Path) -> list[str]:
    """The bench's arguments for one run (of two equal flags argparse keeps the later)."""
    return [*BASE_ARGS, *FIXED[axis], *common, AXES[axis], str(value), "--json", str(json_path)]


def checked_timeout_s(axis: str, values: list[int], common: list[str], out: Path) -> float:
    """Parse every run's arguments as the bench will (SweepError with its reason if it would
    refuse one); the time one run may take."""
    from tools.bench.cli import bench_parser, plan_from_args

    parser = bench_parser(PROG + " -- (the bench's arguments)")
    for value in values:
        try:
            parsed = parser.parse_args(["bench", *bench_args(axis, value, common, out / "x.json")])
            plan_from_args(parsed)
        except SystemExit:
            raise SweepError("the bench refuses these arguments (its message is above)") from None
        except StoreError as exc:
            raise SweepError(f"the bench refuses {AXES[axis]} {value} with these arguments: {exc}") from None
    backends = 1 + len(parsed.peer or ())
    return backends * (parsed.warmup + parsed.seconds + RUN_MARGIN_S)


def run_sweep(axis: str, values: list[int], runs: int, out: Path, common: list[str],
              timeout_s: float, echo=print) -> dict[int, list[dict]]:
    """Every run's document by value, running those not already in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    docs: dict[int, list[dict]] = {value: [] for value in values}
    total, done = runs * len(values), 0
    for run in range(1, runs + 1):
        for value in values:
            done += 1
            path = out / f"{axis}-{value}-{run}.json"
            args = bench_args(axis, value, common, path)
            doc = _kept_document(path, args)
            how = "kept from an earlier sweep"
            if doc is None:
                began_s = time.monotonic()
                _run_one(args, path, timeout_s)
                doc = _kept_document(path, args)
                if doc is None:
                    raise SweepError(f"{path.name}: the bench wrote no valid document "
                                     f"(see {path.with_suffix('.log')})")
                how = f"{time.monotonic() - began_s:.0f} s"
            docs[value].append(doc)
            echo(f"[{done}/{total}] {axis} {value} run {run}: " + ", ".join(
                f"{name} {doc_run['summary']['pub_msgs_per_s']:.0f} msg/s"
                for name, doc_run in doc["runs"].items()) + f" ({how})")
    return docs


def _kept_document(path: Path, args: list[str]) -> dict | None:
    """The valid document at `path` that `args` made; None if there is none."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if report.check_document(doc):
        return None
    if doc["command"] != shlex.join(["mqstore", *args]):
        raise SweepError(f"{path} was made by another command ({doc['command']}): "
                         "give another --out, or remove it to run it again")
    return doc


def _run_one(args: list[str], json_path: Path, timeout_s: float) -> None:
    """One bench run, its output in <json>.log. Stopped (Ctrl-C, or past `timeout_s`), it gets
    STOP_GRACE_S to stop the store it started; a failed run's document is set aside as
    <json>.failed so that a resumed sweep runs it again."""
    log_path = json_path.with_suffix(".log")
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tools.bench", *args], cwd=REPO_ROOT,
                                env=child_env(), stdout=log, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
            raise SweepError(f"bench {' '.join(args)} did not finish in {timeout_s:.0f} s "
                             f"(stopped; see {log_path})") from None
        except KeyboardInterrupt:
            _wait_then_stop(proc)
            raise
    if code != 0:
        if json_path.exists():
            json_path.replace(json_path.with_name(json_path.name + ".failed"))
        tail = log_path.read_text().strip().splitlines()[-3:]
        raise SweepError(f"bench {' '.join(args)} exited with {code}: " + " / ".join(tail))


def _stop(proc: subprocess.Popen) -> None:
    """SIGINT (the bench stops its store and removes its temp directory), SIGKILL after STOP_GRACE_S."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_then_stop(proc: subprocess.Popen) -> None:
    """After Ctrl-C, which reached the bench too: STOP_GRACE_S for it to stop, then _stop."""
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        _stop(proc)


def medians(docs: dict[int, list[dict]]) -> list[dict]:
    """Per value: median publish rate and p99 per backend over its runs, and per peer the ratio
    of the medians, mqstore / peer (`ratios`)."""
    rows = []
    for value, runs in docs.items():
        row: dict = {"value": value, "runs": len(runs)}
        for name in sorted({name for doc in runs for name in doc["runs"]}):
            summaries = [doc["runs"][name]["summary"] for doc in runs if name in doc["runs"]]
            row[name] = {"msgs_per_s": statistics.median(s["pub_msgs_per_s"] for s in summaries),
                         "p99_ms": statistics.median(s["pub_latency"]["p99_ms"] for s in summaries),
                         "runs_msgs_per_s": [s["pub_msgs_per_s"] for s in summaries]}
        peers = [name for name in row if name not in ("value", "runs", "mqstore")]
        row["ratios"] = {peer: round(row["mqstore"]["msgs_per_s"] / row[peer]["msgs_per_s"], 2)
                         for peer in peers if "mqstore" in row and row[peer]["msgs_per_s"]}
        rows.append(row)
    return rows


def table(axis: str, rows: list[dict]) -> str:
    """The medians as a Markdown table, one column per value."""
    names = sorted(backend_names(rows), key=lambda name: name != "mqstore")
    lines = [f"| {X_LABELS[axis]} | " + " | ".join(str(row["value"]) for row in rows) + " |",
             "|---|" + "---|" * len(rows)]
    for name in names:
        lines.append(f"| {name} msg/s | " + " | ".join(
            f"{row[name]['msgs_per_s']:,.0f}" if name in row else "-" for row in rows) + " |")
        lines.append(f"| {name} publish p99 ms | " + " | ".join(
            f"{row[name]['p99_ms']:.1f}" if name in row else "-" for row in rows) + " |")
    for peer in sorted({peer for row in rows for peer in row["ratios"]}):
        lines.append(f"| mqstore / {peer} | " + " | ".join(
            f"{row['ratios'][peer]:.2f}" if peer in row["ratios"] else "-" for row in rows) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The sweep's own arguments, and the bench arguments given after `--`."""
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--axis", choices=sorted(AXES), required=True, help="what varies")
    parser.add_argument("--values", required=True, help="comma-separated values of the axis")
    parser.add_argument("--runs", type=int, default=3, help="runs per value (default 3)")
    parser.add_argument("--out", type=Path, required=True, help="directory for documents, table, plot")
    parser.add_argument("--peer", type=parse_peers,
                        help="peers run beside each run: redis, sqlite or both (redis,sqlite)")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per run (default 8)")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per run (default 2)")
    return parser.parse_args(argv), extra


def _check(args: argparse.Namespace, extra: list[str]) -> tuple[list[int], list[str], float]:
    """Everything that can be refused before a file is written: (values, the bench arguments
    common to every run, the time one run may take)."""
    values = parse_values(args.values)
    if args.runs < 1:
        raise SweepError(f"--runs: expected at least 1, got {args.runs}")
    if args.out.exists() and not args.out.is_dir():
        raise SweepError(f"--out: {args.out} exists and is not a directory")
    own = (*SWEEP_FLAGS, AXES[args.axis])
    reserved = [flag for flag in (arg.split("=")[0] for arg in extra) if flag in own]
    if reserved:
        raise SweepError(f"after --: {reserved[0]} is set by the sweep itself (see --help)")
    if importlib.util.find_spec("matplotlib") is None:
        raise SweepError("the plot needs matplotlib: pip install 'mqstore[plot]'")
    common = ["--seconds", f"{args.seconds:g}", "--warmup", f"{args.warmup:g}",
              *(["--peer", ",".join(args.peer)] if args.peer else []), *extra]
    return values, common, checked_timeout_s(args.axis, values, common, args.out)


def main(argv: list[str] | None = None) -> int:
    """Check, run (or resume) the sweep, write the table, the medians and the plot."""
    args, extra = parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        values, common, timeout_s = _check(args, extra)
        docs = run_sweep(args.axis, values, args.runs, args.out, common, timeout_s)
    except SweepError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: stopped; the runs done so far are kept in {args.out}", file=sys.stderr)
        return 130
    rows = medians(docs)
    text = table(args.axis, rows)
    (args.out / f"{args.axis}.md").write_text(text)
    summary = {"axis": args.axis, "runs": args.runs, "bench_args": common, "rows": rows}
    (args.out / f"{args.axis}.json").write_text(json.dumps(summary, indent=1) + "\n")
    from tools.bench import plot

    load_1m = statistics.median(doc["machine"]["load_avg"][0] for runs in docs.values() for doc in runs)
    plot.render_scaling(rows, str(args.out / f"{args.axis}.png"), x_label=X_LABELS[args.axis],
                        load_1m=load_1m)
    print(text, end="")
    print(f"wrote {args.out / (args.axis + '.md')}, {args.axis}.json and {args.axis}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
