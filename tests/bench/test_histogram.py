"""tools.bench.histogram: bucket layout, exact merges, nearest-rank percentiles."""

from __future__ import annotations

import numpy as np
import pytest

from tools.bench.histogram import (
    BUCKET_COUNT,
    MAX_VALUE_NS,
    LatencyHistogram,
    bucket_high_ns,
    bucket_index,
    merged,
)

SEED = 20240611


def _nearest_rank(values: np.ndarray, percent: float) -> int:
    return int(np.percentile(values, percent, method="inverted_cdf"))


def test_bucket_index_is_monotonic_and_within_one_128th():
    values = np.concatenate([np.arange(0, 70_000), (2 ** np.arange(8, 45)) - 1, 2 ** np.arange(8, 44)])
    values.sort()
    index = bucket_index(values)
    high = bucket_high_ns(index)
    assert (np.diff(index) >= 0).all()
    assert (high >= values).all()
    assert ((high - values) <= values / 128).all()
    assert index.max() == BUCKET_COUNT - 1 == bucket_index(np.array([MAX_VALUE_NS]))[0]


def test_small_values_are_exact():
    hist = LatencyHistogram()
    values = np.arange(1, 201)
    hist.record_many(values)
    for percent in (1, 50, 90, 99, 99.5, 100):
        assert hist.percentile_ns(percent) == _nearest_rank(values, percent)
    assert (hist.count, hist.min_ns, hist.max_ns, hist.sum_ns) == (200, 1, 200, int(values.sum()))


def test_percentiles_match_nearest_rank_on_bucket_boundaries():
    rng = np.random.default_rng(SEED)
    # highest values of random buckets are recorded exactly, so nearest rank must match numpy
    values = bucket_high_ns(rng.integers(0, 3000, size=10_000))
    hist = LatencyHistogram()
    hist.record_many(values)
    for percent in (0.1, 25, 50, 75, 90, 99, 99.9, 99.99, 100):
        assert hist.percentile_ns(percent) == _nearest_rank(values, percent), percent


def test_percentiles_of_arbitrary_values_are_within_bucket_precision():
    rng = np.random.default_rng(SEED)
    values = rng.lognormal(mean=13, sigma=1.5, size=50_000).astype(np.int64)
    hist = LatencyHistogram()
    hist.record_many(values)
    for percent in (50, 90, 99, 99.9):
        exact = _nearest_rank(values, percent)
        assert exact <= hist.percentile_ns(percent) <= exact * (1 + 1 / 128)
    assert hist.percentile_ns(100) == values.max()
    assert hist.mean_ns == pytest.approx(values.mean())


def test_merge_equals_histogram_of_all_samples():
    rng = np.random.default_rng(SEED)
    parts = [rng.integers(0, 10**9, size=n) for n in (1, 500, 7_000, 0)]
    singles = []
    for part in parts:
        hist = LatencyHistogram()
        hist.record_many(part)
        singles.append(hist)
    whole = LatencyHistogram()
    whole.record_many(np.concatenate(parts))
    assert merged(singles) == whole
    assert merged(reversed(singles)) == whole


def test_sparse_round_trip_and_weights():
    hist = LatencyHistogram()
    hist.record(1_500_000, times=64)
    hist.record_many([10, 20_000], np.array([3, 2]))
    back = LatencyHistogram.from_sparse(hist.to_sparse())
    assert back == hist
    assert back.count == 69 and back.min_ns == 10 and back.max_ns == 1_500_000
    assert LatencyHistogram.from_sparse(LatencyHistogram().to_sparse()) == LatencyHistogram()


def test_empty_histogram_reads_zero():
    hist = LatencyHistogram()
    assert hist.percentile_ns(99) == 0
    assert hist.summary_ms()["count"] == 0


def test_record_one_value_matches_record_many():
    rng = np.random.default_rng(SEED)
    values = np.concatenate([[0, 1, 255, 256, MAX_VALUE_NS, MAX_VALUE_NS + 5, -3],
                             rng.integers(0, 10**11, size=2000)])
    one, many = LatencyHistogram(), LatencyHistogram()
    for value in values.tolist():
        one.record(value, times=2)
    many.record_many(values, np.full(values.size, 2))
    assert one.count == many.count and np.array_equal(one.counts, many.counts)
    assert (one.min_ns, one.max_ns) == (many.min_ns, many.max_ns)
