"""Send-and-wait rate of the asyncio producer against the threaded one, on a store this probe
starts (sync flush, the defaults): P producer processes each keep C sends in flight, every one
awaited (`await AsyncProducer.send`) or waited for in its own thread (`Producer.send`), for
--seconds after --warmup; the modes alternate run by run.

    .venv/bin/python -m tools.bench.probes.async_send [--producers 4] [--size 256]
        [--modes threads:1,threads:64,asyncio:64,uvloop:64] [--seconds 5] [--warmup 1] [--runs 3]

`threads:1` is `mqstore bench --batch 1`'s shape (one blocking send at a time per producer);
`asyncio:64` is the issue's asyncio producer with 64 concurrent sends. Prints each mode's
acknowledged messages/s and producer CPU per message (all P processes), medians of --runs, and
each asyncio mode's ratio to each threads mode.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import tempfile
import threading
import time
from pathlib import Path

from ipc.async_producer import AsyncProducer
from ipc.producer import Producer
from tools.store_process import StoreProcess, write_store_config

TOPIC = "ASYNC-PROBE"
DEFAULT_MODES = "threads:1,threads:64,asyncio:64,uvloop:64"
START_DELAY_S = 1.0  # the workers attach before this; they all start sending together after it


def _threaded_acks(store: Path, body: bytes, concurrency: int, start: float, warm: float,
                   end: float) -> int:
    """PUT_OK answers inside [warm, end) of `concurrency` threads each sending and waiting."""
    counts = [0] * concurrency
    with Producer(store) as producer:
        def loop(index: int) -> None:
            while time.monotonic() < start:
                time.sleep(0.001)
            while (now := time.monotonic()) < end:
                if producer.send(TOPIC, body).ok and now >= warm:
                    counts[index] += 1

        threads = [threading.Thread(target=loop, args=(i,)) for i in range(concurrency)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return sum(counts)


async def _async_acks(store: Path, body: bytes, concurrency: int, start: float, warm: float,
                      end: float) -> int:
    """PUT_OK answers inside [warm, end) of `concurrency` tasks each awaiting its send."""
    acks = 0
    async with AsyncProducer(store) as producer:
        async def loop() -> None:
            nonlocal acks
            while (now := time.monotonic()) < end:
                if (await producer.send(TOPIC, body)).ok and now >= warm:
                    acks += 1

        await asyncio.sleep(max(0.0, start - time.monotonic()))
        await asyncio.gather(*(loop() for _ in range(concurrency)))
    return acks


def _worker(mode: str, concurrency: int, store: Path, body: bytes, start: float, warm: float,
            end: float) -> int:
    if mode == "threads":
        return _threaded_acks(store, body, concurrency, start, warm, end)
    coroutine = _async_acks(store, body, concurrency, start, warm, end)
    if mode == "uvloop":
        import uvloop

        return uvloop.run(coroutine)
    return asyncio.run(coroutine)


def run_once(store: Path, mode: str, concurrency: int, producers: int, size_bytes: int,
             seconds: float, warmup_s: float) -> tuple[float, float]:
    """(acknowledged messages/s, producer CPU us per acknowledged message) of `producers`
    forked worker processes in one mode; the CPU counts the warm-up and attaching too."""
    start = time.monotonic() + START_DELAY_S
    warm, end = start + warmup_s, start + warmup_s + seconds
    body = b"x" * size_bytes
    children = []
    for _ in range(producers):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: one producer, its count down the pipe
            os.close(read_fd)
            code = 1
            try:
                acks = _worker(mode, concurrency, store, body, start, warm, end)
                usage = resource.getrusage(resource.RUSAGE_SELF)
                os.write(write_fd, f"{acks} {usage.ru_utime + usage.ru_stime}".encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write_fd)
        children.append((pid, read_fd))
    acks, cpu_s = 0, 0.0
    for pid, read_fd in children:
        with os.fdopen(read_fd, "rb") as reader:
            text = reader.read()
        _, status = os.waitpid(pid, 0)
        if status != 0 or not text:
            raise RuntimeError(f"producer process {pid} failed (wait status {status})")
        child_acks, child_cpu_s = text.split()
        acks, cpu_s = acks + int(child_acks), cpu_s + float(child_cpu_s)
    return acks / seconds, cpu_s * 1e6 / max(acks, 1)


def parse_modes(text: str) -> list[tuple[str, int]]:
    modes = []
    for part in text.split(","):
        name, _, concurrency = part.partition(":")
        if name not in ("threads", "asyncio", "uvloop") or not concurrency.isdigit() or int(concurrency) < 1:
            raise argparse.ArgumentTypeError(f"{part!r} is not MODE:N with MODE threads, asyncio or uvloop")
        modes.append((name, int(concurrency)))
    return modes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.probes.async_send", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--size", type=int, default=256, help="body bytes")
    parser.add_argument("--modes", type=parse_modes, default=parse_modes(DEFAULT_MODES))
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    rates: dict[str, list[float]] = {f"{m}:{c}": [] for m, c in args.modes}
    cpus: dict[str, list[float]] = {name: [] for name in rates}
    with tempfile.TemporaryDirectory(prefix="mqstore-async-probe-") as work:
        root = Path(work) / "store"
        config = write_store_config(Path(work) / "probe.toml", {})
        process = StoreProcess(root, config, Path(work) / "store.log")
        process.start()
        try:
            process.wait_ready()
            for run in range(args.runs):
                for mode, concurrency in args.modes:
                    rate, cpu_us = run_once(root, mode, concurrency, args.producers, args.size,
                                            args.seconds, args.warmup)
                    rates[f"{mode}:{concurrency}"].append(rate)
                    cpus[f"{mode}:{concurrency}"].append(cpu_us)
                    print(f"run {run + 1} {mode}:{concurrency}: {rate:,.0f} msg/s, "
                          f"{cpu_us:.1f} us producer CPU a message", flush=True)
        finally:
            process.stop()
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name, median in medians.items():
        print(f"{name}: median {median:,.0f} msg/s, {statistics.median(cpus[name]):.1f} us producer CPU "
              f"a message, of {len(rates[name])} runs")
    for name, median in medians.items():
        if name.startswith("threads"):
            continue
        for base, base_median in medians.items():
            if base.startswith("threads") and base_median:
                print(f"{name} / {base}: {median / base_median:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
