"""The size crossovers of the hot paths: where plain Python (lists, struct) gives way to numpy.

Each rule is one function that picks its way inside by one of these numbers, so every crossover
lives here, once, beside what it decides and the measurement it rests on. Both ways of each rule
write the same bytes; tests hold them to it (docs/DECISIONS.md#small-batches-scalar).
"""

from __future__ import annotations

# Encoding, the request check, stamping and the appender's batch go record by record with struct
# up to this many records: numpy's fixed cost per call exceeds the per-record work of a few.
STRUCT_PATH_MAX_RECORDS = 24

# From this many body bytes per record on average, records are joined piece by piece instead of
# by one `%` of the whole batch (encode_many._join_records; the two cost the same near here).
JOIN_MIN_BODY_BYTES = 2048

# Up to this many UNIQ_KEY texts a comprehension makes them; from it numpy's hex digits are faster.
UNIQ_NUMPY_TEXTS_MIN = 32

# Up to this many rows a BatchResult's ok and status_counts count in Python: numpy's fixed cost is more.
BATCH_RESULT_FEW_ROWS = 16

# Up to this many keys IndexFile.put_hashes goes key by key (~1 us a key; the numpy path ~50 us).
FEW_INDEX_KEYS = 64

# Up to this many entries ConsumeQueue.put_entries packs an appended run with struct: from numpy
# columns the two cost the same near here (~23 us), from lists struct stays cheaper up to ~200
# (best of 300 puts of n entries on tmpfs, 2-core host under load: n=16 8 us vs 24 us from lists).
FEW_QUEUE_ENTRIES = 64

# A dispatcher backlog this small is dispatched in plain Python (engine.dispatch.few): ~3-4 us a
# record against the batch codec's ~0.25-0.35 ms fixed cost a step (tools.bench.probes.dispatch_step);
# 32 KiB holds at most ~250 of the smallest records, where the two cost about the same.
FEW_RECORDS_BYTES = 32 << 10

# Above this many stretches of one queue in a dispatch, rows are grouped by one numpy sort instead
# of joining the stretches in a Python loop.
QUEUE_GROUP_MAX_STRETCHES = 64

# find_starts walks this many records first, and walks on where they average WALK_MIN_AVG_BYTES:
# a step of the walk (~0.15 us) then costs less than the search's passes over every byte
# (~0.4 ns a byte: even at ~350-byte records; docs/benchmarks-history/2026-11-27-spark.md).
WALK_FIRST_RECORDS = 8
WALK_MIN_AVG_BYTES = 512

# Keys longer than this take one crc32c call each instead of the table of zero-run CRCs.
TABLE_KEY_MAX_BYTES = 512
# A key longer than this makes padded_key_hashes' padded matrix wasteful: it is hashed one by one.
PADDED_KEY_MAX_BYTES = 512
