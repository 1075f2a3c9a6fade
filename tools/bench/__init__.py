"""`mqstore bench`: the load-test harness (see tools/bench/cli.py and docs/BENCHMARKS.md).

`add_bench_parser(subparsers)` adds the subcommand; `run_bench(args)` runs it. Imported lazily,
so `mqstore` starts without numpy-heavy bench modules loaded.
"""

from __future__ import annotations


def add_bench_parser(subparsers):
    from tools.bench.cli import add_bench_parser as add

    return add(subparsers)


def run_bench(args) -> int:
    from tools.bench.cli import run_bench as run

    return run(args)


__all__ = ["add_bench_parser", "run_bench"]
