"""AsyncProducer: awaitable sends for asyncio code, over one ipc.producer.Producer.

    async with AsyncProducer("./data") as producer:
        result = await producer.send("orders", b"...", keys="order-42")
        results = await asyncio.gather(*(producer.send("orders", b) for b in bodies))
        batch = await producer.send_columns("orders", bodies)  # a BatchResult

How the loop learns of an answer: the Producer's one sender thread (ipc.slot_sender) waits on
the slot's POSIX semaphore, as for send_async, and resolves the call's Future there; that
thread hands every answer it resolves to this producer's completion queue and, when the queue
was empty, wakes the loop once with call_soon_threadsafe, which writes the loop's own wake-up
fd (asyncio's self-pipe, uvloop's async handle: fds the loop polls). One thread per producer, never one
per pending call; many answers of one request cost one wake-up of the loop. The supervisor's
answer wake-up stays a semaphore: an eventfd per slot would need the supervisor to hold each
producer's fd (docs/DESIGN.md, "Processes", asyncio clients).

Nothing blocks the loop beyond encoding: the queue ahead of the sender thread is bounded by
`max_pending_bytes`, and a send that finds it full answers OS_PAGE_CACHE_BUSY (not stored) at
once instead of waiting for room.

How sends reach the sender thread: each is checked and encoded whole before `send` first
yields, and the sends of one loop turn are handed over together at the turn's end (one
enqueue, one wake-up of the thread), so one request carries them all.

Cancellation: the hand-over runs whether or not the await was cancelled, and the sender thread
publishes a request only when it is complete, so a cancelled `await` never leaves a
half-written slot. The send goes on: it is stored (its result, arriving later, is dropped;
logged at WARNING when it is not PUT_OK) or, if the supervisor dies first, OUTCOME_UNKNOWN as
for any send. `flush()` waits for every send of this producer, cancelled ones included;
`aclose()` flushes and gives the slot back.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future

from engine.errors import StoreClosedError
from engine.message import Message
from engine.status import PutResult, PutStatus
from ipc.batch_result import BatchResult
from ipc.producer import DEFAULT_MAX_PENDING_BYTES, Producer
from ipc.reattach import DEFAULT_REATTACH_TIMEOUT_S
from ipc.slot_sender import Pending, SlotSender

log = logging.getLogger(__name__)


class _Completions:
    """Resolved sender-thread Futures on their way to the loop: one wake-up per burst."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._lock = threading.Lock()
        self._done: collections.deque[tuple[Future, asyncio.Future]] = collections.deque()
        self.unanswered = 0  # sends watched and not yet settled, cancelled ones too (loop thread only)
        self.all_answered = asyncio.Event()
        self.all_answered.set()

    def watch(self, future: Future, waiter: asyncio.Future) -> None:
        """Settle `waiter` from `future` on the loop once `future` resolves (in any thread)."""
        self.unanswered += 1
        self.all_answered.clear()
        future.add_done_callback(lambda resolved: self._arrived(resolved, waiter))

    def _arrived(self, future: Future, waiter: asyncio.Future) -> None:
        with self._lock:
            first = not self._done
            self._done.append((future, waiter))
        if first:
            try:
                self._loop.call_soon_threadsafe(self._settle_all)
            except RuntimeError:  # the loop is closed: nobody awaits these answers any more
                log.warning("an asyncio send was answered after its event loop closed")

    def _settle_all(self) -> None:
        with self._lock:
            done, self._done = self._done, collections.deque()
        for future, waiter in done:
            _settle(future, waiter)
        self.unanswered -= len(done)
        if not self.unanswered:
            self.all_answered.set()


def _settle(future: Future, waiter: asyncio.Future) -> None:
    """Pass `future`'s outcome to `waiter`; a cancelled waiter's result is dropped (logged
    when it is not a success: nobody else will see that status)."""
    try:
        result = future.result()
    except Exception as exc:  # the send's own error (a bug: its statuses are results)
        if waiter.cancelled():
            log.warning("a cancelled asyncio send failed: %s", exc)
        else:
            waiter.set_exception(exc)
        return
    if not waiter.cancelled():
        waiter.set_result(result)
    elif not (result.ok if hasattr(result, "ok") else all(r.ok for r in result)):  # send_batch: a list
        log.warning("a cancelled asyncio send was answered %s", result)


