"""Producer mailboxes: each co-located producer's request/response channel to the supervisor.

Region kind 'mbox', layout version 1, little-endian. S slots, B = max_batch, D = data_bytes
(defaults 64, 1024, 4 MiB + 256 KiB: about 274 MiB of /dev/shm address space, pages are only
allocated where producers write):

    offset                 size       what
    0                      64         header: magic 8s b'MQSTMBX1', layout_version u32,
                                      slot_count u32, max_batch u32, result_size u32,
                                      data_bytes u64, slot_stride u64
    64 + 64*i              64         slot header i (SLOT_HEADER_DTYPE)
      +0  state u32 (SlotState)   +4  owner_pid i32      written by the producer at claim
      +8  req_seq u64                                     producer; the request commit point
      +16 resp_seq u64                                    supervisor; the response commit point
      +24 req_count u32  +28 req_flags u32 (RequestFlag)  producer, before req_seq
      +32 req_bytes u64  +40 resp_count u32               resp_count: supervisor, before resp_seq
    A + stride*i           B*32       results of slot i (RESULT_DTYPE: status i32, queue_id i32,
                                      commit_pos i64, queue_offset i64, store_ts_ms i64); the
                                      row of a record refused (MESSAGE_ILLEGAL) holds no
                                      position, so it is a REFUSAL_DTYPE: status i32, refusal
                                      i32 (engine.refusal.Refusal), limit i64, found i64, 8 zero
    A + stride*i + B*32    D          data of slot i: the batch's records back to back, each
                                      starting with its 4-byte big-endian TOTALSIZE

A = page-aligned end of the slot headers; stride = B*32 + D rounded up to a page.

One request in flight per slot. Producer: copy records, fence, req_seq += 1 (a producer killed
before this leaves nothing visible), post sem-sup. Supervisor: pending = req_seq > resp_seq;
write results and resp_count, fence, resp_seq = req_seq, post sem-slot-<i>. A request published
by a producer that then died is still answered; the next claimant of the slot waits for that.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Sequence
from enum import IntEnum, IntFlag
from typing import NamedTuple

import numpy as np

from engine.errors import (
    BadInputError,
    FormatVersionError,
    ServiceNotAvailableError,
    SlotsExhaustedError,
    StoreError,
    StorePermissionError,
)
from ipc import seqlock, slot_claim
from ipc.shm import SharedRegion, region_name
from ipc.wakeup import Wakeup, slot_wakeup_name, supervisor_wakeup_name

MAGIC = b"MQSTMBX1"
LAYOUT_VERSION = 1
REGION_KIND = "mbox"
PAGE_BYTES = 4096
DEFAULT_SLOT_COUNT = 64
MAX_BATCH = 1024
DEFAULT_DATA_BYTES = 4 * 1024 * 1024 + 256 * 1024
WAIT_CHUNK_S = 0.05
HEADER = struct.Struct("<8sIIIIQQ")
HEADER_SIZE = 64
TOTALSIZE = struct.Struct(">I")
SLOT_HEADER_FIELDS = (("state", "I"), ("owner_pid", "i"), ("req_seq", "Q"), ("resp_seq", "Q"),
                      ("req_count", "I"), ("req_flags", "I"), ("req_bytes", "Q"),
                      ("resp_count", "I"))
SLOT_HEADER = struct.Struct("<" + "".join(fmt for _, fmt in SLOT_HEADER_FIELDS))
SLOT_HEADER_SIZE = 64
SLOT_HEADER_DTYPE = np.dtype({  # the same layout, for vectorised access to all slots at once
    "names": [name for name, _ in SLOT_HEADER_FIELDS],
    "formats": ["<" + fmt for _, fmt in SLOT_HEADER_FIELDS],
    "offsets": [struct.calcsize("<" + "".join(f for _, f in SLOT_HEADER_FIELDS[:i]))
                for i in range(len(SLOT_HEADER_FIELDS))],
    "itemsize": SLOT_HEADER_SIZE,
})
RESULT_FIELDS = (("status", "i"), ("queue_id", "i"), ("commit_pos", "q"), ("queue_offset", "q"),
                 ("store_ts_ms", "q"))
RESULT_DTYPE = np.dtype([(name, "<" + fmt) for name, fmt in RESULT_FIELDS])
RESULT_ROW = struct.Struct("<" + "".join(fmt for _, fmt in RESULT_FIELDS))  # one row, for a few rows
RESULT_SIZE = RESULT_DTYPE.itemsize
REFUSAL_FIELDS = (("status", "i"), ("refusal", "i"), ("limit", "q"), ("found", "q"), ("reserved", "q"))
REFUSAL_DTYPE = np.dtype([(name, "<" + fmt) for name, fmt in REFUSAL_FIELDS])  # a refused row's view
assert REFUSAL_DTYPE.itemsize == RESULT_SIZE
assert REFUSAL_DTYPE.fields["status"] == RESULT_DTYPE.fields["status"]
assert HEADER.size <= HEADER_SIZE and SLOT_HEADER.size <= SLOT_HEADER_SIZE
assert RESULT_SIZE == RESULT_ROW.size == 32
assert SLOT_HEADER_DTYPE.fields["req_seq"][1] == 8 and SLOT_HEADER_DTYPE.fields["resp_count"][1] == 40


def _fields_struct(first: str, stop: str | None) -> tuple[struct.Struct, int]:
    """A struct of the slot header's fields from `first` up to `stop` (None: the last one) and
    its offset in the header: a producer's per-request reads and writes, one call each."""
    names = [name for name, _ in SLOT_HEADER_FIELDS]
    fields = SLOT_HEADER_FIELDS[names.index(first):names.index(stop) if stop else len(names)]
    packed = struct.Struct("<" + "".join(fmt for _, fmt in fields))
    offset = SLOT_HEADER_DTYPE.fields[first][1]
    end = SLOT_HEADER_DTYPE.fields[stop][1] if stop else SLOT_HEADER.size
    assert offset + packed.size == end, f"slot header fields {first}..{stop} are not contiguous"
    return packed, offset


