"""Kill rounds: SIGKILL each process of a running store under load, verify against the ledger.

Each test is a short torture run (tools.torture.rounds): a few rounds, a few kills per round,
real processes, real fsync, real shared memory; every round ends with check(root) == [] and
every acknowledged message present exactly once, in its queue, at its offset, with its body,
keys and tags, and findable through the index.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.faults.fault_harness import assert_passed, run_torture, scaled
from workers.child_env import REPO_ROOT, child_env

# kills per round: the supervisor's restart is what the test is about; a child's or a
# producer's restart is cheaper than the store start and stop around it, so 2 rounds x 1 kill
KILLS_PER_ROUND = {"supervisor": 2, "dispatcher": 1, "index": 1, "producer": 1}


@pytest.mark.slow
@pytest.mark.parametrize("target", ["supervisor", "dispatcher", "index", "producer"])
def test_kill_rounds_sync_flush_lose_nothing(tmp_path, target):
    figures = run_torture(tmp_path, target=target, rounds=scaled(2),
                          kills_per_round=KILLS_PER_ROUND[target], acks_before_kill=(10, 150))
    assert_passed(figures)
    assert figures.kills[target] == scaled(2) * KILLS_PER_ROUND[target]
    assert figures.acked > 0 and figures.timed_out == 0
    assert len(figures.recovery_ms) == figures.kills[target]
    assert "unprovoked child" not in figures.restarts  # no child crashed by itself


@pytest.mark.slow
def test_random_kills_async_flush_via_cli(tmp_path):
    """`python -m tools.torture run` (what `mqstore torture` runs): async flush, random targets;
    a kill (not a power loss) loses nothing even under async flush."""
    out = tmp_path / "figures.json"
    result = subprocess.run(
        [sys.executable, "-m", "tools.torture", "run", "--store", str(tmp_path / "store"),
         "--rounds", str(scaled(1)), "--kills-per-round", "2", "--target", "random",
         "--flush", "async", "--seed", "7", "--acks-before-kill", "10,150", "--json", str(out)],
        cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "torture seed 7" in result.stdout and "PASSED" in result.stdout
    run = json.loads(out.read_text())["runs"][0]
    assert run["passed"] and run["seed"] == 7 and run["flush"] == "async"
    assert run["lost"] == run["duplicated"] == run["lost_unflushed"] == 0
    assert sum(run["kills"].values()) == scaled(1) * 2
    assert run["recovery_ms"]["count"] == sum(run["kills"].values())


@pytest.mark.slow
def test_offsets_fault_tears_offsets_and_backdates_mtimes_and_loses_nothing(tmp_path):
    """`--fault offsets`: consumer processes commit, the supervisor is killed, consumerOffset.json
    is torn and every segment's mtime set to 1970 (retention's time trigger holds, and a pass
    runs after each restart); every restart's first consumer falls back to the backup with its
    WARNING (stderr and mqstore.log) and its count, no offset ends below the backup's, and
    nothing acknowledged is lost (retention goes by the records' store times)."""
    figures = run_torture(tmp_path, target="supervisor", fault="offsets", rounds=scaled(1),
                          kills_per_round=1, acks_before_kill=(10, 60))
    assert_passed(figures)
    kills = scaled(1)  # one kill per round keeps it short; `mqstore torture` runs many
    assert figures.offset_damages == figures.offset_fallbacks == kills
    assert figures.consumer_runs >= kills * 6 and figures.segments_backdated > 0


def test_torture_parser_for_the_mqstore_cli():
    """What the lead wires into tools/cli.py: `mqstore torture ...` parses to run_torture."""
    import argparse

    from tools.torture.cli import add_torture_parser, run_torture, settings_from_args
    from tools.torture.faults import Tear

    parser = argparse.ArgumentParser(prog="mqstore")
    add_torture_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["torture", "--store", "DIR", "--rounds", "3", "--target", "index",
                              "--flush", "async", "--json", "out.json", "--seed", "9"])
    assert args.func is run_torture and (args.rounds, args.target, args.flush) == (3, "index", "async")
    settings = settings_from_args(args)
    assert (settings.seed, settings.fault, settings.tear) == (9, "kill", Tear.PAGE)
    wrong = parser.parse_args(["torture", "--store", "DIR", "--target", "index", "--fault",
                               "power-loss"])
    assert run_torture(wrong) == 2  # a power loss needs the supervisor (or random) as target
    for fault in ("offsets", "power-loss"):
        wrong = parser.parse_args(["torture", "--store", "DIR", "--target", "index", "--fault", fault])
        assert run_torture(wrong) == 2
