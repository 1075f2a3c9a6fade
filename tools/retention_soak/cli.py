"""Command line of the retention soak: `run` (the soak), and the client processes it starts
(`produce`, `consume`), which are not meant to be run by hand."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from tools.retention_soak.clients import ConsumerRole, consume, produce
from tools.retention_soak.driver import SoakSettings, render, run_soak


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.retention_soak",
                                     description="a supervised store with retention of minutes "
                                     "under load, one consumer in front and one behind")
    sub = parser.add_subparsers(dest="command", required=True)
    defaults = SoakSettings()
    run = sub.add_parser("run", help="run the soak and print its figures")
    run.add_argument("--duration-s", type=float, default=defaults.duration_s)
    run.add_argument("--reserved-s", type=float, default=defaults.reserved_s,
                     help="file_reserved_hours, in seconds")
    run.add_argument("--rate", type=int, default=defaults.rate_msgs_per_s, help="messages a second")
    run.add_argument("--body-bytes", type=int, default=defaults.body_bytes)
    run.add_argument("--segment-bytes", type=int, default=defaults.segment_bytes)
    run.add_argument("--workdir", help="directory for the store and logs (default: a new temp dir)")
    run.add_argument("--json", help="also write the figures to this file")

    p = sub.add_parser("produce")
    for name in ("--store", "--ledger"):
        p.add_argument(name, required=True, type=Path)
    p.add_argument("--until", required=True, type=float)
    for name in ("--rate", "--body-bytes", "--queues"):
        p.add_argument(name, required=True, type=int)

    p = sub.add_parser("consume")
    for name in ("--store", "--out", "--stop"):
        p.add_argument(name, required=True, type=Path)
    p.add_argument("--role", required=True, choices=[r.value for r in ConsumerRole])
    p.add_argument("--queues", required=True, type=int)
    p.add_argument("--rate", required=True, type=int)
    return parser


def _check_run_args(args: argparse.Namespace) -> SoakSettings:
    for name in ("duration_s", "reserved_s", "rate", "body_bytes", "segment_bytes"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"--{name.replace('_', '-')} must be positive, not {getattr(args, name)}")
    if args.body_bytes < 16:
        raise SystemExit("--body-bytes must be at least 16 (the body starts with its sequence number)")
    return SoakSettings(duration_s=args.duration_s, reserved_s=args.reserved_s,
                        rate_msgs_per_s=args.rate, body_bytes=args.body_bytes,
                        segment_bytes=args.segment_bytes)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "produce":
        produce(args.store, args.ledger, until_s=args.until, rate_msgs_per_s=args.rate,
                body_bytes=args.body_bytes, queue_count=args.queues)
        return 0
    if args.command == "consume":
        role = ConsumerRole(args.role)
        consume(args.store, f"soak-{role.value}", args.out, args.stop, role=role,
                queue_count=args.queues, rate_msgs_per_s=args.rate)
        return 0
    settings = _check_run_args(args)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="mqstore-soak-"))
    print(f"retention soak: {settings.duration_s:g} s, retention {settings.reserved_s:g} s, "
          f"{settings.rate_msgs_per_s} msg/s, in {workdir}", file=sys.stderr)
    figures = run_soak(settings, workdir, progress=lambda line: print(line, file=sys.stderr))
    print(render(figures))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if figures["ok"] else 1
