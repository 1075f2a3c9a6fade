"""AsyncConsumer: `async for message in consumer.messages(topic)` for asyncio code.

    async with AsyncConsumer("./data", "billing") as consumer:
        async for record in consumer.messages("orders"):  # follows the topic until broken off
            ...

It reads the store's files as ipc.consumer.Consumer does (it is one, read-only mappings, no
round trip): each sweep over the topic's queues runs on the loop's thread, as Consumer.iterate
without `follow` (committed offsets, order per queue, auto commit), and its reads are memory
reads. Between sweeps that found nothing it long-polls for more: Consumer.wait_for_more in
this consumer's one helper thread (`loop.run_in_executor` on a one-thread executor), at most
one wait at a time and never one per message, since the dispatcher's wake-up is a POSIX
semaphore the loop cannot poll (docs/DESIGN.md, "Processes", asyncio clients). Each wait lasts
at most `poll_timeout_ms`, so a cancelled iteration leaves a wait that ends within that;
`aclose()` waits for it before closing the Consumer, which is not thread-safe.

What still runs on the loop's thread: the offsets file's atomic replace at the end of each
sweep that moved (as `iterate` writes before each long poll), and, if the supervisor is found
gone in a sweep, Consumer's wait for the next one (up to `reattach_timeout_s`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from engine.errors import BadInputError, StoreClosedError
from engine.formats.record import Record
from ipc.consumer import DEFAULT_COMMIT_INTERVAL_MS, DEFAULT_MAX_COUNT, Consumer
from ipc.reattach import DEFAULT_REATTACH_TIMEOUT_S

MAX_POLL_TIMEOUT_MS = 60_000  # one helper-thread wait; cancellation and aclose() wait for it at most


class AsyncConsumer:
    """A Consumer whose iteration awaits new messages instead of blocking the loop; use it as
    `async with` inside a running loop, with one `messages()` iteration at a time."""

    def __init__(self, store_dir: str | os.PathLike, group: str, *,
                 reattach_timeout_s: float = DEFAULT_REATTACH_TIMEOUT_S):
        self._loop = asyncio.get_running_loop()  # RuntimeError outside a loop, before attaching
        self._consumer = Consumer(store_dir, group, reattach_timeout_s=reattach_timeout_s)
        self._waiter_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mqstore-async-consumer")
        self._wait: asyncio.Future | None = None  # the helper thread's wait, while one runs
        self._closed = False

    @property
    def consumer(self) -> Consumer:
        """The underlying Consumer (pull, commit, committed); not while `messages()` runs."""
        return self._consumer

    async def messages(self, topic: str, *, follow: bool = True, poll_timeout_ms: int = 1000,
                       max_count: int = DEFAULT_MAX_COUNT,
                       commit_interval_ms: int = DEFAULT_COMMIT_INTERVAL_MS) -> AsyncIterator[Record]:
        """Every message of `topic` across its queues from the committed offsets, in order per
        queue, committing as Consumer.iterate does; with `follow` (the default) it waits for
        more until the caller breaks off, else it ends once every queue is drained."""
        if not isinstance(poll_timeout_ms, int) or isinstance(poll_timeout_ms, bool) \
                or not 1 <= poll_timeout_ms <= MAX_POLL_TIMEOUT_MS:
            raise BadInputError("poll_timeout_ms", f"{poll_timeout_ms!r} is not an int in "
                                f"[1, {MAX_POLL_TIMEOUT_MS}]")
        if self._closed:
            raise StoreClosedError("the async consumer is closed", path=str(self._consumer.root))
        await self._finish_wait()  # a cancelled iteration's wait still owns the Consumer
        while True:
            bound = self._consumer.dispatched_pos
            sweep = self._consumer.iterate(topic, max_count=max_count, commit_interval_ms=commit_interval_ms)
            with contextlib.closing(sweep):  # a break ends the sweep: its offsets are written
                for record in sweep:
                    yield record
            if not follow:
                return
            await self._long_poll(bound, poll_timeout_ms)

    async def _long_poll(self, bound: int, timeout_ms: int) -> None:
        """Wait in the helper thread until the dispatched position passes `bound` or the
        timeout ends; a cancellation leaves the wait to end on its own (see _finish_wait)."""
        self._wait = self._loop.run_in_executor(self._waiter_thread, self._consumer.wait_for_more,
                                                bound, timeout_ms)
        await asyncio.shield(self._wait)
        self._wait = None

    async def _finish_wait(self) -> None:
        """Let a wait a cancelled iteration left behind end (within its poll timeout)."""
        if self._wait is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._wait)
            self._wait = None

    async def aclose(self) -> None:
        """Write the consumed offsets and close, after any wait still running. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._finish_wait()
        self._waiter_thread.shutdown(wait=True)
        self._consumer.close()

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()
