"""tools.bench.probes.group_consume runs end to end on a small backlog and leaves nothing over."""

from __future__ import annotations

import pytest

from tools.bench.probes import group_consume


@pytest.mark.slow
def test_members_drain_each_message_once_and_a_killed_members_queues_move(tmp_path):
    out = group_consume.main(["--messages", "4000", "--members", "2", "--runs", "1", "--kills", "2",
                              "--dir", str(tmp_path)])
    assert out["drain_msgs_per_s"] > 0 and out["cpu_us_per_msg"] > 0  # the run read each once
    assert len(out["hand_over_ms"]) == 2 and all(ms > 0 for ms in out["hand_over_ms"])
    assert list(tmp_path.iterdir()) == []  # the store is removed
