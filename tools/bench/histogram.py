"""Latency histogram: HDR-style log-linear buckets over integer nanoseconds, in one numpy array.

Bucket layout (SUB_BITS = 8, so 256 linear sub-buckets per power of two, 128 of them new):

    values [0, 256)                 one bucket per ns (exact)
    values [2^(e+7), 2^(e+8)), e>=1 index e*128 + (v >> e), width 2^e ns

so a recorded value is known to within 1/128 (0.8 %) of itself. Percentiles use the nearest rank
(numpy `method="inverted_cdf"`) and return the highest value that is equivalent to the bucket
holding that rank, clipped to the exact min and max. Count, sum, min and max are exact.

Histograms merge by adding counts, so per-process histograms add up to exactly the histogram
of all samples. They travel between processes as sparse JSON: {"i": [...], "c": [...], ...}.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

SUB_BITS = 8
SUB_COUNT = 1 << SUB_BITS
HALF_COUNT = SUB_COUNT // 2
MAX_VALUE_NS = (1 << 44) - 1  # about 4.9 hours; larger values are clamped
BUCKET_COUNT = (44 - SUB_BITS + 1) * HALF_COUNT + HALF_COUNT
PERCENTILES = (50.0, 90.0, 99.0, 99.9, 99.99)


def bucket_index(values_ns: np.ndarray) -> np.ndarray:
    """Bucket index of each value (int64 array in, int64 array out); negatives count as 0."""
    values = np.clip(np.asarray(values_ns, dtype=np.int64), 0, MAX_VALUE_NS)
    # frexp's exponent is the bit length; exact because every value < 2^53 is a float64
    _, bit_length = np.frexp(values.astype(np.float64))
    shift = np.maximum(bit_length.astype(np.int64) - SUB_BITS, 0)
    return shift * HALF_COUNT + (values >> shift)


def bucket_high_ns(index: np.ndarray | int) -> np.ndarray:
    """The highest value that falls into each bucket index."""
    index = np.asarray(index, dtype=np.int64)
    shift = np.maximum(index // HALF_COUNT - 1, 0)
    sub = index - shift * HALF_COUNT
    return ((sub + 1) << shift) - 1


class LatencyHistogram:
    """Counts of latencies in nanoseconds, plus exact count, sum, min and max."""

    __slots__ = ("count", "counts", "max_ns", "min_ns", "sum_ns")

    def __init__(self) -> None:
        self.counts = np.zeros(BUCKET_COUNT, dtype=np.int64)
        self.count = 0
        self.sum_ns = 0
        self.min_ns = 0
        self.max_ns = 0

    # ------------------------------------------------------------------------------ record
    def record(self, value_ns: int, times: int = 1) -> None:
        """Add one value (`times` times); pure-Python fast path of record_many. A producer
        records two per send: branches, not min/max calls."""
        value = int(value_ns)
        if value < 0:
            value = 0
        clamped = value if value <= MAX_VALUE_NS else MAX_VALUE_NS
        shift = clamped.bit_length() - SUB_BITS
        self.counts[clamped if shift <= 0 else shift * HALF_COUNT + (clamped >> shift)] += times
        if self.count == 0 or value < self.min_ns:
            self.min_ns = value
        if value > self.max_ns:
            self.max_ns = value
        self.count += times
        self.sum_ns += value * times

    def record_many(self, values_ns: Iterable[int] | np.ndarray,
                    weights: np.ndarray | None = None) -> None:
        """Add many values at once; `weights` gives how many times each counts."""
        values = np.maximum(np.asarray(values_ns, dtype=np.int64).ravel(), 0)
        if values.size == 0:
            return
        weights = (np.ones(values.size, dtype=np.int64) if weights is None
                   else np.asarray(weights, dtype=np.int64).ravel())
        np.add.at(self.counts, bucket_index(values), weights)
        added = int(weights.sum())
        low, high = int(values.min()), int(values.max())
        self.min_ns = low if self.count == 0 else min(self.min_ns, low)
        self.max_ns = max(self.max_ns, high)
        self.count += added
        self.sum_ns += int((values * weights).sum())

    def merge(self, other: LatencyHistogram) -> LatencyHistogram:
        """Add `other` into this histogram; returns self."""
        if other.count == 0:
            return self
        self.min_ns = other.min_ns if self.count == 0 else min(self.min_ns, other.min_ns)
        self.max_ns = max(self.max_ns, other.max_ns)
        self.counts += other.counts
        self.count += other.count
        self.sum_ns += other.sum_ns
        return self

    # ------------------------------------------------------------------------------ read
    @property
    def mean_ns(self) -> float:
        return self.sum_ns / self.count if self.count else 0.0

    def percentile_ns(self, percent: float) -> int:
        """Nearest-rank percentile, as the highest value equivalent to its bucket (0 if empty)."""
        if self.count == 0:
            return 0
        rank = max(int(np.ceil(percent / 100.0 * self.count)), 1)
        index = int(np.searchsorted(np.cumsum(self.counts), rank))
        return int(min(max(int(bucket_high_ns(index)), self.min_ns), self.max_ns))

    def summary_ms(self, percents: Iterable[float] = PERCENTILES) -> dict[str, float]:
        """count, avg, min, the percentiles (keys p50, p99, p99_9 ...) and max, in milliseconds."""
        out = {"count": self.count, "avg_ms": round(self.mean_ns / 1e6, 4),
               "min_ms": round(self.min_ns / 1e6, 4)}
        for percent in percents:
            out[percentile_key(percent)] = round(self.percentile_ns(percent) / 1e6, 4)
        out["max_ms"] = round(self.max_ns / 1e6, 4)
        return out

    def nonzero_buckets(self) -> tuple[np.ndarray, np.ndarray]:
        """(highest value of each non-empty bucket in ns, its count), for plots."""
        index = np.flatnonzero(self.counts)
        return bucket_high_ns(index), self.counts[index]

    # ------------------------------------------------------------------------------ transport
    def to_sparse(self) -> dict:
        index = np.flatnonzero(self.counts)
        return {"i": index.tolist(), "c": self.counts[index].tolist(), "n": self.count,
                "sum": self.sum_ns, "min": self.min_ns, "max": self.max_ns}

    @classmethod
    def from_sparse(cls, data: dict) -> LatencyHistogram:
        hist = cls()
        if data["n"]:
            hist.counts[np.asarray(data["i"], dtype=np.int64)] = np.asarray(data["c"], dtype=np.int64)
            hist.count, hist.sum_ns = int(data["n"]), int(data["sum"])
            hist.min_ns, hist.max_ns = int(data["min"]), int(data["max"])
        return hist

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LatencyHistogram):
            return NotImplemented
        return (self.count, self.sum_ns, self.min_ns, self.max_ns) == (
            other.count, other.sum_ns, other.min_ns, other.max_ns) and bool(
            np.array_equal(self.counts, other.counts))

    __hash__ = None  # mutable


def percentile_key(percent: float) -> str:
    """50 -> 'p50_ms', 99.9 -> 'p99_9_ms'."""
    text = f"{percent:g}".replace(".", "_")
    return f"p{text}_ms"


def merged(histograms: Iterable[LatencyHistogram]) -> LatencyHistogram:
    """A new histogram holding the sum of `histograms`."""
    total = LatencyHistogram()
    for hist in histograms:
        total.merge(hist)
    return total
