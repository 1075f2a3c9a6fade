"""tools.bench.sweep: medians and the table from given documents, bad input refused before anything
is written, and one real two-point sweep that a second invocation finishes from what it kept."""

from __future__ import annotations

import json

import pytest

from tools.bench import report, sweep


def _doc(mqstore: float, redis: float | None, p99: float = 2.0, sqlite: float | None = None) -> dict:
    def run(rate: float) -> dict:
        return {"summary": {"pub_msgs_per_s": rate, "pub_latency": {"p99_ms": p99}}}

    runs = {"mqstore": run(mqstore)}
    if redis is not None:
        runs["redis"] = run(redis)
    if sqlite is not None:
        runs["sqlite"] = run(sqlite)
    return {"runs": runs}


def test_medians_and_ratio_per_value():
    docs = {1: [_doc(100, 50), _doc(300, 60), _doc(200, 400, p99=9.0)], 4: [_doc(1000, None)]}
    rows = sweep.medians(docs)
    assert rows[0]["mqstore"]["msgs_per_s"] == 200 and rows[0]["redis"]["msgs_per_s"] == 60
    assert rows[0]["mqstore"]["runs_msgs_per_s"] == [100, 300, 200]
    assert rows[0]["ratios"] == {"redis": 3.33} and rows[1]["ratios"] == {}
    assert sweep.table("producers", rows).splitlines() == [
        "| producers | 1 | 4 |",
        "|---|---|---|",
        "| mqstore msg/s | 200 | 1,000 |",
        "| mqstore publish p99 ms | 2.0 | 2.0 |",
        "| redis msg/s | 60 | - |",
        "| redis publish p99 ms | 2.0 | - |",
        "| mqstore / redis | 3.33 | - |",
    ]


def test_two_peers_get_a_ratio_row_each():
    docs = {1: [_doc(100, 50, sqlite=200), _doc(120, 40, sqlite=100), _doc(110, 55, sqlite=220)]}
    rows = sweep.medians(docs)
    assert rows[0]["ratios"] == {"redis": 2.2, "sqlite": 0.55}
    lines = sweep.table("producers", rows).splitlines()
    assert lines[-2:] == ["| mqstore / redis | 2.20 |", "| mqstore / sqlite | 0.55 |"]
    assert "| sqlite msg/s | 200 |" in lines


