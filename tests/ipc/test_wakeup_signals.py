"""Wakeup.wait and signals: a real process asleep in a wait is interrupted by a real signal."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ipc.shm import issue_shm_token
from ipc.wakeup import WAIT_SLICE_S, Wakeup, supervisor_wakeup_name, unlink_all
from tests.conftest import REPO_ROOT

EXIT_DEADLINE_S = 10.0  # generous for a loaded machine; the handler runs within WAIT_SLICE_S

# The child opens the semaphore, installs the handlers, says "ready" and sleeps in one long wait.
CHILD = """
import signal, sys
from ipc.wakeup import Wakeup

def to_system_exit(signum, frame):
    raise SystemExit(7)

def note(signum, frame):
    print("handled", flush=True)

signal.signal(signal.SIGTERM, to_system_exit)
signal.signal(signal.SIGUSR1, note)
wakeup = Wakeup.open(sys.argv[1])
print("ready", flush=True)
print("woken", wakeup.wait(3600), flush=True)
"""


@pytest.fixture
def sleeper(tmp_path):
    """(the parent's Wakeup, the child asleep in its wait)."""
    issue_shm_token(tmp_path)
    wakeup = Wakeup.create(supervisor_wakeup_name(tmp_path))
    child = subprocess.Popen([sys.executable, "-c", CHILD, wakeup.name], cwd=REPO_ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert child.stdout.readline() == "ready\n"
        wait_until_asleep(child.pid)
        yield wakeup, child
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate()
        wakeup.close()
        unlink_all(tmp_path)


def wait_until_asleep(pid: int) -> None:
    """Until the process sleeps on a futex (sem_timedwait), so the signal lands inside the wait."""
    deadline = time.monotonic() + EXIT_DEADLINE_S
    while "futex" not in Path(f"/proc/{pid}/wchan").read_text():
        if time.monotonic() > deadline:
            pytest.fail(f"process {pid} never went to sleep in its wait")
        time.sleep(0.005)


def test_ctrl_c_raises_keyboard_interrupt_from_the_wait(sleeper):
    _, child = sleeper
    sent = time.monotonic()
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=EXIT_DEADLINE_S)
    assert time.monotonic() - sent < EXIT_DEADLINE_S
    assert child.returncode == -signal.SIGINT  # how Python exits after an unhandled KeyboardInterrupt
    assert err.rstrip().endswith("KeyboardInterrupt") and "in wait" in err, err


def test_a_handlers_system_exit_is_raised_not_swallowed(sleeper):
    """posix_ipc reports any exception but KeyboardInterrupt as SignalError: the wait used to
    return False and the handler's SystemExit was lost."""
    _, child = sleeper
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=EXIT_DEADLINE_S)
    assert child.returncode == 7, (out, err)
    assert "woken" not in out


def test_a_handler_that_returns_runs_during_the_wait_which_goes_on_to_its_post(sleeper):
    wakeup, child = sleeper
    child.send_signal(signal.SIGUSR1)
    assert child.stdout.readline() == "handled\n"  # ran while the child was in its wait
    wait_until_asleep(child.pid)  # and it went back to sleep rather than return early
    wakeup.post()
    out, _ = child.communicate(timeout=EXIT_DEADLINE_S)
    assert out == "woken True\n" and child.returncode == 0


def test_wait_times_out_in_slices_and_takes_a_pending_post_at_once(tmp_path):
    issue_shm_token(tmp_path)
    wakeup = Wakeup.create(supervisor_wakeup_name(tmp_path))
    try:
        started = time.monotonic()
        assert wakeup.wait(2.5 * WAIT_SLICE_S) is False
        assert time.monotonic() - started >= 2.5 * WAIT_SLICE_S
        wakeup.post()
        assert wakeup.wait(3600) is True and wakeup.wait(0) is False
    finally:
        wakeup.close()
        unlink_all(tmp_path)
