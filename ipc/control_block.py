"""The control block: one shared region per running store with positions and process slots.

Region kind 'ctl', layout version 4, 13056 bytes, all little-endian, every group 64-byte aligned
(one cache line per writer). Each seqlocked group = 8-byte seq word + payload (see seqlock.py).

    offset  size  what                       fields                                   writer
    0       64    header                     magic 8s b'MQSTCTL1', layout_version u32,  supervisor
                                             total_size u32, supervisor_pid i32,       (at create;
                                             generation u32, state u32 (StoreState),    state later)
                                             flush_code u32, shard_count u32,
                                             process_slot_count u32, started_ns i64
    64      64    supervisor group (seqlock) written_pos, flushed_pos, appended_msgs,   supervisor
                                             flush_count, last_flush_latency_ns,
                                             last_flush_bytes (i64 each)
    128     64    dispatcher group (seqlock) dispatched_pos, cq_durable_pos,            dispatcher
                                             dispatched_msgs (i64 each)
    192     64x64 shard group i (seqlock)    processed_pos, durable_pos (i64)           builder i
    4288    64x66 process slot j             seq u64 | pid i32, role u32, shard i32,    supervisor
                                             generation u32, started_ns i64,            (claims)
                                             restarts u32, pad 4 | state u32 (@40),     process
                                             pad 4 | heartbeat_ns i64 (@48) | pad 8     (state, beat)
    8512    64    retention group (seqlock)  min_commit_pos, passes, segments_removed,  supervisor
                                             bytes_removed, last_pass_ms, manual_done
    8576    64    clean request              manual_requested i64 (one aligned word)    `mqstore clean`
    8640    64    dispatcher retention       clean_pos, files_removed (i64)             dispatcher
    8704    64x64 shard retention i          clean_pos, files_removed (i64)             builder i
    12800   64    put status group (seqlock) answers per PutStatus 1..7 (i64 each:    supervisor
                                             FLUSH_DISK_TIMEOUT .. UNKNOWN_ERROR)
    12864   192   put latency group (seqlock) requests per latency bucket (16 i64),  supervisor
                                             sum_ns i64 (ipc/put_latency.py)

Version 2 added the retention area (ipc/retention_block.py reads and writes it); version 3 the
put status group, counted only where a put fails, so a PUT_OK costs nothing more (its count
is appended_msgs less the FLUSH_DISK_TIMEOUT answers, which were appended too); version 4 the
put latency group, added to once per answered batch of requests.

The magic is written last at create, so an attacher never sees a half-initialised header.
Process slots: 0 = supervisor, 1 = dispatcher, 2 + i = index builder of shard i.
Positions only grow; a smaller publish is a bug (ValueError) except through the reset_* calls
a (re)starting writer makes. Each group is consistent on its own; a snapshot is not one instant.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum

from engine.config import FlushPolicy
from engine.errors import FormatVersionError, ServiceNotAvailableError, StoreError
from engine.status import PutStatus
from ipc import seqlock
from ipc.put_latency import LATENCY_GROUP, LatencyHistogram, LatencyTally
from ipc.shm import SharedRegion, region_name, unlink_stale

MAGIC = b"MQSTCTL1"
LAYOUT_VERSION = 4
REGION_KIND = "ctl"
MAX_SHARDS = 64
PROCESS_SLOT_COUNT = 2 + MAX_SHARDS
GROUP_SIZE = 64

HEADER_FIELDS = (("magic", "8s"), ("layout_version", "I"), ("total_size", "I"),
                 ("supervisor_pid", "i"), ("generation", "I"), ("state", "I"),
                 ("flush_code", "I"), ("shard_count", "I"), ("process_slot_count", "I"),
                 ("started_ns", "q"))
HEADER = struct.Struct("<" + "".join(fmt for _, fmt in HEADER_FIELDS))
HEADER_SIZE = 64
STATE_WORD = struct.Struct("<I")
I64_WORD = struct.Struct("<q")
SUPERVISOR_GROUP = struct.Struct("<6q")
DISPATCHER_GROUP = struct.Struct("<3q")
SHARD_GROUP = struct.Struct("<2q")
PUT_STATUS_GROUP = struct.Struct("<7q")  # PutStatus 1..7; PUT_OK (0) is derived, see above
SLOT_IDENTITY = struct.Struct("<iIiIqI4x")
SLOT_SIZE = 64

HEADER_OFFSET = 0
SUPERVISOR_GROUP_OFFSET = HEADER_OFFSET + HEADER_SIZE
DISPATCHER_GROUP_OFFSET = SUPERVISOR_GROUP_OFFSET + GROUP_SIZE
SHARD_GROUPS_OFFSET = DISPATCHER_GROUP_OFFSET + GROUP_SIZE
PROCESS_SLOTS_OFFSET = SHARD_GROUPS_OFFSET + MAX_SHARDS * GROUP_SIZE
RETENTION_AREA_OFFSET = PROCESS_SLOTS_OFFSET + PROCESS_SLOT_COUNT * SLOT_SIZE
RETENTION_AREA_SIZE = (3 + MAX_SHARDS) * GROUP_SIZE  # supervisor, request, dispatcher, shards
PUT_STATUS_GROUP_OFFSET = RETENTION_AREA_OFFSET + RETENTION_AREA_SIZE
PUT_LATENCY_GROUP_OFFSET = PUT_STATUS_GROUP_OFFSET + GROUP_SIZE
PUT_LATENCY_GROUP_SIZE = 3 * GROUP_SIZE  # 17 words and the seq word: three cache lines
TOTAL_SIZE = PUT_LATENCY_GROUP_OFFSET + PUT_LATENCY_GROUP_SIZE
SLOT_STATE_OFFSET = seqlock.SEQ_SIZE + SLOT_IDENTITY.size
SLOT_HEARTBEAT_OFFSET = SLOT_STATE_OFFSET + 8


HEADER_STATE_OFFSET = struct.calcsize("<" + "".join(
    fmt for _, fmt in HEADER_FIELDS[:[name for name, _ in HEADER_FIELDS].index("state")]))

assert HEADER.size <= HEADER_SIZE
assert max(seqlock.seqlock_size(g) for g in (SUPERVISOR_GROUP, DISPATCHER_GROUP,
                                             SHARD_GROUP, PUT_STATUS_GROUP)) <= GROUP_SIZE
assert seqlock.seqlock_size(LATENCY_GROUP) <= PUT_LATENCY_GROUP_SIZE
assert SLOT_HEARTBEAT_OFFSET + I64_WORD.size <= SLOT_SIZE and SLOT_HEARTBEAT_OFFSET % 8 == 0
assert (TOTAL_SIZE, HEADER_STATE_OFFSET, SLOT_STATE_OFFSET) == (13056, 24, 40)


StoreState = IntEnum("StoreState", "STARTING READY STOPPING STOPPED FAILED")  # 1..5
Role = IntEnum("Role", "SUPERVISOR DISPATCHER INDEX_BUILDER")  # 1..3; 0 = slot never claimed
ProcState = IntEnum("ProcState", "BOOTING RUNNING STOPPING EXITED")  # 1..4
FlushCode = IntEnum("FlushCode", "SYNC ASYNC")  # 1, 2


def flush_code_for(policy: FlushPolicy) -> FlushCode:
    return FlushCode.SYNC if policy is FlushPolicy.SYNC else FlushCode.ASYNC


def process_slot_index(role: Role, shard: int = 0) -> int:
    """Slot of a process: 0 supervisor, 1 dispatcher, 2 + shard for an index builder."""
    if role is Role.INDEX_BUILDER:
        if not 0 <= shard < MAX_SHARDS:
            raise ValueError(f"shard {shard} out of range 0..{MAX_SHARDS - 1}")
        return 2 + shard
    return 0 if role is Role.SUPERVISOR else 1


def pid_alive(pid: int) -> bool:
    """True if `pid` names a live (not zombie) process."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie still takes signals: its state in /proc/PID/stat (after "comm)") says Z
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            stat = stat_file.read()
    except (FileNotFoundError, ProcessLookupError):  # ESRCH: reaped between open and read
        return False
    except OSError:  # no /proc to read: the signal said it exists
        return True
    state_at = stat.rfind(b")") + 2
    return stat[state_at:state_at + 1] not in (b"Z", b"X")


