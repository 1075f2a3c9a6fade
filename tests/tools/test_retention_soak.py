"""The retention soak, short (issue 20, item 1): `make soak` runs the same for 10 minutes.

A real supervisor, producer and two consumer processes; retention of 6 s on 64 KiB segments,
so segments, consume-queue files and index files all expire within the run (20 s: retention is
steady from the middle third on, which the bounded-disk check compares the last third with).
"""

from __future__ import annotations

import pytest

from tools.retention_soak.driver import SoakSettings, run_soak

SHORT = SoakSettings(duration_s=20.0, reserved_s=6.0, rate_msgs_per_s=200, body_bytes=400,
                     segment_bytes=64 * 1024, cq_entries=200, index_entries=500)


@pytest.mark.slow
def test_a_short_soak_stays_bounded_and_loses_nothing_inside_retention(tmp_path):
    figures = run_soak(SHORT, tmp_path / "soak", progress=lambda line: None)
    assert figures["segments_deleted"] >= 10
    assert figures["cq_files_deleted"] >= 1 and figures["index_files_deleted"] >= 1
    assert figures["bounded"], figures
    assert figures["behind_jumps"] >= 1 and figures["front_jumps"] == 0
    assert figures["acknowledged"] >= SHORT.rate_msgs_per_s * SHORT.duration_s * 0.5
    assert figures["consumed_front"] == figures["acknowledged"]
    assert (figures["losses"], figures["wrong_reads"], figures["front_twice"]) == (0, 0, 0)
    assert (figures["check_findings"], figures["supervisor_exit"]) == (0, 0)
    assert figures["ok"]
