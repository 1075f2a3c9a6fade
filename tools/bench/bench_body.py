"""The bench message body: BODY_HEADER (magic, producer id, intended send time, sequence), then
random bytes. Producers build their batches of bodies here; consumers read the intended send times
back, so both measure latency from the same instant (see tools.bench.loadgen for the timing).
"""

from __future__ import annotations

import struct

import numpy as np

from tools.bench.worker_records import SendBatch, WorkerSpec

BODY_HEADER = struct.Struct("<4sIqq")  # magic, producer id, intended send time (ns), sequence
BODY_HEADER_DTYPE = np.dtype([("magic", "S4"), ("producer", "<u4"), ("intended_ns", "<i8"), ("seq", "<i8")])
assert BODY_HEADER_DTYPE.itemsize == BODY_HEADER.size and BODY_HEADER.format == "<4sIqq"  # one layout
BODY_MAGIC = b"MQB1"
MIN_BODY_BYTES = BODY_HEADER.size


class BatchBuilder:
    """Makes a producer's batches from one template: spec.batch bodies of BODY_HEADER + `tail`
    side by side in a numpy array whose header fields are written per batch (two whole-column
    writes), then cut into bytes objects by one tolist(). A batch of one is one BODY_HEADER.pack
    and `tail` (the same bytes; numpy's fixed cost is more than the body)."""

    def __init__(self, spec: WorkerSpec, tail: bytes):
        self.spec = spec
        body = BODY_HEADER.pack(BODY_MAGIC, spec.worker_id, 0, 0) + tail
        self._buffer = bytearray(body * spec.batch)  # (a structured copy would drop the tail bytes)
        self._rows = np.frombuffer(self._buffer, dtype=_body_dtype(len(body)))
        self._whole = self._rows.view(np.dtype((np.void, len(body))))
        self._seq_offsets = np.arange(spec.batch, dtype=np.int64)
        self._key_prefix = f"p{spec.worker_id}-" if spec.keys else None
        self._tail = tail

    def build(self, seq: int, intended_ns: int) -> SendBatch:
        """Messages seq..seq+batch-1 of this producer, bodies stamped with `intended_ns`."""
        spec, rows = self.spec, self._rows
        if spec.batch == 1:
            return SendBatch(spec.streams, (spec.worker_id + seq) % len(spec.streams),
                             [BODY_HEADER.pack(BODY_MAGIC, spec.worker_id, intended_ns, seq) + self._tail],
                             None if self._key_prefix is None else [f"{self._key_prefix}{seq}"])
        rows["intended_ns"] = intended_ns
        rows["seq"] = self._seq_offsets + seq
        keys = (list(map(self._key_prefix.__add__, map(str, range(seq, seq + spec.batch))))
                if self._key_prefix is not None else None)
        return SendBatch(spec.streams, (spec.worker_id + seq) % len(spec.streams), self._whole.tolist(),
                         keys)


def _body_dtype(size_bytes: int) -> np.dtype:
    """A bench body of `size_bytes` as a numpy record: BODY_HEADER's fields, then the tail."""
    names = list(BODY_HEADER_DTYPE.names)
    return np.dtype({"names": names, "formats": [BODY_HEADER_DTYPE.fields[n][0] for n in names],
                     "offsets": [BODY_HEADER_DTYPE.fields[n][1] for n in names], "itemsize": size_bytes})


def build_batch(spec: WorkerSpec, seq: int, intended_ns: int, tail: bytes) -> SendBatch:
    """Messages seq..seq+batch-1 of this producer, bodies stamped with `intended_ns`."""
    return BatchBuilder(spec, tail).build(seq, intended_ns)


def intended_times(bodies: list[bytes]) -> np.ndarray:
    """The intended send times stamped in bench bodies (others are skipped)."""
    unpack = BODY_HEADER.unpack_from
    stamps = [unpack(body)[2] for body in bodies
              if len(body) >= MIN_BODY_BYTES and body[:4] == BODY_MAGIC]
    return np.asarray(stamps, dtype=np.int64)


def intended_times_of_heads(heads: np.ndarray) -> np.ndarray:
    """intended_times of bodies given as their first BODY_HEADER.size bytes, an (n, size) uint8
    array (one row per body at least that long): whole-array, bodies without BODY_MAGIC skipped."""
    fields = np.ascontiguousarray(heads).view(BODY_HEADER_DTYPE).reshape(len(heads))
    return fields["intended_ns"][fields["magic"] == BODY_MAGIC].astype(np.int64)
