"""The key ring: per index shard, the dispatcher hands the builder its keys' columns (DESIGN §4).

The dispatcher decodes every record anyway; it computes each key's index hash and shard once and
publishes, per shard, one *block* per run of records: the commitlog range [start_pos, end_pos)
the block covers and, for every key of that shard in it (record order, UNIQ_KEY first), its
key_hash, commit_pos and store_ts_ms (what ShardIndex.put_hashes takes). One single-producer /
single-consumer ring per shard; the writer never waits: a full ring is overwritten and the
reader detects it. Nothing depends on the ring for correctness: a block is a fact about the
commitlog range it names, and the index builder falls back to scanning the commitlog for any
range the ring cannot give it (workers/index_builder.py). See docs/DECISIONS.md#key-ring.

Region kind 'keyring' (mode 0o600), created by the first dispatcher, adopted by a restarted
one, removed by the dispatcher that stops (or by a builder that stops after the dispatcher
died; the next supervisor start removes any leftover). Little-endian:

    offset          size   field
    0               64     header: magic 8s b'MQSTKEYR', layout_version u32, shard_count u32,
                           block_slots u32, key_slots u32, generation u32 (the control block's),
                           pad | writer_pid i32 @32 | retired u32 @36 (1: replaced, re-attach)
    64 + i*R        R      ring of shard i, R = ring_size_bytes(block_slots, key_slots):
      +0            64       next_block u64 @0, key_reserve u64 @8 (writer words)
      +64           64*B     block slot b % B: seq u64 | start_pos i64, end_pos i64,
                             first_key u64, key_count u64 | pad 24
      +64+64*B      8*K x 3  key_hash i64[K], commit_pos i64[K], store_ts_ms i64[K]

B = 1024 block slots, K = default_key_slots(shard_count) (2**17 keys over all rings, at least
2**13 each: 3 MiB for 2 shards), every page allocated at create (posix_fallocate).

Keys are numbered from 0 across the ring's life; key n lives at n % K. Block b lives in slot
b % B; its seq is 2b+1 while being written and 2b+2 once published. Writer, per block:
key_reserve = first_key + count (before any key is overwritten), the key columns, seq = 2b+1,
the fields, seq = 2b+2, next_block = b+1; every word by seqlock.store_word (one aligned store).
Reader of block b: seq == 2b+2 before and after the fields (below: not yet published; above:
overwritten), then the keys, then key_reserve - K <= first_key (none of them was overwritten
while or before it copied). seqlock.order_fence between the steps (a no-op on x86-64).
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

import numpy as np

from engine.errors import ServiceNotAvailableError, StoreError
from ipc.control_block import pid_alive
from ipc.seqlock import order_fence, store_word
from ipc.shm import SHM_DIR, SharedRegion, region_name, region_path, unlink_stale

MAGIC = b"MQSTKEYR"
LAYOUT_VERSION = 1
REGION_KIND = "keyring"
DEFAULT_BLOCK_SLOTS = 1024
KEY_SLOTS_TOTAL = 1 << 17  # keys over all shards' rings (3 MiB): seconds of keys at full rate
MIN_KEY_SLOTS = 1 << 13

HEADER = struct.Struct("<8sIIIII")  # magic, layout_version, shard_count, block_slots, key_slots, generation
HEADER_SIZE = 64
WRITER_PID_OFFSET = 32
RETIRED_OFFSET = 36
RING_HEADER_SIZE = 64
NEXT_BLOCK_OFFSET = 0
KEY_RESERVE_OFFSET = 8
BLOCK = struct.Struct("<qqQQ")  # start_pos, end_pos, first_key, key_count (after the seq word)
BLOCK_SLOT_SIZE = 64
SEQ_SIZE = 8
KEY_COLUMNS = 3  # key_hash, commit_pos, store_ts_ms
KEY_SIZE = 8

assert HEADER.size <= WRITER_PID_OFFSET and RETIRED_OFFSET + 4 <= HEADER_SIZE
assert SEQ_SIZE + BLOCK.size <= BLOCK_SLOT_SIZE


def default_key_slots(shard_count: int) -> int:
    """Key slots per ring: each shard gets about 1/shard_count of the keys."""
    return max(MIN_KEY_SLOTS, KEY_SLOTS_TOTAL // max(1, shard_count))


def ring_size_bytes(block_slots: int, key_slots: int) -> int:
    """Bytes of one shard's ring."""
    return RING_HEADER_SIZE + block_slots * BLOCK_SLOT_SIZE + KEY_COLUMNS * KEY_SIZE * key_slots