@dataclass(frozen=True)
class Positions:
    """A snapshot of every published position and status counter."""

    written_pos: int
    flushed_pos: int
    dispatched_pos: int
    cq_durable_pos: int
    shard_processed_pos: tuple[int, ...]
    shard_durable_pos: tuple[int, ...]
    appended_msgs: int = 0
    flush_count: int = 0
    last_flush_latency_ns: int = 0
    last_flush_bytes: int = 0
    dispatched_msgs: int = 0

    @classmethod
    def uniform(cls, commit_pos: int, shard_count: int) -> Positions:
        """Every position at `commit_pos` (what a supervisor publishes after recovery)."""
        shards = (commit_pos,) * shard_count
        return cls(commit_pos, commit_pos, commit_pos, commit_pos, shards, shards)

    @property
    def index_durable_pos(self) -> int:
        return min(self.shard_durable_pos, default=self.cq_durable_pos)


@dataclass(frozen=True)
class ProcessSlot:
    """A snapshot of one process slot."""

    index: int
    pid: int
    role: Role
    shard: int
    generation: int
    state: ProcState
    heartbeat_ns: int
    started_ns: int
    restarts: int


def _require_growth(name: str, old: int, new: int) -> None:
    if new < old:
        raise ValueError(f"{name} may only grow: {new} < published {old}")