def test_the_axis_flag_comes_last_so_it_wins_over_extra_arguments(tmp_path):
    args = sweep.bench_args("size", 1024, ["--size", "9", "--batch", "1"], tmp_path / "r.json")
    assert args[-4:] == ["--size", "1024", "--json", str(tmp_path / "r.json")]
    assert args[:1] == ["--start"] and args[args.index("--producers"):][:2] == ["--producers", "4"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--values", "1,x"], "--values: expected comma-separated integers, got '1,x'"),
    (["--values", "0,2"], "--values: expected distinct positive integers, got '0,2'"),
    (["--values", "2,2"], "--values: expected distinct positive integers, got '2,2'"),
    (["--values", "1", "--runs", "0"], "--runs: expected at least 1, got 0"),
])
def test_bad_input_is_refused_and_nothing_is_written(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    assert sweep.main(["--axis", "producers", "--out", str(out), *argv]) == 1
    assert capsys.readouterr().err == f"python -m tools.bench.sweep: error: {message}\n"
    assert not out.exists()


def test_an_out_path_that_is_a_file_is_refused(tmp_path, capsys):
    out = tmp_path / "file"
    out.write_text("mine")
    assert sweep.main(["--axis", "size", "--values", "64", "--out", str(out)]) == 1
    assert "exists and is not a directory" in capsys.readouterr().err
    assert out.read_text() == "mine"


def test_an_unknown_axis_is_refused_by_the_parser(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        sweep.main(["--axis", "consumers", "--values", "1", "--out", str(tmp_path / "o")])
    assert exc.value.code == 2 and "invalid choice: 'consumers'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_peer_is_refused_by_the_parser(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        sweep.main(["--axis", "size", "--values", "64", "--out", str(tmp_path / "o"),
                    "--peer", "redis,mongo"])
    assert exc.value.code == 2 and "'mongo' is not a peer" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_sweep_with_the_sqlite_peer_measures_both_and_their_ratio(tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["--axis", "size", "--values", "64", "--runs", "1", "--out", str(out), "--peer", "sqlite",
            "--seconds", "1", "--warmup", "0.5", "--", "--interval", "1", "--batch", "8"]
    assert sweep.main(argv) == 0
    assert "[1/1] size 64 run 1: mqstore " in capsys.readouterr().out
    doc = json.loads((out / "size-64-1.json").read_text())
    assert sorted(doc["runs"]) == ["mqstore", "sqlite"] and "--peer sqlite" in doc["command"]
    (row,) = json.loads((out / "size.json").read_text())["rows"]
    assert row["sqlite"]["msgs_per_s"] > 0 and row["ratios"]["sqlite"] > 0
    assert "| mqstore / sqlite |" in (out / "size.md").read_text()


@pytest.mark.slow
def test_a_two_point_sweep_then_a_second_invocation_reuses_its_runs(tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["--axis", "producers", "--values", "1,2", "--runs", "1", "--out", str(out),
            "--seconds", "1", "--warmup", "0.5", "--", "--interval", "1", "--batch", "8"]
    assert sweep.main(argv) == 0
    first = capsys.readouterr().out
    assert "[1/2] producers 1 run 1: mqstore " in first and "[2/2] producers 2 run 1: mqstore " in first
    for value in (1, 2):
        doc = json.loads((out / f"producers-{value}-1.json").read_text())
        assert report.check_document(doc) == [] and doc["config"]["producers"] == value
        assert doc["config"]["batch"] == 8 and doc["config"]["size_bytes"] == 256
    rows = json.loads((out / "producers.json").read_text())["rows"]
    assert [row["value"] for row in rows] == [1, 2] and all(row["mqstore"]["msgs_per_s"] > 0 for row in rows)
    assert (out / "producers.md").read_text().startswith("| producers | 1 | 2 |")
    assert (out / "producers.png").stat().st_size > 0
    assert sweep.main(argv) == 0  # nothing left to run: both documents are kept
    assert capsys.readouterr().out.count("(kept from an earlier sweep)") == 2
    kept = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert sweep.main([*argv[:argv.index("--")], "--", "--batch", "4"]) == 1  # another command
    assert "producers-1-1.json was made by another command (mqstore --start " in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == kept


def test_arguments_the_bench_would_refuse_are_refused_before_anything_runs(tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["--axis", "size", "--values", "64,128", "--runs", "2", "--out", str(out), "--", "--queues", "0"]
    assert sweep.main(argv) == 1
    assert capsys.readouterr().err == ("python -m tools.bench.sweep: error: the bench refuses --size 64 "
                                       "with these arguments: invalid queues: must be >= 1\n")
    assert sweep.main(["--axis", "size", "--values", "16", "--out", str(out)]) == 1
    assert "refuses --size 16 with these arguments: invalid size: must be >= 24" in capsys.readouterr().err
    assert sweep.main(["--axis", "size", "--values", "64", "--out", str(out), "--", "--no-such-flag"]) == 1
    err = capsys.readouterr().err
    assert "unrecognized arguments: --no-such-flag" in err and "the bench refuses these arguments" in err
    assert not out.exists()


@pytest.mark.parametrize("flag", ["--size", "--json=x.json", "--store", "--seconds", "--peer"])
def test_flags_the_sweep_sets_itself_are_refused_after_the_separator(tmp_path, capsys, flag):
    out = tmp_path / "sweep"
    assert sweep.main(["--axis", "size", "--values", "64", "--out", str(out), "--", flag, "1"]) == 1
    assert capsys.readouterr().err.endswith(f"after --: {flag.split('=')[0]} is set by the sweep itself "
                                            "(see --help)\n")
    assert not out.exists()


def test_a_run_may_take_its_seconds_and_a_margin_per_backend(tmp_path):
    args, extra = sweep.parse_args(["--axis", "producers", "--values", "2,1", "--out", str(tmp_path / "o"),
                                    "--seconds", "30", "--warmup", "5", "--peer", "redis",
                                    "--", "--batch", "1"])
    values, common, timeout_s = sweep._check(args, extra)
    assert values == [1, 2] and timeout_s == 2 * (35 + sweep.RUN_MARGIN_S)
    assert common == ["--seconds", "30", "--warmup", "5", "--peer", "redis", "--batch", "1"]
