"""The distributed fsck (`mqstore spark check`): engine.check.fsck's checks as Spark jobs.

1. Records: every record is decoded with every CRC (the source's `verify=report`); bad ones
   are CORRUPT_RECORD, or TORN_TAIL when nothing valid follows them.
2. Consume queues: every entry file is read by a task; entries and consumable records (a
   record with a bad CRC but sound structure included: no knock-on findings) are
   joined on (topic, queue id, queue offset): an entry without its record, a record without
   its entry, and differing commit_pos / size / tagsCode are findings; so are entries sharing
   a commit_pos. Entries below the log's first position are expired, not findings.
3. Index: every index file is read by a task, which keeps the entries its slot chains reach;
   every key of every record must be among them (shard, key hash, commit_pos), and every
   entry must belong to a record key. Records past a shard's durable position are skipped.
4. Checkpoint: every durable position must be a record boundary at or before the data end.
Findings are engine.check.fsck.Finding values (the same kinds `mqstore check` reports).
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engine.check.findings import Finding, FindingKind
from engine.errors import CheckpointError
from engine.files.naming import CHECKPOINT_FILE, CONSUMEQUEUE_DIR, INDEX_DIR
from engine.formats.checkpoint import decode_checkpoint
from engine.formats.cq_entry import CQ_DTYPE, CQ_ENTRY_SIZE, FILLER_SIZE_MARK
from engine.formats.index_file import (
    INDEX_HEADER_SIZE,
    decode_index_header,
    entry_pos,
    index_file_size,
    index_key_hash_of,
    shard_of,
)
from engine.record_rules import ENTERS_CONSUME_QUEUE_SQL, SCHEDULED_TAG_FIELD, SPARK_SQL, render_tag_field
from tools.spark.layout import StoreFormat, StoreLayout, read_layout
from tools.spark.session import read_store
from tools.spark.tasks import flat_map, flat_map_items

Say = Callable[[str], None]
MAX_FINDINGS_PER_KIND = 50
KEY_ROWS_DDL = "shard int, key_hash int, commit_pos long, key string"
ENTRY_DDL = "topic string, queue_id int, queue_offset long, e_pos long, e_size int, e_tags long, path string"
FOUND_DDL = "shard int, key_hash int, commit_pos long, problem string, path string"
_ENTRY_DTYPE = np.dtype([("key_hash", ">i4"), ("commit_pos", ">i8"), ("time_diff_s", ">i4"),
                         ("prev_index", ">i4")])


@dataclass
class CheckReport:
    store: str
    store_kind: str
    records: int = 0
    bytes: int = 0
    data_end_pos: int = 0
    cq_entries: int = 0
    index_entries: int = 0
    findings: list[Finding] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict:
        return {"store": self.store, "store_kind": self.store_kind, "ok": self.ok, "records": self.records,
                "bytes": self.bytes, "data_end_pos": self.data_end_pos, "cq_entries": self.cq_entries,
                "index_entries": self.index_entries, "duration_s": round(self.duration_s, 3),
                "findings": [{"kind": f.kind.value, "path": f.path, "detail": f.detail, "pos": f.pos}
                             for f in self.findings]}


def check(spark, store: str | Path, *, say: Say = lambda _: None) -> CheckReport:
    """Verify `store` with Spark, read-only; an empty findings list means it is consistent."""
    started = time.monotonic()
    root = Path(store).resolve()
    layout = read_layout(root)
    report = CheckReport(str(root), layout.format.value)
    say("check: records (every CRC)")
    records = read_store(spark, str(root), view="dispatch", verify="report").persist()
    try:
        _check_records(records, layout, report)
        if layout.format is StoreFormat.MQSTORE:
            # A record whose CRC fails but whose structure holds still has its entry and keys:
            # matching them keeps one bad record one finding, as engine.check.fsck reports it.
            valid = records.where("topic IS NOT NULL")
            say("check: consume queues against the commitlog")
            _check_queues(spark, valid, root, layout, report)
            say("check: index coverage of every key")
            _check_index(spark, valid, root, layout, report)
            _check_checkpoint(valid, root, layout, report)
    finally:
        records.unpersist()
    report.duration_s = time.monotonic() - started
    return report


def _add(report: CheckReport, kind: FindingKind, path: str, detail: str, pos: int | None = None) -> None:
    if sum(f.kind is kind for f in report.findings) < MAX_FINDINGS_PER_KIND:
        report.findings.append(Finding(kind, str(path), detail, pos))


def _check_records(records, layout: StoreLayout, report: CheckReport) -> None:
    totals = records.where("topic IS NOT NULL").selectExpr(
        "count(*) AS n", "sum(size) AS bytes", "max(commit_pos + size) AS data_end").first()
    report.records, report.bytes = int(totals.n), int(totals.bytes or 0)
    report.data_end_pos = int(totals.data_end or layout.min_pos)
    for row in records.where("error IS NOT NULL").orderBy("commit_pos").limit(1000).collect():
        path = _segment_path(layout, row.commit_pos)
        if row.topic is None and row.commit_pos >= report.data_end_pos:
            _add(report, FindingKind.TORN_TAIL, path, f"bytes after the last valid record: {row.error}",
                 row.commit_pos)
        else:
            _add(report, FindingKind.CORRUPT_RECORD, path, row.error, row.commit_pos)


def _segment_path(layout: StoreLayout, commit_pos: int) -> str:
    for seg in layout.segments:
        if seg.base_pos <= commit_pos < seg.base_pos + layout.segment_bytes:
            return seg.path
    return str(Path(layout.root) / "commitlog")


# ------------------------------------------------------------------------ consume queues


def _queue_files(root: Path) -> list[tuple[str, int, str]]:
    out = []
    base = root / CONSUMEQUEUE_DIR
    for topic_dir in sorted(base.iterdir()) if base.is_dir() else ():
        for queue_dir in sorted(topic_dir.iterdir()) if topic_dir.is_dir() else ():
            if queue_dir.name.isdigit():
                out += [(topic_dir.name, int(queue_dir.name), str(p)) for p in sorted(queue_dir.iterdir())]
    return out


def read_queue_file(item: tuple[str, int, str]) -> list[tuple]:
    """Executor side: the written, non-filler entries of one consume-queue file."""
    topic, queue_id, path = item
    entries = np.fromfile(path, dtype=CQ_DTYPE, count=os.path.getsize(path) // CQ_ENTRY_SIZE)
    first = int(Path(path).name) // CQ_ENTRY_SIZE
    keep = np.flatnonzero((entries["size"] > 0) & (entries["size"] != FILLER_SIZE_MARK)
                          & (entries["commit_pos"] >= 0))
    return [(topic, queue_id, first + int(i), int(entries["commit_pos"][i]), int(entries["size"][i]),
             int(entries["tags_code"][i]), path) for i in keep]


def _check_queues(spark, valid, root: Path, layout: StoreLayout, report: CheckReport) -> None:
    entries = flat_map_items(spark, _queue_files(root), "topic string, queue_id int, path string",
                             read_queue_file, ENTRY_DDL)
    entries = entries.where(f"e_pos >= {layout.min_pos}").persist()
    try:
        per_pos = entries.groupBy("e_pos").count().selectExpr(
            "sum(count) AS entries", "slice(collect_list(IF(count > 1, struct(e_pos, count), NULL)), 1, 100) "
            "AS dupes").first()
        report.cq_entries = int(per_pos.entries or 0)
        tag_field = render_tag_field(SCHEDULED_TAG_FIELD, SPARK_SQL, layout.delay_levels_ms)
        expected = valid.where(ENTERS_CONSUME_QUEUE_SQL).selectExpr(
            "topic", "queue_id", "queue_offset", "commit_pos", "size", f"{tag_field} AS tags_code")
        joined = expected.join(entries, ["topic", "queue_id", "queue_offset"], "full_outer").where(
            "commit_pos IS NULL OR e_pos IS NULL OR commit_pos != e_pos OR size != e_size "
            "OR tags_code != e_tags").orderBy("topic", "queue_id", "queue_offset").limit(1000).collect()
        for r in joined:
            _queue_finding(report, root, r)
        for r in per_pos.dupes:
            _add(report, FindingKind.CQ_DUPLICATE, str(root / CONSUMEQUEUE_DIR),
                 f"{r['count']} entries point at commit_pos {r.e_pos}", r.e_pos)
    finally:
        entries.unpersist()


def _queue_finding(report: CheckReport, root: Path, r) -> None:
    where = f"{r.topic}/{r.queue_id} offset {r.queue_offset}"
    if r.e_pos is None:
        _add(report, FindingKind.CQ_MISSING_ENTRY, str(root / CONSUMEQUEUE_DIR / r.topic / str(r.queue_id)),
             f"{where}: the record at {r.commit_pos} has no entry", r.commit_pos)
    elif r.commit_pos is None:
        kind = FindingKind.CQ_PAST_END if r.e_pos >= report.data_end_pos else FindingKind.CQ_ENTRY_MISMATCH
        _add(report, kind, r.path, f"{where}: entry points at {r.e_pos}, where no record of this queue "
             "offset starts", r.e_pos)
    else:
        _add(report, FindingKind.CQ_ENTRY_MISMATCH, r.path,
             f"{where}: entry ({r.e_pos}, {r.e_size}, {r.e_tags}) but record ({r.commit_pos}, "
             f"{r.size}, {r.tags_code})", r.commit_pos)


# ---------------------------------------------------------------------------------- index


def _index_files(root: Path, shards: int) -> list[tuple[int, str]]:
    out = []
    for shard in range(shards):
        directory = root / INDEX_DIR / str(shard)
        if directory.is_dir():
            out += [(shard, str(p)) for p in sorted(directory.iterdir())]
    return out


def read_index_file(slot_count: int, entry_count: int, item: tuple[int, str]) -> list[tuple]:
    """Executor side: (shard, key_hash, commit_pos, None, path) for every entry its slot chain
    reaches; a problem row (shard, 0, -1, problem, path) for an unreadable file or bad chain."""
    shard, path = item
    raw = np.fromfile(path, dtype=np.uint8)
    if len(raw) != index_file_size(slot_count, entry_count):
        return [(shard, 0, -1, f"file is {len(raw)} bytes, expected "
                 f"{index_file_size(slot_count, entry_count)}", path)]
    header = decode_index_header(raw[:INDEX_HEADER_SIZE].tobytes())
    count = max(header.index_count, 1)
    if count > entry_count:
        return [(shard, 0, -1, f"index_count {count} > {entry_count}", path)]
    heads = np.frombuffer(raw, dtype=">i4", count=slot_count, offset=INDEX_HEADER_SIZE).astype(np.int64)
    entries = np.frombuffer(raw, dtype=_ENTRY_DTYPE, count=count, offset=entry_pos(slot_count, 0))
    reached, problem = _walk_chains(heads, entries, slot_count, count)
    rows = [(shard, 0, -1, problem, path)] if problem else []
    idx = np.flatnonzero(reached)
    rows += [(shard, int(entries["key_hash"][i]), int(entries["commit_pos"][i]), None, path) for i in idx]
    return rows


def _walk_chains(heads: np.ndarray, entries: np.ndarray, slot_count: int,
                 count: int) -> tuple[np.ndarray, str | None]:
    """Follow every slot's chain at once; mark the entries reached from their own slot."""
    reached = np.zeros(count, dtype=bool)
    prev = entries["prev_index"].astype(np.int64)
    slot_of_entry = entries["key_hash"].astype(np.int64) % slot_count
    if ((heads < 0) | (heads >= count)).any():
        return reached, "a slot head points outside the written entries"
    slots = np.flatnonzero(heads)
    cur = heads[slots]
    problem = None
    for _ in range(count):
        if not len(cur):
            break
        wrong = slot_of_entry[cur] != slots
        if wrong.any() and problem is None:
            problem = f"{int(wrong.sum())} entries sit in the chain of another slot"
        reached[cur[~wrong]] = True
        nxt = prev[cur]
        ok = (nxt > 0) & (nxt < cur)
        if ((nxt != 0) & ~ok).any() and problem is None:
            problem = "a chain link points forward or outside the file"
        slots, cur = slots[ok], nxt[ok]
    return reached, problem


