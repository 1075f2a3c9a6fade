"""Micro-benchmark probes, one mechanism each: `python -m tools.bench.probes.<name>`."""
