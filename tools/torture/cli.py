"""`mqstore torture` and `python -m tools.torture soak`: the command-line side of the torture.

    mqstore torture --store DIR --rounds N --target supervisor|dispatcher|index|producer|random
                    [--flush sync|async] [--fault kill|power-loss|offsets|delayed] [--seed N] [--json FILE]

`--fault delayed` runs delayed-delivery rounds instead (tools.torture.delayed_rounds).

The lead wires `add_torture_parser(subparsers)` into tools/cli.py; the parser's `func` is
`run_torture`, which returns the exit code (0 when every round passed, 1 otherwise).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import random
import sys
import time
from pathlib import Path

from tools.torture.delayed_rounds import DELAYED_FAULT, DelayedRun
from tools.torture.faults import Tear
from tools.torture.figures import Figures
from tools.torture.offset_damage import DAMAGES
from tools.torture.processes import TortureError
from tools.torture.rounds import FAULTS, TARGETS, TortureRun, TortureSettings

SOAK_PLAN = (  # (target, fault, flush): the supervisor first, then power loss, then the rest
    ("supervisor", "kill", "sync"),
    ("supervisor", "power-loss", "sync"),
    ("dispatcher", "kill", "sync"),
    ("index", "kill", "sync"),
    ("producer", "kill", "sync"),
    ("hostile", "kill", "sync"),
    ("random", "kill", "async"),
    ("supervisor", "power-loss", "async"),
    ("supervisor", "offsets", "sync"),
)


def _ack_range(text: str) -> tuple[int, int]:
    low, _, high = text.partition(",")
    try:
        values = (int(low), int(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not LOW,HIGH") from None
    if not 0 < values[0] <= values[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 < LOW <= HIGH")
    return values


def _damages(text: str) -> tuple[str, ...]:
    names = tuple(name for name in text.split(",") if name)
    unknown = sorted(set(names) - set(DAMAGES))
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {','.join(DAMAGES)}")
    return names


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `mqstore torture` and `python -m tools.torture run`."""
    parser.add_argument("--target", choices=(*TARGETS, "random"), default="random",
                        help="what each round attacks: a process to SIGKILL, or `hostile` (random and "
                        "bit-flipped requests beside the load); default random")
    parser.add_argument("--flush", choices=("sync", "async"), default="sync")
    parser.add_argument("--fault", choices=(*FAULTS, DELAYED_FAULT), default="kill",
                        help="power-loss: after a supervisor kill, drop what was not flushed; "
                        "offsets: consumer groups commit between kills, and while the store is down "
                        "consumerOffset.json is torn and segment mtimes are set to 1970; delayed: "
                        "kills while delayed messages fall due (--target supervisor, dispatcher, "
                        "index or random), each delivered once and never early")
    parser.add_argument("--work-dir", help="ledgers and logs (default: DIR.torture next to the store)")
    add_load_arguments(parser)


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """The options shared with `python -m tools.torture soak`."""
    parser.add_argument("--rounds", type=int, default=20, help="rounds to run (default 20)")
    parser.add_argument("--tear", choices=[t.value for t in Tear], default=Tear.PAGE.value,
                        help="power loss splits whole pages (default) or 512-byte sectors of a page")
    parser.add_argument("--seed", type=int, help="seed of all randomness (default: random, printed)")
    parser.add_argument("--producers", type=int, default=2, help="load processes (default 2)")
    parser.add_argument("--kills-per-round", type=int, default=1)
    parser.add_argument("--acks-before-kill", type=_ack_range, default=(20, 300), metavar="LOW,HIGH",
                        help="a kill comes after a random number of new acks in this range")
    parser.add_argument("--acks-after-restart", type=int, default=20,
                        help="acks required after the last restart of a round (default 20)")
    parser.add_argument("--rounds-per-store", type=int, default=0,
                        help="start a fresh store every N rounds (0: one store; bounds check time)")
    parser.add_argument("--offset-damages", type=_damages, default=DAMAGES, metavar="D[,D]",
                        help="with --fault offsets: what is damaged while the store is down, "
                        f"of {','.join(DAMAGES)} (default both)")
    parser.add_argument("--json", help="write the figures (and every round) to this file")


def add_torture_parser(subparsers) -> argparse.ArgumentParser:
    """Add `torture` to a subparsers action (tools/cli.py's)."""
    parser = subparsers.add_parser(
        "torture", help="kill a running store at random moments and verify every acknowledged "
        "message survived", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True, help="a new (absent or empty) store directory")
    add_run_arguments(parser)
    parser.set_defaults(func=run_torture)
    return parser


