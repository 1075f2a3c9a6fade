"""`mqstore bench`: the load-test harness (the subcommand is tools/bench/cli.py; see docs/BENCHMARKS.md)."""
