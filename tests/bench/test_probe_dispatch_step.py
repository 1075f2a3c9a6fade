"""tools.bench.probes.dispatch_step runs end to end on a few steps (a smoke test, not a benchmark)."""

from __future__ import annotations

from tools.bench.probes import dispatch_step


def test_bench_dispatch_step_reports_every_path_for_every_step_size(capsys):
    out = dispatch_step.main(["--records", "1,4", "--steps", "5", "--runs", "1"])
    assert sorted(out) == [1, 4]
    assert all(row["batch_us"] > 0 and row["each_us"] > 0 and row["plain_us"] > 0 for row in out.values())
    printed = capsys.readouterr().out
    assert "record by record" in printed and "plain" in printed
