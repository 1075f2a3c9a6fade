"""The put latency histogram (control block layout version 4): fixed buckets, `le` semantics,
quantiles as Prometheus interpolates them, and counters another process reads from the block."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap

import pytest

from ipc.control_block import PUT_LATENCY_GROUP_OFFSET, TOTAL_SIZE
from ipc.put_latency import BOUNDS_NS, BUCKET_COUNT, LatencyHistogram, LatencyTally
from tests.ipc.control_blocks import control_block
from workers.child_env import REPO_ROOT, child_env


@pytest.fixture
def ctl(tmp_path):
    with control_block(tmp_path, 1) as block:
        yield block


def tally_of(*latencies_ns: int) -> LatencyTally:
    tally = LatencyTally()
    for latency_ns in latencies_ns:
        tally.observe(latency_ns)
    return tally


def histogram_of(*latencies_ns: int) -> LatencyHistogram:
    tally = tally_of(*latencies_ns)
    return LatencyHistogram(tuple(tally.bucket_counts), tally.sum_ns)


def test_the_bounds_are_log_spaced_from_50_us_to_2_s_with_one_bucket_above():
    assert (BOUNDS_NS[0], BOUNDS_NS[-1], BUCKET_COUNT) == (50_000, 2_000_000_000, 16)
    ratios = [b / a for a, b in itertools.pairwise(BOUNDS_NS)]
    assert all(2 <= ratio <= 2.5 for ratio in ratios), ratios
    assert PUT_LATENCY_GROUP_OFFSET % 64 == 0 and TOTAL_SIZE == PUT_LATENCY_GROUP_OFFSET + 192


def test_a_latency_on_a_bound_counts_at_or_below_it_and_above_2_s_goes_to_the_last_bucket():
    histogram = histogram_of(50_000, 50_001, 0, 2_000_000_000, 2_000_000_001, -5)
    counts = histogram.bucket_counts
    assert (counts[0], counts[1], counts[BOUNDS_NS.index(2_000_000_000)], counts[-1]) == (3, 1, 1, 1)
    assert histogram.count == 6 and histogram.sum_ns == 50_000 + 50_001 + 4_000_000_001
    cumulative = histogram.cumulative()
    assert [le for le, _ in cumulative] == [b / 1e9 for b in BOUNDS_NS]
    assert [n for _, n in cumulative] == sorted(n for _, n in cumulative) and cumulative[-1][1] == 5


def test_quantiles_interpolate_inside_the_bucket_as_prometheus_does():
    # 100 requests between 1 and 2 ms, 1 above 2 s: p50 halfway through the 1-2 ms bucket
    histogram = histogram_of(*[1_500_000] * 100, 3_000_000_000)
    assert histogram.quantile_s(0.5) == pytest.approx(0.001 + 0.001 * 50.5 / 100)
    assert histogram.quantile_s(0.999) == 2.0  # in the +Inf bucket: the last bound, a lower bound
    assert histogram_of().quantile_s(0.99) is None
    with pytest.raises(ValueError, match=r"not in 0\.\.1"):
        histogram.quantile_s(99)


def test_a_group_of_the_wrong_width_is_refused():
    with pytest.raises(ValueError, match="17 words"):
        LatencyHistogram.from_group((0,) * 16)


def test_batches_add_up_in_the_block_and_another_process_reads_them(ctl, tmp_path):
    assert ctl.put_latency() == LatencyHistogram((0,) * BUCKET_COUNT, 0)
    ctl.add_put_latencies(tally_of(60_000, 60_000, 7_000_000))
    ctl.add_put_latencies(tally_of(60_000, 3_000_000_000))
    script = textwrap.dedent(f"""
        from ipc.control_block import ControlBlock
        with ControlBlock.attach({str(tmp_path)!r}) as ctl:
            h = ctl.put_latency()
            print(h.count, h.sum_ns, h.bucket_counts[1], h.bucket_counts[-1])
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=child_env(),
                         capture_output=True, check=True, timeout=60).stdout.split()
    assert [int(word) for word in out] == [5, 3 * 60_000 + 7_000_000 + 3_000_000_000, 3, 1]
