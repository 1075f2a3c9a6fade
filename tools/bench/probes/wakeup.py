"""What one cross-process wake-up costs on this machine: two processes hand a token back and forth
through two POSIX semaphores (ipc.wakeup.Wakeup, as a producer and the supervisor do), first
free to run on any CPU, then both pinned to one CPU.

    .venv/bin/python -m tools.bench.probes.wakeup [--rounds 20000] [--runs 3]

Prints the round trip and the time inside post() (sem_post), medians of --runs. On a VM, a wake
of a process asleep on another virtual CPU can cost tens of microseconds (the host must wake that
vCPU); on one CPU it is a plain context switch.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import time

from ipc.wakeup import Wakeup

NAME_PREFIX = "/mqstore-bench-wakeup-"


def ping_pong(rounds: int, cpu: int | None) -> tuple[float, float]:
    """(round trip us, post us) of `rounds` hand-offs; both processes on `cpu` if given."""
    tag = f"{NAME_PREFIX}{os.getpid()}"
    there, back = Wakeup.create(tag + "-a"), Wakeup.create(tag + "-b")
    allowed = os.sched_getaffinity(0)
    child = None
    try:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        child = os.fork()
        if child == 0:
            _echo(there, back, rounds, os.getppid())
        post_ns = 0
        start = time.perf_counter_ns()
        for _ in range(rounds):
            before = time.perf_counter_ns()
            there.post()
            post_ns += time.perf_counter_ns() - before
            while not back.wait(1.0):
                if os.waitpid(child, os.WNOHANG) != (0, 0):
                    raise RuntimeError("the echoing process died")
        elapsed_ns = time.perf_counter_ns() - start
        os.waitpid(child, 0)
        child = None
    finally:
        if child:  # interrupted or failed: do not leave the echo behind
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
        os.sched_setaffinity(0, allowed)
        for wakeup in (there, back):
            wakeup.close()
            wakeup.unlink()
    return elapsed_ns / rounds / 1000, post_ns / rounds / 1000


def _echo(there: Wakeup, back: Wakeup, rounds: int, parent_pid: int) -> None:
    """The forked side: answer each post with one; exits if the parent goes."""
    try:
        for _ in range(rounds):
            while not there.wait(1.0):
                if os.getppid() != parent_pid:
                    return
            back.post()
    finally:
        os._exit(0)


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    out: dict[str, dict[str, float]] = {}
    for label, cpu in (("any CPU", None), ("one CPU", min(os.sched_getaffinity(0)))):
        runs = [ping_pong(args.rounds, cpu) for _ in range(args.runs)]
        trip = statistics.median(r[0] for r in runs)
        post = statistics.median(r[1] for r in runs)
        print(f"{label:8s} round trip {trip:6.1f} us   post {post:5.1f} us   "
              f"(median of {args.runs} x {args.rounds})")
        out[label] = {"round_trip_us": trip, "post_us": post}
    return out


if __name__ == "__main__":
    main()