SEQS, SEQS_OFFSET = _fields_struct("req_seq", "req_count")  # req_seq, resp_seq
RESP_SEQ, RESP_SEQ_OFFSET = _fields_struct("resp_seq", "req_count")
REQ_SEQ, REQ_SEQ_OFFSET = _fields_struct("req_seq", "resp_seq")
REQUEST_FIELDS, REQUEST_FIELDS_OFFSET = _fields_struct("req_count", "resp_count")  # count, flags, bytes
RESP_COUNT, RESP_COUNT_OFFSET = _fields_struct("resp_count", None)


class SlotState(IntEnum):
    FREE = 0
    CLAIMED = 1


class RequestFlag(IntFlag):
    NONE = 0
    WAIT_FOR_FLUSH = 1


_FLAGS = {int(flags): flags for flags in (RequestFlag.NONE, RequestFlag.WAIT_FOR_FLUSH)}  # Flag() costs ~1 us


class PendingRequest(NamedTuple):
    """One published request as the supervisor sees it; `data` views the slot's data area.
    A NamedTuple: made per request on the supervisor's path, where a dataclass costs more."""

    slot_index: int
    seq: int
    count: int
    data: memoryview
    flags: RequestFlag
    owner_pid: int


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def split_records(data: memoryview, count: int) -> list[memoryview]:
    """Cut a request's data into its `count` records by their big-endian TOTALSIZE."""
    records, pos, end = [], 0, len(data)
    for _ in range(count):
        if pos + TOTALSIZE.size > end:
            raise BadInputError("request", f"{count} records announced, data ends after "
                                f"{len(records)}")
        (size,) = TOTALSIZE.unpack_from(data, pos)
        if size < TOTALSIZE.size or pos + size > end:
            raise BadInputError("request", f"record {len(records)} has TOTALSIZE {size} at "
                                f"byte {pos} of {end}")
        records.append(data[pos:pos + size])
        pos += size
    if pos != end:
        raise BadInputError("request", f"{end - pos} bytes left after {count} records")
    return records