def settings_from_args(args: argparse.Namespace, **overrides) -> TortureSettings:
    values = dict(store_dir=Path(args.store), rounds=args.rounds, target=args.target,
                  flush=args.flush, fault=args.fault, tear=Tear(args.tear), seed=args.seed,
                  producers=args.producers,
                  kills_per_round=args.kills_per_round, acks_before_kill=args.acks_before_kill,
                  acks_after_restart=args.acks_after_restart,
                  rounds_per_store=args.rounds_per_store, offset_damages=args.offset_damages,
                  work_dir=Path(args.work_dir) if args.work_dir else None,
                  progress=lambda line: print(line, flush=True))
    values.update(overrides)
    return TortureSettings(**values)


def run_torture(args: argparse.Namespace) -> int:
    """Run the torture the arguments describe; print the figures; 0 if it passed."""
    if args.fault == DELAYED_FAULT:
        return _run_delayed(args)
    if args.fault != "kill" and args.target not in ("supervisor", "random"):
        print(f"mqstore: error: --fault {args.fault} needs --target supervisor or random",
              file=sys.stderr)
        return 2
    run = TortureRun(settings_from_args(args))
    print(f"torture seed {run.seed} (rerun with --seed {run.seed})", flush=True)
    figures = run.run()
    print("\n".join(figures.lines()), flush=True)
    if args.json:
        write_json(Path(args.json), [figures], command=sys.argv)
    return 0 if figures.passed else 1


def _run_delayed(args: argparse.Namespace) -> int:
    """`--fault delayed`: kills while delayed messages fall due (DelayedRun)."""
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    root = Path(args.store)
    work_dir = Path(args.work_dir) if args.work_dir else root.with_name(root.name + ".torture")
    print(f"torture seed {seed} (rerun with --seed {seed})", flush=True)
    try:
        figures = DelayedRun(root, work_dir, rounds=args.rounds, target=args.target, seed=seed).run()
    except TortureError as exc:
        print(f"mqstore: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(figures.lines()), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(dataclasses.asdict(figures), indent=2) + "\n")
    return 0 if figures.passed else 1


def write_json(path: Path, runs: list[Figures], *, command: list[str]) -> None:
    document = {"command": " ".join(command), "machine": machine_description(),
                "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "runs": [f.to_dict() for f in runs]}
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")


def machine_description() -> str:
    import os

    return (f"{platform.node()} {platform.system()} {platform.release()} {platform.machine()}, "
            f"{os.cpu_count()} CPUs, Python {platform.python_version()}")


def run_soak(args: argparse.Namespace) -> int:
    """The long version: SOAK_PLAN, each with --rounds rounds, in fresh stores under --out."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base_seed = args.seed if args.seed is not None else int(time.time())
    print(f"soak: seed {base_seed}, {args.rounds} rounds per plan line, work in {out}", flush=True)
    runs: list[Figures] = []
    for i, (target, fault, flush) in enumerate(SOAK_PLAN):
        if i + 1 < args.start_at:
            continue
        store = out / f"{i}-{target}-{fault}-{flush}"
        ns = argparse.Namespace(**{**vars(args), "store": str(store), "target": target,
                                   "fault": fault, "flush": flush, "seed": base_seed + i,
                                   "work_dir": None})
        print(f"== {target} / {fault} / {flush} flush: seed {base_seed + i}", flush=True)
        figures = TortureRun(settings_from_args(ns)).run()
        print("\n".join(figures.lines()), flush=True)
        runs.append(figures)
        if args.json:
            write_json(Path(args.json), runs, command=sys.argv)
        if not figures.passed and not args.keep_going:
            break
    planned = len(SOAK_PLAN) - args.start_at + 1
    passed = all(f.passed for f in runs) and len(runs) == planned
    print(f"soak: {'PASSED' if passed else 'FAILED'} ({len(runs)} of {planned} plan lines)")
    return 0 if passed else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.torture")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="one torture run (same as `mqstore torture`)")
    run.add_argument("--store", required=True)
    add_run_arguments(run)
    run.set_defaults(func=run_torture)
    soak = sub.add_parser("soak", help="the long version: every target and fault, many rounds")
    soak.add_argument("--out", default="soak-stores", help="directory for the stores (new)")
    add_load_arguments(soak)
    soak.set_defaults(rounds=200, rounds_per_store=50, func=run_soak)
    soak.add_argument("--keep-going", action="store_true", help="run every plan line even after a failure")
    soak.add_argument("--start-at", type=int, default=1, metavar="N",
                      help=f"skip the plan lines before line N (1..{len(SOAK_PLAN)})")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))
