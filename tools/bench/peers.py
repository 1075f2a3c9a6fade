"""The peers `mqstore bench --peer` runs the same workload against, after the store's run.

`--peer redis`, `--peer sqlite` or a comma list (`--peer redis,sqlite`, run in that order).
Each peer module (tools.bench.redis_peer, tools.bench.sqlite_peer) gives a context manager that
sets the peer up for one run and removes it after, with `target` (what its workers connect to),
`pid` (a server process whose CPU the sampler reports, or None), `setting` (its durability
setting, for the side-by-side) and `started_line`, and a sender and a receiver for the workers
(tools.bench.loadgen picks them by name). This module imports none of them.
"""

from __future__ import annotations

import argparse

from engine.errors import StoreError

PEER_NAMES = ("redis", "sqlite")


class PeerUnavailableError(StoreError):
    """The peer cannot run here (a program or a Python package is missing)."""


def parse_peers(text: str) -> tuple[str, ...]:
    """`--peer` value: peer names, comma-separated, each once (argparse type)."""
    names = tuple(name.strip() for name in text.split(","))
    unknown = [name for name in names if name not in PEER_NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"{', '.join(repr(n) for n in unknown)} is not a peer: give one or more of "
            f"{', '.join(PEER_NAMES)}, comma-separated (e.g. redis,sqlite)")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"peer {', '.join(repeated)} given twice in {text!r}")
    return names
