"""RestartPolicy: backoff, jitter, budget, no-restart codes (fake clock, no sleeping)."""

import signal

import pytest

from workers.exit_codes import ExitCode, describe_exit, should_restart
from workers.restart_policy import RestartPolicy, RestartSettings


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def make_policy(**settings):
    clock = FakeClock()
    return RestartPolicy(RestartSettings(**settings), clock=clock, rng=lambda: 0.5), clock


def test_backoff_doubles_and_caps():
    policy, _ = make_policy(base_delay_s=0.1, max_delay_s=0.5, budget=100)
    delays = [policy.on_exit(-signal.SIGKILL, 0.1).delay_s for _ in range(5)]
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5])


def test_jitter_spreads_delay_within_bounds():
    low = RestartPolicy(RestartSettings(jitter=0.25), rng=lambda: 0.0).backoff_delay(1)
    high = RestartPolicy(RestartSettings(jitter=0.25), rng=lambda: 0.999999).backoff_delay(1)
    assert low == pytest.approx(0.075) and high == pytest.approx(0.125, rel=1e-3)


def test_budget_exceeded_gives_up_with_reason():
    policy, clock = make_policy(budget=5, window_s=30)
    for _ in range(5):
        assert policy.on_exit(ExitCode.CRASHED, 0.5).restart
        clock.now += 1
    decision = policy.on_exit(ExitCode.CRASHED, 0.5)
    assert not decision.restart
    assert "restart budget of 5 restarts in 30 s exceeded" in decision.reason


def test_budget_window_slides():
    policy, clock = make_policy(budget=2, window_s=10)
    assert policy.on_exit(1, 0.1).restart
    assert policy.on_exit(1, 0.1).restart
    clock.now += 11
    assert policy.on_exit(1, 0.1).restart


def test_healthy_run_resets_backoff():
    policy, _ = make_policy(base_delay_s=0.1, healthy_after_s=5, budget=100)
    policy.on_exit(1, 0.1)
    policy.on_exit(1, 0.1)
    assert policy.on_exit(1, 60.0).delay_s == pytest.approx(0.1)


@pytest.mark.parametrize("code", [ExitCode.BOOT_FAILED, ExitCode.STORE_CORRUPT, ExitCode.USAGE])
def test_no_restart_codes_are_not_restarted(code):
    policy, _ = make_policy()
    decision = policy.on_exit(code, 0.1)
    assert not decision.restart and code.name in decision.reason
    assert policy.restart_count == 0


def test_exit_code_contract():
    assert should_restart(-signal.SIGKILL) and should_restart(ExitCode.CRASHED) and should_restart(77)
    assert not should_restart(ExitCode.OK) and not should_restart(ExitCode.ORPHANED)
    assert "perhaps out of memory" in describe_exit(-signal.SIGKILL)
    assert describe_exit(3) == "exited with 3 (BOOT_FAILED)"


def test_a_kill_of_the_supervisors_own_is_described_by_its_reason():
    words = describe_exit(-signal.SIGKILL, "hung: no heartbeat for 10.2 s")
    assert words == "killed by the supervisor with SIGKILL (hung: no heartbeat for 10.2 s)"
    assert describe_exit(ExitCode.CRASHED, "hung: no heartbeat for 10.2 s") == "exited with 1 (CRASHED)"
    decision = RestartPolicy(RestartSettings()).on_exit(-signal.SIGKILL, 1.0, "hung: still booting")
    assert decision.restart and "perhaps out of memory" not in decision.reason
    assert "killed by the supervisor with SIGKILL (hung: still booting)" in decision.reason
