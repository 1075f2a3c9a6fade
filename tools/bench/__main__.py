"""`python -m tools.bench ...`: the same as `mqstore bench ...`; `_worker SPEC` runs one worker."""

from __future__ import annotations

import argparse
import sys

from engine.errors import StoreError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["_worker"]:
        from tools.bench.loadgen import worker_main

        return worker_main(argv[1:])
    from tools.bench.cli import add_bench_parser

    parser = argparse.ArgumentParser(prog="python -m tools.bench")
    sub = parser.add_subparsers(dest="command", required=True)
    add_bench_parser(sub)
    args = parser.parse_args(["bench", *argv])
    try:
        return int(args.func(args))
    except StoreError as exc:
        from tools.cli import exit_code_for

        print(f"mqstore bench: error: {exc}", file=sys.stderr)
        return int(exit_code_for(exc))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