class Mailbox:
    """The mailbox region and typed numpy views over its slot headers and result arrays."""

    def __init__(self, region: SharedRegion, store_dir: str | os.PathLike):
        self.region = region
        self.store_dir = store_dir
        magic, version, self.slot_count, self.max_batch, result_size, self.data_bytes, \
            self.slot_stride = HEADER.unpack_from(region.buf, 0)
        self._validate(magic, version, result_size)
        if self.size_bytes_for(self.slot_count, self.data_bytes, self.max_batch) != (
                region.size_bytes, self.slot_stride):
            raise StoreError(f"mailbox {region.name} is {region.size_bytes} bytes, which does "
                             "not match the geometry in its header")
        self.areas_offset = _round_up(HEADER_SIZE + self.slot_count * SLOT_HEADER_SIZE,
                                      PAGE_BYTES)
        self.results_bytes = self.max_batch * RESULT_SIZE
        headers = np.ndarray((self.slot_count,), SLOT_HEADER_DTYPE, region.buf, HEADER_SIZE)
        self.headers = headers
        self.state, self.owner_pid = headers["state"], headers["owner_pid"]
        self.req_seq, self.resp_seq = headers["req_seq"], headers["resp_seq"]
        self.req_count, self.req_flags = headers["req_count"], headers["req_flags"]
        self.req_bytes, self.resp_count = headers["req_bytes"], headers["resp_count"]
        self.results = [np.ndarray((self.max_batch,), RESULT_DTYPE, region.buf,
                                   self.areas_offset + i * self.slot_stride)
                        for i in range(self.slot_count)]

    def _validate(self, magic: bytes, version: int, result_size: int) -> None:
        if magic == b"\0" * 8:
            raise ServiceNotAvailableError(f"mailbox {self.region.name} is still being created")
        if magic != MAGIC:
            raise StoreError(f"{self.region.name} is not an mqstore mailbox (magic {magic!r})")
        if version != LAYOUT_VERSION or result_size != RESULT_SIZE:
            raise FormatVersionError(f"mailbox layout version {version}; this mqstore speaks "
                                     f"{LAYOUT_VERSION}")
        seqlock.order_fence()

    @staticmethod
    def size_bytes_for(slot_count: int, data_bytes: int, max_batch: int) -> tuple[int, int]:
        """(region size, slot stride) for the given geometry."""
        areas = _round_up(HEADER_SIZE + slot_count * SLOT_HEADER_SIZE, PAGE_BYTES)
        stride = _round_up(max_batch * RESULT_SIZE + data_bytes, PAGE_BYTES)
        return areas + slot_count * stride, stride

    @classmethod
    def create(cls, store_dir: str | os.PathLike, *, slot_count: int = DEFAULT_SLOT_COUNT,
               data_bytes: int = DEFAULT_DATA_BYTES, max_batch: int = MAX_BATCH) -> Mailbox:
        if slot_count < 1 or data_bytes < 4 or max_batch < 1:
            raise BadInputError("mailbox", "needs slot_count >= 1, data_bytes >= 4, "
                                "max_batch >= 1")
        size_bytes, stride = cls.size_bytes_for(slot_count, data_bytes, max_batch)
        region = SharedRegion.create(region_name(store_dir, REGION_KIND), size_bytes)
        HEADER.pack_into(region.buf, 0, b"\0" * 8, LAYOUT_VERSION, slot_count, max_batch,
                         RESULT_SIZE, data_bytes, stride)
        seqlock.order_fence()
        region.buf[0:len(MAGIC)] = MAGIC
        return cls(region, store_dir)

    @classmethod
    def attach(cls, store_dir: str | os.PathLike) -> Mailbox:
        region = SharedRegion.attach(region_name(store_dir, REGION_KIND))
        try:
            return cls(region, store_dir)
        except BaseException:
            region.close()
            raise

    def data_view(self, index: int) -> memoryview:
        """The whole data area of slot `index`."""
        start = self.areas_offset + index * self.slot_stride + self.results_bytes
        return self.region.buf[start:start + self.data_bytes]

    def close(self) -> None:
        self.headers, self.results = None, []
        self.state = self.owner_pid = self.req_seq = self.resp_seq = None
        self.req_count = self.req_flags = self.req_bytes = self.resp_count = None
        self.region.close()

    def unlink(self) -> None:
        self.region.unlink()


