"""The put latency histogram: how long the supervisor holds a put request, from taking it out
of its producer's mailbox slot to answering it (after the fsync under flush=sync).

Fixed buckets keep the supervisor's side cheap: the thread that answers a batch of requests
tallies them here (a bisect and two additions per request, nothing per record) and adds the
tally to the control block's latency group once (ControlBlock.add_put_latencies). Readers turn
the counters into a Prometheus histogram (tools/exporter.py) or p50/p99 (`mqstore status`).

The bounds are the 1-2-5 series from 50 us to 2 s, one bucket per bound plus one above 2 s:
log-spaced, as latencies spread over orders of magnitude, and readable as `le` labels.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from dataclasses import dataclass

BOUNDS_NS = (50_000, 100_000, 200_000, 500_000,
             1_000_000, 2_000_000, 5_000_000, 10_000_000, 20_000_000, 50_000_000,
             100_000_000, 200_000_000, 500_000_000, 1_000_000_000, 2_000_000_000)
BUCKET_COUNT = len(BOUNDS_NS) + 1  # the last bucket holds everything above 2 s (le="+Inf")
LATENCY_GROUP = struct.Struct(f"<{BUCKET_COUNT + 1}q")  # requests per bucket, then sum_ns


class LatencyTally:
    """The latencies of one answered batch, added up privately and published once. A batch is
    mostly a few requests: it keeps each one's bucket, not a count per bucket."""

    def __init__(self) -> None:
        self.buckets: list[int] = []  # the bucket of each request observed
        self.sum_ns = 0

    def observe(self, latency_ns: int) -> None:
        """One request answered `latency_ns` after it was taken (a negative clamps to 0)."""
        if latency_ns < 0:
            latency_ns = 0
        self.buckets.append(bisect_left(BOUNDS_NS, latency_ns))  # le: latency <= bound
        self.sum_ns += latency_ns

    @property
    def bucket_counts(self) -> list[int]:
        """Requests per bucket."""
        counts = [0] * BUCKET_COUNT
        for bucket in self.buckets:
            counts[bucket] += 1
        return counts

    @property
    def count(self) -> int:
        return len(self.buckets)


@dataclass(frozen=True)
class LatencyHistogram:
    """A snapshot of the counters: requests per bucket (not cumulative) and their total time."""

    bucket_counts: tuple[int, ...]
    sum_ns: int

    @classmethod
    def from_group(cls, values: tuple[int, ...]) -> LatencyHistogram:
        """From the control block group's words (LATENCY_GROUP)."""
        if len(values) != BUCKET_COUNT + 1:
            raise ValueError(f"a latency group has {BUCKET_COUNT + 1} words, not {len(values)}")
        return cls(tuple(values[:BUCKET_COUNT]), values[BUCKET_COUNT])

    @property
    def count(self) -> int:
        return sum(self.bucket_counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound in seconds, requests at or below it) per finite bound, as Prometheus's
        `le` buckets; the +Inf bucket is `count`."""
        total, rows = 0, []
        for bound_ns, bucket in zip(BOUNDS_NS, self.bucket_counts, strict=False):
            total += bucket
            rows.append((bound_ns / 1e9, total))
        return rows

    def quantile_s(self, q: float) -> float | None:
        """The q-quantile in seconds, interpolated linearly inside its bucket as Prometheus's
        histogram_quantile does; None with no requests. Above 2 s it says 2 s (a lower bound)."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile {q} is not in 0..1")
        count = self.count
        if count == 0:
            return None
        rank = q * count
        below, lower_ns = 0, 0
        for bound_ns, bucket in zip(BOUNDS_NS, self.bucket_counts, strict=False):
            if bucket and below + bucket >= rank:
                return (lower_ns + (bound_ns - lower_ns) * (rank - below) / bucket) / 1e9
            below, lower_ns = below + bucket, bound_ns
        return BOUNDS_NS[-1] / 1e9
