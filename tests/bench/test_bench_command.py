"""`mqstore bench` reaches the bench's own parser through the CLI's delegation (tools.cli)."""

from __future__ import annotations

import pytest

from tools.cli import main


def test_mqstore_bench_help_is_the_bench_parser(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: mqstore bench")
    assert "--producers" in out


def test_mqstore_bench_refuses_an_unknown_schedule_before_starting_anything(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--start", "--workdir", str(tmp_path), "--schedule", "bursty"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'bursty'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flags", [("--start",), ("--disk",)])
def test_mqstore_bench_refuses_a_missing_workdir_naming_it(tmp_path, capsys, flags):
    missing = tmp_path / "no-such-dir"
    assert main(["bench", *flags, "--workdir", str(missing), "--seconds", "1"]) == 2
    err = capsys.readouterr().err
    assert err == f"mqstore: error: invalid --workdir: {missing} is not a directory (create it first: " \
                  "the bench puts its temp directories inside it)\n", err
    assert "Errno" not in err and list(tmp_path.iterdir()) == []
