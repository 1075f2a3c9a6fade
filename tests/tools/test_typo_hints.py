"""A mistyped command or flag names the closest one under its command's usage, exit 2; `mqstore
--version` prints the version (tools.typo_hints, tools.cli)."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from tests.workers.store_harness import cli
from tools.cli import main, version_line
from tools.typo_hints import closest


def usage_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_a_mistyped_command_suggests_the_closest(capsys):
    err = usage_error(capsys, ["stauts"])
    assert "mqstore: error: unknown command 'stauts'; did you mean 'status'?" in err, err


def test_a_mistyped_delegated_command_suggests_it(capsys):
    assert "did you mean 'bench'?" in usage_error(capsys, ["bnech"])


def test_a_mistyped_flag_suggests_it_under_the_commands_usage(capsys):
    err = usage_error(capsys, ["status", "--jsno"])
    assert err.startswith("usage: mqstore status "), err
    assert "mqstore status: error: unrecognized arguments: --jsno; did you mean '--json'?" in err, err


def test_a_mistyped_flag_of_a_delegated_command_suggests_it(capsys):
    err = usage_error(capsys, ["bench", "--workdri", "/tmp"])
    assert err.startswith("usage: mqstore bench "), err
    assert "unrecognized arguments: --workdri /tmp; did you mean '--workdir'?" in err, err


def test_a_word_close_to_nothing_lists_the_commands_without_a_guess(capsys):
    err = usage_error(capsys, ["xyzzy"])
    assert "unknown command 'xyzzy' (commands: start, stop, status," in err and "did you mean" not in err


def test_closest_needs_a_close_match():
    assert closest("--jsno", ["--json", "--watch"]) == "--json"
    assert closest("--zzz", ["--json", "--watch"]) is None


def test_version_names_the_package_and_the_store_format(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out == version_line() + "\n"
    assert out.startswith(f"mqstore {version('mqstore')} (store format version "), out


@pytest.mark.slow
def test_the_installed_command_suggests_and_exits_2():
    for argv, words in ((("stauts",), "did you mean 'status'?"),
                        (("status", "--jsno"), "did you mean '--json'?")):
        result = cli(*argv)
        assert result.returncode == 2 and words in result.stderr.decode(), result.stderr.decode()
    result = cli("--version")
    assert result.returncode == 0 and result.stdout.decode().startswith("mqstore "), result
