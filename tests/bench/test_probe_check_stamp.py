"""tools.bench.probes.check_stamp runs end to end on a few records (a smoke test, not a benchmark)."""

from __future__ import annotations

import json

from tools.bench.probes import check_stamp


def test_bench_check_stamp_small_run_reports_every_batch_size(tmp_path, capsys):
    out_file = tmp_path / "bench.json"
    out = check_stamp.main(["--records", "400", "--batches", "1,8,40", "--runs", "1",
                                  "--dir", str(tmp_path), "--json", str(out_file)])
    for batch in (1, 8, 40):
        row = out[f"batch_{batch}"]
        assert row["check_per_cpu_s"] > 0 and row["append_encoded_per_cpu_s"] > 0
        assert row["fused_per_cpu_s"] > 0 and row["us_per_record"]["fused"] > 0
    assert json.loads(out_file.read_text())["records"] == 400
    assert "batch_40" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]  # the commitlogs are gone
