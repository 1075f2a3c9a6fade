"""Consistent multi-word reads of a value with exactly one writer (a seqlock), and memory fences.

Layout of one seqlocked group at `offset` (offset must be a multiple of 8):

    offset      size  field
    +0          8     seq      uint64 little-endian; odd while a write is in progress
    +8          n     payload  any struct.Struct (little-endian, '<' formats)

Writer: seq -> odd, payload, seq -> even. Reader: read seq, payload, seq again; accept when
both reads are the same even number, else retry (a few spins, then os.sched_yield).

Memory ordering -- what we rely on:

* Word atomicity. Every word is written by CPython's struct module, which on little-endian
  hosts packs '<' integers with a native memcpy; an aligned 8-byte memcpy compiles to one
  load/store. Aligned 8-byte accesses are single-copy atomic on x86-64 and arm64, so a lone
  int64 is never torn. This is practice, not a guarantee of the C standard.
* Ordering. A seqlock needs stores kept in order on the writer side and loads in order on the
  reader side. x86-64 is TSO: the hardware never reorders store/store or load/load, and the
  interpreter cannot reorder accesses across its opaque C calls, so `order_fence()` is a
  no-op there. Weakly ordered CPUs (arm64, POWER) do reorder, and Python has no fence
  instruction; there `order_fence()` calls libatomic's `atomic_thread_fence(seq_cst)` through
  ctypes (about 0.3 us). Without libatomic on such a CPU every fence raises StoreError rather
  than run unordered.
* `fence()` is a full barrier (store->load included), needed where two processes each write
  one flag and then read the other's (the consumer wait / notify handshake). On x86 it is
  libatomic's mfence, or, without libatomic, an uncontended threading.Lock round trip (a
  LOCK-prefixed CAS in glibc, which is a full barrier on x86).
* Semaphores. sem_post is a release and sem_wait an acquire: everything written before a post
  is visible after the matching wait, on any CPU. Hand-offs that wake a sleeper rely on that.

A writer that dies mid-write leaves seq odd. Readers give up after `timeout_s` with a
StoreError; the group's next writer (the restarted process) repairs it on its first write.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence

from engine.errors import StoreError

SEQ = struct.Struct("<Q")
SEQ_SIZE = SEQ.size
assert SEQ_SIZE == 8
SPIN_COUNT = 64
DEFAULT_READ_TIMEOUT_S = 1.0
_TSO_MACHINES = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})
_SEQ_CST = 5  # memory_order_seq_cst in C11 <stdatomic.h>
IS_TSO = platform.machine().lower() in _TSO_MACHINES


def _missing_fence() -> None:
    raise StoreError(f"no memory fence is available on {platform.machine()}",
                     hint="install libatomic (package libatomic1)")


def _load_fence() -> tuple[Callable[[], None], str]:
    try:
        thread_fence = ctypes.CDLL("libatomic.so.1").atomic_thread_fence
    except (OSError, AttributeError):
        thread_fence = None
    if thread_fence is not None:
        thread_fence.argtypes = [ctypes.c_int]
        thread_fence.restype = None

        def libatomic_fence() -> None:
            """Full memory barrier: libatomic atomic_thread_fence(seq_cst)."""
            thread_fence(_SEQ_CST)

        return libatomic_fence, "libatomic"
    if IS_TSO:
        lock = threading.Lock()

        def lock_fence() -> None:
            """Full memory barrier on x86: a LOCK-prefixed CAS inside sem_wait/sem_post."""
            lock.acquire()
            lock.release()

        return lock_fence, "lock"
    return _missing_fence, "missing"


def _no_fence() -> None:
    return None


fence, FENCE_KIND = _load_fence()  # FENCE_KIND: "libatomic", "lock" (x86 only) or "missing"
order_fence = _no_fence if IS_TSO else fence


def store_word(buf: memoryview, offset: int, value: int, code: str = "Q") -> None:
    """Write one aligned little-endian word with a single store.

    struct.pack_into zeroes its destination before writing the value, so a reader on another
    core can see 0 mid-write (a heartbeat of 0, a sequence word of 0 that makes a torn payload
    look consistent). Item assignment on a cast memoryview is one fixed-size memcpy, which
    compiles to a single aligned store."""
    size_bytes = _WORD_SIZES[code]
    if offset % size_bytes:
        raise ValueError(f"word offset {offset} is not {size_bytes}-byte aligned")
    if sys.byteorder != "little":  # layouts are little-endian; no single-store path here
        struct.pack_into("<" + code, buf, offset, value)
        return
    words = buf[offset:offset + size_bytes].cast(code)
    words[0] = value
    words.release()


_WORD_SIZES = {"Q": 8, "q": 8, "I": 4, "i": 4}


def seqlock_size(layout: struct.Struct) -> int:
    """Bytes one group of `layout` occupies, sequence word included."""
    return SEQ_SIZE + layout.size


def write_locked(buf: memoryview, offset: int, layout: struct.Struct,
                 values: Sequence[int]) -> None:
    """Publish `values` as one consistent group. Only the group's single writer may call this."""
    if offset & 7:
        raise ValueError(f"seqlock offset {offset} is not 8-byte aligned")
    (seq,) = SEQ.unpack_from(buf, offset)
    odd = seq if seq & 1 else seq + 1  # odd already: the previous writer died mid-write
    store_word(buf, offset, odd)
    order_fence()
    layout.pack_into(buf, offset + SEQ_SIZE, *values)
    order_fence()
    store_word(buf, offset, odd + 1)


def read_unlocked(buf: memoryview, offset: int, layout: struct.Struct) -> tuple:
    """The payload without checking the sequence: only for the group's own writer."""
    return layout.unpack_from(buf, offset + SEQ_SIZE)


def read_consistent(buf: memoryview, offset: int, layout: struct.Struct, *,
                    timeout_s: float = DEFAULT_READ_TIMEOUT_S) -> tuple:
    """Read the group so that every field comes from the same write.

    Retries while a write is in progress; raises StoreError if one write stays in progress
    (the same odd sequence) for `timeout_s`, which means its writer died mid-write."""
    for _ in range(SPIN_COUNT):
        values = _try_read(buf, offset, layout)
        if values is not None:
            return values
    stuck_seq, stuck_since_ns = -1, 0
    while True:
        os.sched_yield()
        values = _try_read(buf, offset, layout)
        if values is not None:
            return values
        (seq,) = SEQ.unpack_from(buf, offset)
        now_ns = time.monotonic_ns()
        if seq != stuck_seq:
            stuck_seq, stuck_since_ns = seq, now_ns
        elif seq & 1 and now_ns - stuck_since_ns > timeout_s * 1e9:
            raise StoreError(f"value at shared offset {offset} stayed mid-update for "
                             f"{timeout_s}s", hint="its writer died mid-write; the restarted "
                             "writer repairs it on its first publish")


def _try_read(buf: memoryview, offset: int, layout: struct.Struct) -> tuple | None:
    (seq_before,) = SEQ.unpack_from(buf, offset)
    if seq_before & 1:
        return None
    order_fence()
    values = layout.unpack_from(buf, offset + SEQ_SIZE)
    order_fence()
    (seq_after,) = SEQ.unpack_from(buf, offset)
    return values if seq_after == seq_before else None
