"""tools.bench.probes.filters runs end to end on a small queue: the tag-filtered sweeps deliver
exactly the one message in ten tagged t0 (asserted inside), every figure is a positive rate."""

from __future__ import annotations

import pytest

from tools.bench.probes import filters


@pytest.mark.slow
def test_bench_filters_reports_every_figure():
    out = filters.main(["--messages", "2000", "--runs", "1", "--max-counts", "32,512", "--records", "1000"])
    assert len(out) == 5 and all(rate > 0 for rate in out.values())
    assert "pull_columns tags=t0 max_count=512: entries/s" in out
