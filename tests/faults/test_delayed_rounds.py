"""`mqstore torture --fault delayed`: kills of the supervisor (with every child) and of a child
while delayed messages fall due; every acknowledged one is delivered once, never early, and
check is empty (tools.torture.delayed_rounds)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from workers.child_env import REPO_ROOT, child_env


@pytest.mark.slow
def test_delayed_rounds_via_cli_deliver_every_acknowledged_message_once_never_early(tmp_path):
    out = tmp_path / "figures.json"
    result = subprocess.run(
        [sys.executable, "-m", "tools.cli", "torture", "--store", str(tmp_path / "store"), "--rounds", "2",
         "--fault", "delayed", "--target", "supervisor", "--seed", "11", "--json", str(out)],
        cwd=REPO_ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "torture seed 11" in result.stdout and "PASSED" in result.stdout
    figures = json.loads(out.read_text())
    assert figures["failure"] is None and figures["kills"] == {"supervisor": 2}
    assert figures["acked"] == figures["delivered"] == 400