def region_size_bytes(shard_count: int, block_slots: int, key_slots: int) -> int:
    return HEADER_SIZE + shard_count * ring_size_bytes(block_slots, key_slots)


class KeyBlock(NamedTuple):
    """One published block: the keys of one shard among the records of [start_pos, end_pos)."""

    block_no: int
    start_pos: int
    end_pos: int
    key_hash: np.ndarray
    commit_pos: np.ndarray
    store_ts_ms: np.ndarray


class _Ring:
    """Numpy views of one shard's ring inside the region."""

    def __init__(self, buf: memoryview, offset: int, block_slots: int, key_slots: int):
        self.buf = buf
        self.offset = offset
        self.block_slots = block_slots
        self.key_slots = key_slots
        self.slots_offset = offset + RING_HEADER_SIZE
        self.seq = np.ndarray((block_slots,), dtype="<u8", buffer=buf, offset=self.slots_offset,
                              strides=(BLOCK_SLOT_SIZE,))
        keys_offset = self.slots_offset + block_slots * BLOCK_SLOT_SIZE
        self.columns = tuple(np.frombuffer(buf, dtype="<i8", count=key_slots,
                                           offset=keys_offset + i * KEY_SIZE * key_slots)
                             for i in range(KEY_COLUMNS))
        self.words = np.frombuffer(buf, dtype="<u8", count=2, offset=offset)  # next_block, key_reserve

    def slot_offset(self, block_no: int) -> int:
        return self.slots_offset + (block_no % self.block_slots) * BLOCK_SLOT_SIZE


class KeyRing:
    """The mapped key-ring region of a store: one ring per index shard."""

    def __init__(self, region: SharedRegion):
        self.region = region
        _magic, _version, shard_count, block_slots, key_slots, generation = HEADER.unpack_from(region.buf, 0)
        self.shard_count = shard_count
        self.block_slots = block_slots
        self.key_slots = key_slots
        self.generation = generation
        ring_bytes = ring_size_bytes(block_slots, key_slots)
        self._rings = [_Ring(region.buf, HEADER_SIZE + i * ring_bytes, block_slots, key_slots)
                       for i in range(shard_count)]
        self._flags = np.frombuffer(region.buf, dtype="<i4", count=2, offset=WRITER_PID_OFFSET)

    # -- lifetime ------------------------------------------------------------------------------
    @classmethod
    def create(cls, store_dir: str | os.PathLike, shard_count: int, generation: int, *,
               block_slots: int = DEFAULT_BLOCK_SLOTS, key_slots: int | None = None) -> KeyRing:
        """Create the region (fails if one exists); this process is its writer. Its pages are
        allocated now, so a full /dev/shm is a StoreError here, not a SIGBUS later."""
        key_slots = default_key_slots(shard_count) if key_slots is None else key_slots
        _check_geometry(shard_count, block_slots, key_slots)
        name = region_name(store_dir, REGION_KIND)
        size_bytes = region_size_bytes(shard_count, block_slots, key_slots)
        region = SharedRegion.create(name, size_bytes)
        try:
            _allocate(name, size_bytes)
        except OSError as exc:
            region.close()
            unlink_stale(name)
            raise StoreError(f"no room for the key ring ({size_bytes} bytes) in {SHM_DIR}: {exc}",
                             hint="free space in /dev/shm; the index builders scan meanwhile") from None
        HEADER.pack_into(region.buf, 0, b"\0" * 8, LAYOUT_VERSION, shard_count, block_slots,
                         key_slots, generation)
        store_word(region.buf, WRITER_PID_OFFSET, os.getpid(), "i")
        order_fence()
        region.buf[0:len(MAGIC)] = MAGIC
        return cls(region)

    @classmethod
    def open_writer(cls, store_dir: str | os.PathLike, shard_count: int, generation: int, *,
                    block_slots: int = DEFAULT_BLOCK_SLOTS, key_slots: int | None = None) -> KeyRing:
        """The dispatcher's ring: adopt the region a previous dispatcher of this supervisor left
        (same generation and geometry), else replace whatever is there with a new one. The
        caller is the only writer (the supervisor runs one dispatcher at a time)."""
        name = region_name(store_dir, REGION_KIND)
        key_slots = default_key_slots(shard_count) if key_slots is None else key_slots
        try:
            ring = cls.attach(store_dir, generation)
        except StoreError:  # none, half-created, foreign or of another generation: replaced
            ring = None
        if ring is not None and (ring.shard_count, ring.block_slots, ring.key_slots) == (
                shard_count, block_slots, key_slots):
            store_word(ring.region.buf, WRITER_PID_OFFSET, os.getpid(), "i")
            return ring
        if ring is not None:
            ring.retire()
            ring.close()
        unlink_stale(name)
        return cls.create(store_dir, shard_count, generation, block_slots=block_slots, key_slots=key_slots)

    @classmethod
    def attach(cls, store_dir: str | os.PathLike, generation: int) -> KeyRing:
        """Map the store's ring (a builder); ServiceNotAvailableError while there is none or it
        is being created, StoreError if it is not a ring of this supervisor's generation."""
        region = SharedRegion.attach(region_name(store_dir, REGION_KIND))
        try:
            _validate_header(region, generation)
            return cls(region)
        except BaseException:
            region.close()
            raise

    @property
    def writer_pid(self) -> int:
        return int(self._flags[0])

    @property
    def retired(self) -> bool:
        """A newer dispatcher replaced this region: readers should attach again."""
        return bool(self._flags[1])

    def retire(self) -> None:
        store_word(self.region.buf, RETIRED_OFFSET, 1, "I")

    def remove(self) -> None:
        """Unlink the region name (the stopping dispatcher, creator or adopter); mappings stay."""
        unlink_stale(self.region.name)

    def remove_if_writer_gone(self) -> bool:
        """Unlink the region if its dispatcher is dead (a builder stopping after it); True if so."""
        if pid_alive(self.writer_pid):
            return False
        return unlink_stale(self.region.name)

    def close(self) -> None:
        self._rings = []
        self._flags = None
        self.region.close()

    # -- endpoints ----------------------------------------------------------------------------
    def writer(self, shard: int) -> RingWriter:
        return RingWriter(self._ring(shard))

    def reader(self, shard: int) -> RingReader:
        return RingReader(self._ring(shard))

    def _ring(self, shard: int) -> _Ring:
        if not 0 <= shard < self.shard_count:
            raise ValueError(f"shard {shard} out of range 0..{self.shard_count - 1}")
        return self._rings[shard]


