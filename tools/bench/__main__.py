"""`python -m tools.bench ...`: the same as `mqstore bench ...`; `_worker SPEC` runs one worker."""

from __future__ import annotations

import sys

from engine.errors import StoreError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["_worker"]:
        from tools.bench.loadgen import worker_main

        return worker_main(argv[1:])
    from tools.bench.cli import bench_parser

    args = bench_parser("python -m tools.bench").parse_args(["bench", *argv])
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