class AsyncProducer:
    """Awaitable sends over one Producer (one mailbox slot, one sender thread); use it as
    `async with` inside a running loop. Not for use from several loops at once."""

    def __init__(self, store_dir: str | os.PathLike, *,
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
                 reattach_timeout_s: float = DEFAULT_REATTACH_TIMEOUT_S):
        self._loop = asyncio.get_running_loop()  # RuntimeError outside a loop, before attaching
        self._producer = Producer(store_dir, max_pending_bytes=max_pending_bytes, enqueue_timeout_s=0,
                                  reattach_timeout_s=reattach_timeout_s)
        self._completions = _Completions(self._loop)
        self._turn: list[Pending] = []  # records of this loop turn's sends, handed over at its end
        self._closed = False

    @property
    def producer(self) -> Producer:
        """The underlying blocking Producer (its info, its blocking calls)."""
        return self._producer

    async def send(self, topic: str, body: bytes, *, tags: str | None = None,
                   keys: Iterable[str] | str = (), queue_id: int | None = None,
                   properties: Mapping[str, str] | None = None, wait: bool = True) -> PutResult:
        """Producer.send, awaited: a bad message gets its status (MESSAGE_ILLEGAL, ...) with
        nothing sent; PUT_OK after the flush under sync."""
        return await self._await(self._open()._submit_one(topic, body, tags, keys, queue_id, properties,
                                                           wait, self._hand_over))

    async def send_batch(self, messages: Sequence[Message]) -> list[PutResult]:
        """Producer.send_batch, awaited: one result per message, in order."""
        return await self._await(self._open()._send_batch(messages, self._hand_over))

    async def send_columns(self, topic: str, bodies: Sequence[bytes], *,
                           keys: Sequence[str] | None = None, tags: str | None = None,
                           queue_ids: Sequence[int] | int | None = None) -> BatchResult:
        """Producer.send_columns, awaited; bad columns raise BadInputError before anything is sent."""
        return await self._await(self._open()._columns_future(topic, bodies, keys, tags, queue_ids,
                                                               self._hand_over))

    def _open(self) -> Producer:
        if self._closed:
            raise StoreClosedError("the async producer is closed", path=str(self._producer.root))
        return self._producer

    def _hand_over(self, pendings: list[Pending]) -> None:
        """Keep a send's encoded records for the end of this loop turn (see _hand_over_turn)."""
        if not self._turn:
            self._loop.call_soon(self._hand_over_turn)
        self._turn += pendings

    def _hand_over_turn(self) -> None:
        """Give the sender thread every send of the loop turn in one enqueue, one wake-up:
        handed over one by one, the thread woken by the first would send it alone and the
        others would wait a whole round trip behind it."""
        turn, self._turn = self._turn, []
        try:
            self._producer._live_sender().enqueue(turn)
        except Exception as exc:  # a Future never resolved would hang its await and flush()
            log.exception("an asyncio producer's hand-over failed")
            for pending in turn:
                SlotSender.fail_pending(pending, PutStatus.UNKNOWN_ERROR, str(exc))

    async def _await(self, future: Future):
        """The result of a send already handed to the sender thread; cancelling the await
        leaves the send to finish (see the module docstring)."""
        waiter = self._loop.create_future()
        self._completions.watch(future, waiter)
        return await waiter

    async def flush(self) -> None:
        """Wait until every send of this producer was answered, cancelled ones included."""
        await self._completions.all_answered.wait()

    async def aclose(self) -> None:
        """Flush, then give the slot back and stop the sender thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.flush()
        finally:  # flushed, it returns at once; cancelled, it sends what is queued first
            self._producer.close()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()