def expected_key_rows(shards: int, row: tuple) -> Iterator[tuple]:
    """Executor side: (shard, key hash, commit_pos, `topic#key`) for each index key of a record
    (commit_pos, topic, index_keys)."""
    commit_pos, topic, keys = row
    for key in keys:
        yield shard_of(topic, key, shards), index_key_hash_of(topic, key), commit_pos, f"{topic}#{key}"


def _check_index(spark, valid, root: Path, layout: StoreLayout, report: CheckReport) -> None:
    reader = functools.partial(read_index_file, layout.index_slot_count, layout.index_entry_count)
    found = flat_map_items(spark, _index_files(root, layout.index_shards), "shard int, path string", reader,
                           FOUND_DDL).persist()
    try:
        for r in found.where("problem IS NOT NULL").collect():
            _add(report, FindingKind.INDEX_FILE_CORRUPT, r.path, r.problem)
        found = found.where(f"problem IS NULL AND commit_pos >= {layout.min_pos}")
        report.index_entries = found.count()
        durable = _index_durable(root, layout.index_shards)
        keyed = valid.where("size(index_keys) > 0").select("commit_pos", "topic", "index_keys")
        key_rows = flat_map(keyed, functools.partial(expected_key_rows, layout.index_shards), KEY_ROWS_DDL)
        keys = key_rows.where(_durable_sql(durable))
        unmatched = keys.join(found.select("shard", "key_hash", "commit_pos", "path"),
                              ["shard", "key_hash", "commit_pos"], "full_outer")
        for r in unmatched.where("key IS NULL OR path IS NULL").orderBy("commit_pos").limit(2000).collect():
            if r.path is None:
                _add(report, FindingKind.INDEX_KEY_MISSING, str(root / INDEX_DIR / str(r.shard)),
                     f"key {r.key!r} of the record at {r.commit_pos} is not found", r.commit_pos)
            else:
                _add(report, FindingKind.INDEX_ENTRY_UNRESOLVED, r.path,
                     f"entry (hash {r.key_hash}, commit_pos {r.commit_pos}) belongs to no record key",
                     r.commit_pos)
    finally:
        found.unpersist()


