"""tools.bench.probes.wakeup runs end to end on a few hand-offs and leaves no semaphore behind."""

from __future__ import annotations

import os

from tools.bench.probes import wakeup


def own_semaphores() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("sem." + wakeup.NAME_PREFIX[1:])}


def test_bench_wakeup_reports_both_placements_and_cleans_up():
    allowed = os.sched_getaffinity(0)
    out = wakeup.main(["--rounds", "50", "--runs", "1"])
    assert sorted(out) == ["any CPU", "one CPU"]
    assert all(row["round_trip_us"] > row["post_us"] > 0 for row in out.values())
    assert own_semaphores() == set()
    assert os.sched_getaffinity(0) == allowed  # the pin is undone
