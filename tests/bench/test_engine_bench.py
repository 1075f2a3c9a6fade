"""tools.bench.engine runs every measure end to end on a small input (a smoke test, not a benchmark)."""

from __future__ import annotations

import json

import pytest

from tools.bench import engine


@pytest.mark.slow
def test_bench_engine_small_run_reports_every_measure(tmp_path, capsys):
    out_file = tmp_path / "bench.json"
    out = engine.main(["--records", "1500", "--sync-records", "300", "--runs", "1",
                             "--big-records", "3000", "--queries", "50", "--dir", str(tmp_path),
                             "--json", str(out_file)])
    for name in ("put_async", "put_sync", "append", "dispatch", "verify", "query", "big_store"):
        assert name in out, name
    assert out["verify"]["records"] == 3000 and out["query"]["first_pass"]["found"] == 50
    assert out["dispatch"]["median_per_s"] > 0 and out["append"]["scalar"]["median_per_s"] > 0
    assert json.loads(out_file.read_text())["big_store"]["index_keys"] == 6000
    assert "query_by_key" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]  # the work directory is gone