def _require_order(low_name: str, low: int, high_name: str, high: int) -> None:
    if low > high:
        raise ValueError(f"{low_name} {low} is ahead of {high_name} {high}")


class ControlBlock:
    """Typed access to the control region; create() in the supervisor, attach() elsewhere."""

    def __init__(self, region: SharedRegion):
        self.region = region
        self._buf = region.buf
        self._write_lock = threading.Lock()
        header = HEADER.unpack_from(self._buf, HEADER_OFFSET)
        fields = dict(zip((name for name, _ in HEADER_FIELDS), header, strict=True))
        self.supervisor_pid: int = fields["supervisor_pid"]
        self.generation: int = fields["generation"]
        self.flush_code = FlushCode(fields["flush_code"])
        self.shard_count: int = fields["shard_count"]
        self.started_ns: int = fields["started_ns"]

    @classmethod
    def create(cls, store_dir: str | os.PathLike, shard_count: int, flush_code: FlushCode, *,
               generation: int = 1) -> ControlBlock:
        """Create the store's control block (state STARTING); the caller owns and unlinks it."""
        if not 1 <= shard_count <= MAX_SHARDS:
            raise ValueError(f"shard_count {shard_count} out of range 1..{MAX_SHARDS}")
        region = SharedRegion.create(region_name(store_dir, REGION_KIND), TOTAL_SIZE)
        HEADER.pack_into(region.buf, HEADER_OFFSET, b"\0" * 8, LAYOUT_VERSION, TOTAL_SIZE,
                         os.getpid(), generation, StoreState.STARTING, FlushCode(flush_code),
                         shard_count, PROCESS_SLOT_COUNT, time.time_ns())
        seqlock.order_fence()
        region.buf[HEADER_OFFSET:HEADER_OFFSET + len(MAGIC)] = MAGIC
        return cls(region)

    @classmethod
    def attach(cls, store_dir: str | os.PathLike) -> ControlBlock:
        """Attach to the running store's control block, validating magic, version and size."""
        region = SharedRegion.attach(region_name(store_dir, REGION_KIND))
        try:
            _validate_header(region)
        except BaseException:
            region.close()
            raise
        return cls(region)

    # -- header -----------------------------------------------------------------------------
    @property
    def store_state(self) -> StoreState:
        (state,) = STATE_WORD.unpack_from(self._buf, HEADER_STATE_OFFSET)
        return StoreState(state)

    def set_store_state(self, state: StoreState) -> None:
        seqlock.store_word(self._buf, HEADER_STATE_OFFSET, int(StoreState(state)), "I")

    @property
    def flush_policy(self) -> FlushPolicy:
        return FlushPolicy.SYNC if self.flush_code is FlushCode.SYNC else FlushPolicy.ASYNC

    def supervisor_alive(self) -> bool:
        return pid_alive(self.supervisor_pid)

    def is_ready(self) -> bool:
        """The supervisor says READY and its process is alive."""
        return self.store_state is StoreState.READY and self.supervisor_alive()

    # -- positions ---------------------------------------------------------------------------
    def _update(self, offset: int, layout: struct.Struct,
                update: Callable[[tuple], tuple]) -> None:
        """Read-modify-write one group; the lock keeps threads of the writer process in turn."""
        with self._write_lock:
            old = seqlock.read_unlocked(self._buf, offset, layout)
            seqlock.write_locked(self._buf, offset, layout, update(old))

    def publish_written(self, pos: int, *, msg_count: int = 0) -> None:
        """Commitlog bytes [0, pos) are written; `msg_count` messages were appended since last."""
        def update(old: tuple) -> tuple:
            _require_growth("written_pos", old[0], pos)
            return (pos, old[1], old[2] + msg_count, *old[3:])
        self._update(SUPERVISOR_GROUP_OFFSET, SUPERVISOR_GROUP, update)

    def publish_flushed(self, pos: int, *, latency_ns: int = 0, flushed_bytes: int = 0) -> None:
        """Commitlog bytes [0, pos) are durable; one flush took `latency_ns`."""
        def update(old: tuple) -> tuple:
            _require_growth("flushed_pos", old[1], pos)
            _require_order("flushed_pos", pos, "written_pos", old[0])
            return (old[0], pos, old[2], old[3] + 1, latency_ns, flushed_bytes)
        self._update(SUPERVISOR_GROUP_OFFSET, SUPERVISOR_GROUP, update)

    def publish_dispatched(self, pos: int, *, msg_count: int = 0) -> None:
        """Records below `pos` have consume-queue entries (not yet durable)."""
        def update(old: tuple) -> tuple:
            _require_growth("dispatched_pos", old[0], pos)
            return (pos, old[1], old[2] + msg_count)
        self._update(DISPATCHER_GROUP_OFFSET, DISPATCHER_GROUP, update)

    def publish_cq_durable(self, pos: int) -> None:
        """Consume-queue entries of records below `pos` are flushed."""
        def update(old: tuple) -> tuple:
            _require_growth("cq_durable_pos", old[1], pos)
            _require_order("cq_durable_pos", pos, "dispatched_pos", old[0])
            return (old[0], pos, old[2])
        self._update(DISPATCHER_GROUP_OFFSET, DISPATCHER_GROUP, update)

    def publish_shard(self, shard: int, processed_pos: int, durable_pos: int) -> None:
        """Index builder `shard` processed records below `processed_pos`, flushed below
        `durable_pos`."""
        def update(old: tuple) -> tuple:
            _require_growth(f"shard {shard} processed_pos", old[0], processed_pos)
            _require_growth(f"shard {shard} durable_pos", old[1], durable_pos)
            _require_order(f"shard {shard} durable_pos", durable_pos, "processed_pos",
                           processed_pos)
            return (processed_pos, durable_pos)
        self._update(self._shard_offset(shard), SHARD_GROUP, update)

    def reset_dispatcher(self, dispatched_pos: int, cq_durable_pos: int, *,
                         dispatched_msgs: int | None = None) -> None:
        """Set the dispatcher's positions, backwards allowed (a restarted dispatcher's start)."""
        _require_order("cq_durable_pos", cq_durable_pos, "dispatched_pos", dispatched_pos)
        self._update(DISPATCHER_GROUP_OFFSET, DISPATCHER_GROUP, lambda old: (
            dispatched_pos, cq_durable_pos, old[2] if dispatched_msgs is None else dispatched_msgs))

    def reset_shard(self, shard: int, processed_pos: int, durable_pos: int) -> None:
        """Set a shard's positions, backwards allowed (a restarted builder's start)."""
        _require_order(f"shard {shard} durable_pos", durable_pos, "processed_pos", processed_pos)
        self._update(self._shard_offset(shard), SHARD_GROUP,
                     lambda old: (processed_pos, durable_pos))

    def reset_positions(self, positions: Positions) -> None:
        """Write every group from `positions` (the supervisor, after recovery, before children)."""
        p = positions
        _require_order("flushed_pos", p.flushed_pos, "written_pos", p.written_pos)
        self._update(SUPERVISOR_GROUP_OFFSET, SUPERVISOR_GROUP, lambda old: (
            p.written_pos, p.flushed_pos, p.appended_msgs, p.flush_count,
            p.last_flush_latency_ns, p.last_flush_bytes))
        self.reset_dispatcher(p.dispatched_pos, p.cq_durable_pos,
                              dispatched_msgs=p.dispatched_msgs)
        for shard in range(self.shard_count):
            self.reset_shard(shard, p.shard_processed_pos[shard], p.shard_durable_pos[shard])

    def _shard_offset(self, shard: int) -> int:
        if not 0 <= shard < self.shard_count:
            raise ValueError(f"shard {shard} out of range 0..{self.shard_count - 1}")
        return SHARD_GROUPS_OFFSET + shard * GROUP_SIZE

    def _read(self, offset: int, layout: struct.Struct) -> tuple:
        return seqlock.read_consistent(self._buf, offset, layout)

    @property
    def written_pos(self) -> int:
        return self._read(SUPERVISOR_GROUP_OFFSET, SUPERVISOR_GROUP)[0]

    @property
    def flushed_pos(self) -> int:
        return self._read(SUPERVISOR_GROUP_OFFSET, SUPERVISOR_GROUP)[1]

    @property
    def readable_pos(self) -> int:
        """The first commit position a reader must not read yet: flushed under sync flush (only
        acknowledged records), written under async."""
        return self.flushed_pos if self.flush_policy is FlushPolicy.SYNC else self.written_pos

    @property
    def dispatched_pos(self) -> int:
        return self._read(DISPATCHER_GROUP_OFFSET, DISPATCHER_GROUP)[0]

    def snapshot(self) -> Positions:
        """Every group read consistently (each group on its own, not all at one instant)."""
        sup = self._read(SUPERVISOR_GROUP_OFFSET, SUPERVISOR_GROUP)
        dis = self._read(DISPATCHER_GROUP_OFFSET, DISPATCHER_GROUP)
        shards = [self._read(SHARD_GROUPS_OFFSET + i * GROUP_SIZE, SHARD_GROUP)
                  for i in range(self.shard_count)]
        return Positions(
            written_pos=sup[0], flushed_pos=sup[1], dispatched_pos=dis[0], cq_durable_pos=dis[1],
            shard_processed_pos=tuple(s[0] for s in shards),
            shard_durable_pos=tuple(s[1] for s in shards),
            appended_msgs=sup[2], flush_count=sup[3], last_flush_latency_ns=sup[4],
            last_flush_bytes=sup[5], dispatched_msgs=dis[2])

    # -- put statuses ----------------------------------------------------------------------------
    def count_put_statuses(self, counts: Mapping[PutStatus, int]) -> None:
        """Add failed puts' answers by status (not PUT_OK, which appended_msgs counts)."""
        if PutStatus.PUT_OK in counts:
            raise ValueError("PUT_OK is counted by appended_msgs, not here")

        def update(old: tuple) -> tuple:
            new = list(old)
            for status, count in counts.items():
                new[PutStatus(status) - 1] += count
            return tuple(new)
        self._update(PUT_STATUS_GROUP_OFFSET, PUT_STATUS_GROUP, update)

    def put_status_counts(self) -> dict[PutStatus, int]:
        """Answers per PutStatus since the supervisor started, PUT_OK included."""
        counts = self._read(PUT_STATUS_GROUP_OFFSET, PUT_STATUS_GROUP)
        appended = self._read(SUPERVISOR_GROUP_OFFSET, SUPERVISOR_GROUP)[2]
        failed = {PutStatus(i + 1): count for i, count in enumerate(counts)}
        return {PutStatus.PUT_OK: appended - failed[PutStatus.FLUSH_DISK_TIMEOUT], **failed}

    # -- put latency -----------------------------------------------------------------------------
    def add_put_latencies(self, tally: LatencyTally) -> None:
        """Add one answered batch's latencies (one group write per batch, not per request)."""
        def update(old: tuple) -> tuple:
            new = list(old)
            for bucket in tally.buckets:
                new[bucket] += 1
            new[-1] += tally.sum_ns
            return new
        self._update(PUT_LATENCY_GROUP_OFFSET, LATENCY_GROUP, update)

    def put_latency(self) -> LatencyHistogram:
        """The put latency counters since the supervisor started."""
        return LatencyHistogram.from_group(self._read(PUT_LATENCY_GROUP_OFFSET, LATENCY_GROUP))

    # -- process slots ---------------------------------------------------------------------------
    def claim_process_slot(self, index: int, role: Role, shard: int, pid: int) -> None:
        """Record that `pid` now runs in slot `index` (state BOOTING). Supervisor only.

        A claim over a slot that held the same role and shard counts as a restart."""
        def update(old: tuple) -> tuple:
            restarts = old[5] + 1 if old[0] and (old[1], old[2]) == (role, shard) else 0
            return (pid, Role(role), shard, self.generation, time.time_ns(), restarts)
        self._update(self._slot_offset(index), SLOT_IDENTITY, update)
        self.set_process_state(index, ProcState.BOOTING)
        self.heartbeat(index)

    def heartbeat(self, index: int) -> None:
        """Stamp slot `index` with time.monotonic_ns() (one aligned 8-byte store)."""
        seqlock.store_word(self._buf, self._slot_offset(index) + SLOT_HEARTBEAT_OFFSET,
                           time.monotonic_ns(), "q")

    def set_process_state(self, index: int, state: ProcState) -> None:
        seqlock.store_word(self._buf, self._slot_offset(index) + SLOT_STATE_OFFSET,
                           int(ProcState(state)), "I")

    def process_slot(self, index: int) -> ProcessSlot | None:
        """Snapshot of slot `index`, or None if it was never claimed."""
        offset = self._slot_offset(index)
        pid, role, shard, generation, started_ns, restarts = seqlock.read_consistent(
            self._buf, offset, SLOT_IDENTITY)
        if pid == 0:
            return None
        (state,) = STATE_WORD.unpack_from(self._buf, offset + SLOT_STATE_OFFSET)
        (heartbeat_ns,) = I64_WORD.unpack_from(self._buf, offset + SLOT_HEARTBEAT_OFFSET)
        return ProcessSlot(index, pid, Role(role), shard, generation, ProcState(state),
                           heartbeat_ns, started_ns, restarts)

    def process_slots(self) -> list[ProcessSlot]:
        """Snapshots of every claimed slot, in slot order."""
        slots = (self.process_slot(i) for i in range(PROCESS_SLOT_COUNT))
        return [slot for slot in slots if slot is not None]

    def _slot_offset(self, index: int) -> int:
        if not 0 <= index < PROCESS_SLOT_COUNT:
            raise ValueError(f"process slot {index} out of range 0..{PROCESS_SLOT_COUNT - 1}")
        return PROCESS_SLOTS_OFFSET + index * SLOT_SIZE

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        self._buf = None
        self.region.close()

    def unlink(self) -> None:
        """Remove the region name (creator only); attached processes keep their mapping."""
        self.region.unlink()

    def __enter__(self) -> ControlBlock:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _validate_header(region: SharedRegion) -> None:
    if region.size_bytes < HEADER_SIZE:
        raise StoreError(f"control block {region.name} is {region.size_bytes} bytes, too small")
    magic, version, total_size = HEADER.unpack_from(region.buf, HEADER_OFFSET)[:3]
    if magic == b"\0" * 8:
        raise ServiceNotAvailableError(f"control block {region.name} is still being created",
                                       hint="retry in a moment")
    seqlock.order_fence()
    if magic != MAGIC:
        raise StoreError(f"{region.name} is not an mqstore control block (magic {magic!r})")
    if version != LAYOUT_VERSION:
        raise FormatVersionError(f"control block layout version {version}; this mqstore speaks "
                                 f"{LAYOUT_VERSION}", hint="use the mqstore that started the store")
    if total_size != TOTAL_SIZE or region.size_bytes < TOTAL_SIZE:
        raise StoreError(f"control block {region.name} has size {region.size_bytes} "
                         f"(header says {total_size}), expected {TOTAL_SIZE}")


def remove_stale(store_dir: str | os.PathLike) -> int | None:
    """Unlink a leftover control block (the caller holds the store lock); its generation or None.

    Returns 0 when the leftover's header is unreadable."""
    try:
        name = region_name(store_dir, REGION_KIND)
    except ServiceNotAvailableError:
        return None  # no token file: no supervisor created a control block
    try:
        region = SharedRegion.attach(name)
    except ServiceNotAvailableError:
        return 0 if unlink_stale(name) else None
    try:
        _validate_header(region)
        generation = ControlBlock(region).generation
    except (StoreError, ValueError):
        generation = 0
    region.close()
    unlink_stale(name)
    return generation