class RingWriter:
    """The single writer of one shard's ring; it resumes after the blocks already there."""

    def __init__(self, ring: _Ring):
        self._ring = ring
        # a dead writer may have left block b half-written (seq 2b+1): b is rewritten first
        self.next_block = max(int(ring.words[0]), int(ring.seq.max()) // 2)
        self.key_reserve = int(ring.words[1])

    @property
    def max_block_keys(self) -> int:
        """The most keys one block may carry (half the ring, so a reader has time to copy it)."""
        return self._ring.key_slots // 2

    def publish(self, start_pos: int, end_pos: int, key_hash: np.ndarray, commit_pos: np.ndarray,
                store_ts_ms: np.ndarray) -> bool:
        """Publish the keys of [start_pos, end_pos); False (nothing published: the reader will
        find a gap and scan) when they are more than max_block_keys."""
        ring = self._ring
        buf = ring.buf
        count = len(key_hash)
        if count > self.max_block_keys:
            return False
        first = self.key_reserve
        if count:
            store_word(buf, ring.offset + KEY_RESERVE_OFFSET, first + count)
            order_fence()
            _write_wrapped(ring, first % ring.key_slots, (key_hash, commit_pos, store_ts_ms))
        block_no = self.next_block
        slot = ring.slot_offset(block_no)
        store_word(buf, slot, 2 * block_no + 1)
        order_fence()
        BLOCK.pack_into(buf, slot + SEQ_SIZE, start_pos, end_pos, first, count)
        order_fence()
        store_word(buf, slot, 2 * block_no + 2)
        store_word(buf, ring.offset + NEXT_BLOCK_OFFSET, block_no + 1)
        self.next_block, self.key_reserve = block_no + 1, first + count
        return True


class RingReader:
    """The single reader of one shard's ring: blocks in publication order, skipping those that
    end at or before a position without copying their keys. `overruns` counts the times the
    writer overwrote blocks it had not read (it then resumes at a newer block)."""

    def __init__(self, ring: _Ring):
        self._ring = ring
        published = int(ring.words[0])
        self.next_block = max(0, published - ring.block_slots + 1)  # the oldest that may remain
        self.overruns = 0

    def read(self, after_pos: int) -> KeyBlock | None:
        """The next published block that ends after `after_pos`, or None when the reader has
        reached the writer (or the writer is mid-write)."""
        ring = self._ring
        while True:
            block_no = self.next_block
            want = 2 * block_no + 2
            slot = ring.slot_offset(block_no)
            seq = int(ring.seq[block_no % ring.block_slots])
            if seq < want:
                return None
            order_fence()
            start_pos, end_pos, first, count = BLOCK.unpack_from(ring.buf, slot + SEQ_SIZE)
            order_fence()
            if seq > want or int(ring.seq[block_no % ring.block_slots]) != want:
                self._resync()
                continue
            if end_pos <= after_pos:
                self.next_block = block_no + 1
                continue
            order_fence()
            columns = _read_wrapped(ring, first % ring.key_slots, count)
            order_fence()
            if int(ring.words[1]) - ring.key_slots > first:
                self._resync()
                continue
            self.next_block = block_no + 1
            return KeyBlock(block_no, start_pos, end_pos, *columns)

    def read_continuing(self, end_pos: int, limit_pos: int) -> KeyBlock | None:
        """The next block if it starts exactly at `end_pos` and ends by `limit_pos` (it continues
        a block just read); else None, and the reader stays where it was."""
        next_block, overruns = self.next_block, self.overruns
        block = self.read(end_pos)
        if block is not None and block.start_pos == end_pos and block.end_pos <= limit_pos:
            return block
        self.next_block, self.overruns = next_block, overruns
        return None

    def _resync(self) -> None:
        """Blocks were overwritten before this reader got them: jump to a newer one."""
        self.overruns += 1
        published = int(self._ring.words[0])
        self.next_block = max(self.next_block + 1, published - self._ring.block_slots // 2)


def _write_wrapped(ring: _Ring, lo: int, values: tuple[np.ndarray, ...]) -> None:
    count = len(values[0])
    cut = min(count, ring.key_slots - lo)
    for column, value in zip(ring.columns, values, strict=True):
        column[lo:lo + cut] = value[:cut]
        if cut < count:
            column[:count - cut] = value[cut:]


def _read_wrapped(ring: _Ring, lo: int, count: int) -> tuple[np.ndarray, ...]:
    hi = lo + count
    if hi <= ring.key_slots:
        return tuple(column[lo:hi].copy() for column in ring.columns)
    return tuple(np.concatenate([column[lo:], column[:hi - ring.key_slots]]) for column in ring.columns)


def _allocate(name: str, size_bytes: int) -> None:
    fd = os.open(region_path(name), os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, size_bytes)
    finally:
        os.close(fd)


def _check_geometry(shard_count: int, block_slots: int, key_slots: int) -> None:
    if shard_count < 1 or block_slots < 2 or key_slots < 2:
        raise ValueError(f"key ring needs shard_count >= 1, block_slots >= 2, key_slots >= 2; got "
                         f"{shard_count}, {block_slots}, {key_slots}")


def _validate_header(region: SharedRegion, generation: int) -> None:
    if region.size_bytes < HEADER_SIZE:
        raise StoreError(f"key ring {region.name} is {region.size_bytes} bytes, too small")
    magic, version, shard_count, block_slots, key_slots, ring_generation = HEADER.unpack_from(region.buf, 0)
    if magic == b"\0" * 8:
        raise ServiceNotAvailableError(f"key ring {region.name} is still being created",
                                       hint="retry in a moment")
    order_fence()
    if magic != MAGIC or version != LAYOUT_VERSION:
        raise StoreError(f"{region.name} is not a key ring of layout {LAYOUT_VERSION} "
                         f"(magic {magic!r}, version {version})")
    if ring_generation != generation:
        raise StoreError(f"key ring {region.name} belongs to supervisor generation {ring_generation}, "
                         f"not {generation}")
    if region.size_bytes < region_size_bytes(shard_count, block_slots, key_slots):
        raise StoreError(f"key ring {region.name} has {region.size_bytes} bytes, less than its "
                         "header describes")