class MailboxServer:
    """The supervisor's side: find published requests, answer them."""

    def __init__(self, mailbox: Mailbox, wakeup: Wakeup, slot_wakeups: Sequence[Wakeup]):
        self.mailbox = mailbox
        self.wakeup = wakeup
        self._slot_wakeups = list(slot_wakeups)
        self._data_views = [mailbox.data_view(i) for i in range(mailbox.slot_count)]

    @classmethod
    def create(cls, store_dir: str | os.PathLike, *, slot_count: int = DEFAULT_SLOT_COUNT,
               data_bytes: int = DEFAULT_DATA_BYTES, max_batch: int = MAX_BATCH) -> MailboxServer:
        """Create the region and its semaphores (sem-sup, one sem-slot-<i> per slot)."""
        mailbox = Mailbox.create(store_dir, slot_count=slot_count, data_bytes=data_bytes,
                                 max_batch=max_batch)
        wakeup = Wakeup.create(supervisor_wakeup_name(store_dir))
        slot_wakeups = [Wakeup.create(slot_wakeup_name(store_dir, i))
                        for i in range(mailbox.slot_count)]
        return cls(mailbox, wakeup, slot_wakeups)

    def wait_for_requests(self, timeout_s: float) -> bool:
        """Sleep until a producer posts (or timeout); drains extra posts. Then pending_slots().
        Posts that came while the last sweep ran are taken without the sleep's signal-mask
        syscalls (a look at the count is no syscall), which is most sweeps under load."""
        if self._take_posts():
            return True
        woken = self.wakeup.wait(timeout_s)
        self._take_posts()
        return woken

    def _take_posts(self) -> int:
        """Take the posts the count shows (a drain would end on a failed take, an exception)."""
        posts = self.wakeup.pending_posts
        for _ in range(posts):
            self.wakeup.wait(0)
        return posts

    def pending_slots(self) -> list[PendingRequest]:
        """Every published, unanswered request, in slot order."""
        mb, buf = self.mailbox, self.mailbox.region.buf
        ready = (mb.req_seq != mb.resp_seq).nonzero()[0].tolist()  # req_seq >= resp_seq always
        seqlock.order_fence()
        pending = []
        for i in ready:
            _, owner_pid, seq, _, count, flags, nbytes, _ = SLOT_HEADER.unpack_from(
                buf, HEADER_SIZE + i * SLOT_HEADER_SIZE)
            if not (1 <= count <= mb.max_batch and 4 * count <= nbytes <= mb.data_bytes):
                self._respond(i, seq, mb.results[i][:0])  # malformed: answer with no results
                continue
            pending.append(PendingRequest(i, seq, count, self._data_views[i][:nbytes],
                                          _FLAGS[flags] if flags in _FLAGS else RequestFlag(flags),
                                          owner_pid))
        return pending

    def is_answered(self, slot_index: int, seq: int) -> bool:
        """True once request `seq` of a slot has its response."""
        return int(self.mailbox.resp_seq[slot_index]) >= seq

    def complete(self, slot_index: int, seq: int, results: np.ndarray | Sequence[tuple]) -> None:
        """Answer request `seq` of a slot with one result per record (as many as pending_slots
        read in its header), then wake its producer. The slot's header is the producer's to
        write: one that rewrote it after publishing gets this answer all the same, and nothing
        it wrote there can make the supervisor raise."""
        if len(results) > self.mailbox.max_batch:
            raise ValueError(f"{len(results)} results for slot {slot_index}: a batch holds "
                             f"{self.mailbox.max_batch}")
        self._respond(slot_index, seq, results)

    def complete_rows(self, slot_index: int, seq: int, rows: bytes | bytearray) -> None:
        """complete() with the answer rows packed already (RESULT_ROW after RESULT_ROW), copied
        in as bytes: no numpy per answer on the supervisor's send-and-wait path."""
        mb = self.mailbox
        if len(rows) > mb.results_bytes or len(rows) % RESULT_SIZE:
            raise ValueError(f"{len(rows)} bytes of results for slot {slot_index}: not whole rows "
                             f"within the {mb.max_batch} of a batch")
        at = mb.areas_offset + slot_index * mb.slot_stride
        mb.region.buf[at:at + len(rows)] = rows
        self._publish_response(slot_index, seq, len(rows) // RESULT_SIZE)

    def _respond(self, index: int, seq: int, results) -> None:
        count = len(results)
        self.mailbox.results[index][:count] = results
        self._publish_response(index, seq, count)

    def _publish_response(self, index: int, seq: int, count: int) -> None:
        """The `count` results are in the slot's results area: publish them (count, then seq
        after a fence, as the producer reads them) and wake the producer."""
        mb = self.mailbox
        mb.resp_count[index] = count
        seqlock.order_fence()
        mb.resp_seq[index] = seq
        self._slot_wakeups[index].post()

    def close(self) -> None:
        for wakeup in (self.wakeup, *self._slot_wakeups):
            wakeup.close()
        self._data_views = []
        self.mailbox.close()

    def unlink(self) -> None:
        """Remove the region and the semaphores (creator only)."""
        for wakeup in (self.wakeup, *self._slot_wakeups):
            wakeup.unlink()
        self.mailbox.unlink()


def _claim_preferring_idle(mailbox: Mailbox, run_dir: str | os.PathLike) -> tuple[int, int]:
    in_flight: list[tuple[int, int]] = []  # locked by us, but a predecessor's request is pending
    try:
        while True:
            try:
                index, fd = slot_claim.claim_slot(run_dir, mailbox.slot_count)
            except SlotsExhaustedError as exc:
                if not in_flight:
                    raise SlotsExhaustedError(
                        f"all {exc.slot_count} producer mailbox slots are in use by live Producers",
                        slot_count=exc.slot_count, path=exc.path,
                        hint="close idle Producers, or restart the store with more: the "
                             "mailbox_slots setting of the [supervisor] table of `mqstore start "
                             "--config`") from None
                return in_flight.pop(0)
            except StorePermissionError:
                raise
            except StoreError:
                if not in_flight:
                    raise
                return in_flight.pop(0)
            if mailbox.req_seq[index] == mailbox.resp_seq[index]:
                return index, fd
            in_flight.append((index, fd))
    finally:
        for _, held_fd in in_flight:
            slot_claim.release_slot(held_fd)


class ProducerSlot:
    """A producer's claimed slot: write a batch, wait for its results. One request in flight."""

    def __init__(self, mailbox: Mailbox, index: int, lock_fd: int, wakeup: Wakeup,
                 supervisor_wakeup: Wakeup):
        self.mailbox = mailbox
        self.index = index
        self._lock_fd = lock_fd
        self._wakeup = wakeup
        self._supervisor_wakeup = supervisor_wakeup
        self._data = mailbox.data_view(index)
        self._buf = mailbox.region.buf
        self._header_at = HEADER_SIZE + index * SLOT_HEADER_SIZE
        self._results_at = mailbox.areas_offset + index * mailbox.slot_stride
        self._staged_count = 0
        self._sent_count = 0

    @classmethod
    def claim(cls, mailbox: Mailbox, run_dir: str | os.PathLike, *, alive: Callable[[], bool],
              timeout_s: float = 10.0) -> ProducerSlot:
        """Claim a free slot (flock under `run_dir`), preferring one with no request in flight;
        if every free slot still has one (a predecessor's), wait for its answer."""
        index, fd = _claim_preferring_idle(mailbox, run_dir)
        try:
            wakeup = Wakeup.open(slot_wakeup_name(mailbox.store_dir, index))
            sup = Wakeup.open(supervisor_wakeup_name(mailbox.store_dir))
        except BaseException:
            slot_claim.release_slot(fd)
            raise
        slot = cls(mailbox, index, fd, wakeup, sup)
        try:
            slot._wait_idle(timeout_s, alive)
        except BaseException:
            slot.release()
            raise
        wakeup.drain()
        mailbox.owner_pid[index] = os.getpid()
        mailbox.state[index] = SlotState.CLAIMED
        return slot

    def _wait_idle(self, timeout_s: float, alive: Callable[[], bool]) -> None:
        req_seq, resp_seq = SEQS.unpack_from(self._buf, self._header_at + SEQS_OFFSET)
        if resp_seq < req_seq:
            self._await_seq(req_seq, timeout_s, alive)

    def stage_request(self, records: Sequence[bytes | bytearray | memoryview] | bytes
                      | bytearray | memoryview, *, count: int | None = None,
                      flags: RequestFlag = RequestFlag.NONE) -> None:
        """Copy a batch into the slot, unpublished. A list of records, or one joined buffer and
        its record count."""
        mb, i = self.mailbox, self.index
        req_seq, resp_seq = SEQS.unpack_from(self._buf, self._header_at + SEQS_OFFSET)
        if req_seq != resp_seq:
            raise StoreError(f"mailbox slot {i} still has a request in flight")
        if type(records) is bytes and count is not None:  # a producer's joined records
            data = records
        elif isinstance(records, bytes | bytearray | memoryview):
            data = memoryview(records).cast("B")
            if count is None:
                raise BadInputError("count", "required with a pre-joined buffer")
        else:
            data = b"".join(records)
            count = len(records) if count is None else count
            if count != len(records):
                raise BadInputError("count", f"{count} given for {len(records)} records")
        nbytes = len(data)
        if not 1 <= count <= mb.max_batch:
            raise BadInputError("count", f"{count} records; a batch holds 1..{mb.max_batch}")
        if nbytes > mb.data_bytes:
            raise BadInputError("batch", f"{nbytes} bytes exceed the slot's {mb.data_bytes}")
        self._data[:nbytes] = data
        REQUEST_FIELDS.pack_into(self._buf, self._header_at + REQUEST_FIELDS_OFFSET, count, flags, nbytes)
        self._staged_count = count

    def publish_request(self) -> int:
        """Make the staged batch visible to the supervisor and wake it; the request's seq."""
        if not self._staged_count:
            raise StoreError(f"mailbox slot {self.index} has no staged request")
        at = self._header_at + REQ_SEQ_OFFSET
        seq = REQ_SEQ.unpack_from(self._buf, at)[0] + 1
        seqlock.order_fence()
        REQ_SEQ.pack_into(self._buf, at, seq)
        self._sent_count, self._staged_count = self._staged_count, 0
        self._supervisor_wakeup.post()
        return seq

    def write_request(self, records: Sequence[bytes | bytearray | memoryview] | bytes
                      | bytearray | memoryview, *, count: int | None = None,
                      flags: RequestFlag = RequestFlag.NONE) -> int:
        """stage_request + publish_request; returns the seq to pass to wait_response."""
        self.stage_request(records, count=count, flags=flags)
        return self.publish_request()

    def wait_response(self, seq: int, timeout_s: float, alive: Callable[[], bool]) -> np.ndarray:
        """The results of request `seq` (a RESULT_DTYPE array, one per record, in order)."""
        buf, at = self._buf, self._header_at
        req_seq, resp_seq = SEQS.unpack_from(buf, at + SEQS_OFFSET)
        if seq != req_seq:
            raise ValueError(f"request {seq} is not this slot's latest request")
        if resp_seq < seq:
            self._await_seq(seq, timeout_s, alive)
        else:
            seqlock.order_fence()
        count = RESP_COUNT.unpack_from(buf, at + RESP_COUNT_OFFSET)[0]
        if count != self._sent_count:
            raise StoreError(f"supervisor rejected request {seq} of mailbox slot {self.index} "
                             f"({count} results for {self._sent_count} records)")
        # a private copy by one bytes copy: ndarray.copy() of a slice cost ~2 us per request
        results_at = self._results_at
        return np.frombuffer(bytearray(buf[results_at:results_at + count * RESULT_SIZE]), RESULT_DTYPE)

    def wait_answered(self, seq: int, timeout_s: float, alive: Callable[[], bool]) -> None:
        """Wait until request `seq` is answered, without taking its results."""
        self._await_seq(seq, timeout_s, alive)

    def _await_seq(self, seq: int, timeout_s: float, alive: Callable[[], bool]) -> None:
        buf, at, i = self._buf, self._header_at + RESP_SEQ_OFFSET, self.index
        deadline = time.monotonic() + timeout_s
        while RESP_SEQ.unpack_from(buf, at)[0] < seq:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServiceNotAvailableError(f"no answer to request {seq} of mailbox slot {i} "
                                               f"within {timeout_s}s", hint="is the supervisor hung?")
            woken = self._wakeup.wait(min(WAIT_CHUNK_S, remaining))
            if not woken and RESP_SEQ.unpack_from(buf, at)[0] < seq and not alive():
                raise ServiceNotAvailableError("the supervisor exited before answering request "
                                               f"{seq} of mailbox slot {i}")
        seqlock.order_fence()

    def release(self) -> None:
        """Give the slot back. A published, unanswered request is still answered."""
        if self._lock_fd < 0:
            return
        self.mailbox.state[self.index] = SlotState.FREE
        self.mailbox.owner_pid[self.index] = 0
        self._wakeup.close()
        self._supervisor_wakeup.close()
        self._data = self._buf = None
        slot_claim.release_slot(self._lock_fd)
        self._lock_fd = -1

    def forget(self) -> None:
        """In a forked child: close this process's handles to an inherited slot. Writes nothing
        shared and does not unlock: the flock belongs to the open file description the parent
        shares, so an unlock here would free the parent's slot under it."""
        if self._lock_fd < 0:
            return
        self._wakeup.close()
        self._supervisor_wakeup.close()
        self._data = self._buf = None
        os.close(self._lock_fd)
        self._lock_fd = -1

    def __enter__(self) -> ProducerSlot:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()