def _index_durable(root: Path, shards: int) -> list[int | None]:
    try:
        cp = decode_checkpoint((root / CHECKPOINT_FILE).read_bytes())
    except (FileNotFoundError, CheckpointError):
        return [None] * shards
    known = list(cp.index_durable_pos)
    return [known[i] if i < len(known) else None for i in range(shards)]


def _durable_sql(durable: list[int | None]) -> str:
    """Rows of shards whose durable position covers them (no checkpoint: every row)."""
    parts = [f"(shard = {i} AND commit_pos < {pos})" if pos is not None else f"shard = {i}"
             for i, pos in enumerate(durable)]
    return " OR ".join(parts) if parts else "true"


# ----------------------------------------------------------------------------- checkpoint


def _check_checkpoint(valid, root: Path, layout: StoreLayout, report: CheckReport) -> None:
    path = root / CHECKPOINT_FILE
    try:
        cp = decode_checkpoint(path.read_bytes())
    except FileNotFoundError:
        return
    except CheckpointError as exc:
        _add(report, FindingKind.CHECKPOINT_UNREADABLE, str(path), exc.message)
        return
    named = {"commitlog_flushed_pos": cp.commitlog_flushed_pos, "cq_durable_pos": cp.cq_durable_pos}
    named |= {f"index_durable_pos[{i}]": p for i, p in enumerate(cp.index_durable_pos)}
    wanted = sorted(set(named.values()))
    matched = {r.p for r in valid.selectExpr("explode(array(commit_pos, commit_pos + size)) AS p")
               .where(f"p IN ({', '.join(map(str, wanted))})").distinct().collect()}
    matched |= {layout.min_pos} | {s.base_pos for s in layout.segments}
    for name, pos in named.items():
        if pos > report.data_end_pos:
            _add(report, FindingKind.CHECKPOINT_INCONSISTENT, str(path),
                 f"{name} {pos} is past the end of the data {report.data_end_pos}", pos)
        elif pos not in matched:
            _add(report, FindingKind.CHECKPOINT_INCONSISTENT, str(path), f"{name} {pos} is not a record "
                 "boundary", pos)
