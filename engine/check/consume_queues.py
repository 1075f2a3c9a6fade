"""`engine.check.fsck`, the consume-queue part: each queue's entries against the valid records.

Every consumable record has exactly one entry, at its queue offset, with its commit_pos, size
and tagsCode; every entry in [min_offset, max_offset) points at such a record; no entry points
past the end of the log; offsets are contiguous; no two entries share a commit_pos. Entries
below the log's min position are expired (retention deletes segments first), never corrupt.
Entries pointing into damage a salvage accepted (the damaged records' own entries and
placeholders, engine.recovery.salvage) are not matched against a record and may share a position.
A record without its entry that routine recovery re-dispatches is pending (engine.check.pending).
A deleted topic's records below its tombstone (engine.topics.table) need no entry, and its queues
that begin below the tombstone are the next open's to remove: neither is a finding.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from engine.check.commitlog import LogScan
from engine.check.findings import FindingKind, FindingList
from engine.check.pending import PendingWork
from engine.errors import SegmentLayoutError
from engine.files.mapped_file import Access, MappedFile
from engine.files.naming import CONSUMEQUEUE_DIR, is_topic_name, segment_files
from engine.formats.cq_entry import CQ_DTYPE, CQ_ENTRY_SIZE, FILLER_SIZE_MARK
from engine.queues.table import marked_queue_id
from engine.topics.table import TopicFileError, TopicTableFile

_QUEUE_KINDS = (FindingKind.CQ_ENTRY_MISMATCH, FindingKind.CQ_GAP, FindingKind.CQ_MISSING_ENTRY,
                FindingKind.CQ_DUPLICATE, FindingKind.CQ_PAST_END)


def check_queues(root: Path, entries_per_file: int, scan: LogScan, out: FindingList,
                 pending: PendingWork) -> None:
    """Every queue on disk and every queue the log's records name."""
    tombstones = _tombstones(root, out)
    consumable = scan.arrays["consumable"]
    saved = consumable.copy()
    try:
        for topic, floor in tombstones.items():  # a deleted topic's old records want no entry
            tid = scan.topic_ids.get(topic)
            if tid is not None:
                consumable[(scan.arrays["topic"] == tid) & (scan.arrays["pos"] < floor)] = False
        _check_all(root, entries_per_file, scan, out, pending, tombstones)
    finally:
        consumable[:] = saved


def _tombstones(root: Path, out: FindingList) -> dict[str, int]:
    """The topic table's tombstones; a bad topics.json is a finding (and none are honoured)."""
    topic_file = TopicTableFile(root)
    try:
        return dict(topic_file.load().tombstones)
    except TopicFileError as exc:
        out.add(FindingKind.LAYOUT, str(topic_file.path), exc.message)
        return {}


def _check_all(root: Path, entries_per_file: int, scan: LogScan, out: FindingList,
               pending: PendingWork, tombstones: dict[str, int]) -> None:
    on_disk = _queue_dirs(root / CONSUMEQUEUE_DIR, out)
    a = scan.arrays
    expected = {(topic, int(q)) for topic, tid in scan.topic_ids.items()
                for q in np.unique(a["queue_id"][(a["topic"] == tid) & a["consumable"]])}
    for topic, queue_id in sorted(set(on_disk) | expected):
        directory = on_disk.get((topic, queue_id),
                                root / CONSUMEQUEUE_DIR / topic / str(queue_id))
        entries, first = _read_queue(directory, entries_per_file, out)
        # a deleted topic's queue that the dispatcher or the next open removes is not checked
        if topic not in tombstones or not _begins_below(entries, tombstones[topic]):
            _check_queue(topic, queue_id, entries, first, scan, str(directory), out, pending)
        for kind in _QUEUE_KINDS:
            out.close_group(kind, directory)
        pending.close_group(FindingKind.CQ_MISSING_ENTRY, directory)


def _begins_below(entries: np.ndarray, floor: int) -> bool:
    """Whether a queue's first written entry points below `floor` (or it has none)."""
    written = np.flatnonzero(entries["size"] > 0)
    return not len(written) or int(entries["commit_pos"][written[0]]) < floor


def _queue_dirs(base: Path, out: FindingList) -> dict[tuple[str, int], Path]:
    found: dict[tuple[str, int], Path] = {}
    if not base.is_dir():
        return found
    for topic_dir in sorted(base.iterdir()):
        if not topic_dir.is_dir() or not is_topic_name(topic_dir.name):
            out.add(FindingKind.LAYOUT, topic_dir, "not a topic directory")
            continue
        for queue_dir in sorted(topic_dir.iterdir()):
            name = queue_dir.name
            if marked_queue_id(queue_dir) is not None:
                out.add(FindingKind.LAYOUT, queue_dir, "a recovery stopped while it rebuilt this queue; "
                        "the next start rebuilds it whole")
                continue
            if not (queue_dir.is_dir() and name.isdigit() and str(int(name)) == name):
                out.add(FindingKind.LAYOUT, queue_dir, "not a queue-id directory")
                continue
            found[(topic_dir.name, int(name))] = queue_dir
    return found



def _read_queue(directory: Path, entries_per_file: int, out: FindingList) -> tuple[np.ndarray, int]:
    """All entries from the first file to the end of the last as one array (missing or unreadable
    files read as zeros), and the queue offset of its first entry."""
    file_bytes = entries_per_file * CQ_ENTRY_SIZE
    files = segment_files(directory)  # the segments; what else the directory holds is a finding
    listed = {file.path.name for file in files}
    foreign = [name for name in os.listdir(directory) if name not in listed] if directory.is_dir() else []
    misaligned = [file.path.name for file in files if file.base_pos % file_bytes]
    for name in sorted(foreign + misaligned):
        out.add(FindingKind.LAYOUT, directory / name, "not a consume-queue file name")
    aligned = [file for file in files if not file.base_pos % file_bytes]
    if not aligned:
        return np.zeros(0, dtype=CQ_DTYPE), 0
    first_pos = aligned[0].base_pos
    entries = np.zeros((aligned[-1].base_pos + file_bytes - first_pos) // CQ_ENTRY_SIZE, dtype=CQ_DTYPE)
    raw = entries.view(np.uint8)
    for base_pos, path in aligned:
        try:
            mapped = MappedFile.open(path, Access.READ_ONLY, expected_bytes=file_bytes)
        except SegmentLayoutError as exc:
            out.add(FindingKind.LAYOUT, path, exc.message)
            continue
        at_byte = base_pos - first_pos
        # only the data: a read fault on a hole allocates it on tmpfs (a SIGBUS when it is full)
        for lo, hi in mapped.data_ranges():
            raw[at_byte + lo:at_byte + hi] = np.frombuffer(mapped.buf[lo:hi], dtype=np.uint8)
        mapped.close()
    return entries, first_pos // CQ_ENTRY_SIZE


def _check_queue(topic: str, queue_id: int, entries: np.ndarray, first: int, scan: LogScan,
                 path: str, out: FindingList, pending: PendingWork) -> None:
    cp = entries["commit_pos"].astype(np.int64)
    size = entries["size"].astype(np.int64)
    tags = entries["tags_code"].astype(np.int64)
    written = (cp != 0) | (size != 0) | (tags != 0)
    count = int(np.flatnonzero(written)[-1]) + 1 if written.any() else 0
    cp, size, tags, written = cp[:count], size[:count], tags[:count], written[:count]
    filler = (cp == 0) & (size == FILLER_SIZE_MARK) & (tags == 0)
    valid = (cp >= 0) & (size > 0) & ~filler
    live = valid & (cp >= scan.min_pos)
    start = int(np.argmax(live)) if live.any() else count  # min_offset - first
    head_ok = filler[:start] | valid[:start]  # below min_offset: fillers and expired entries
    _report_runs(out, FindingKind.CQ_GAP, path, first, np.flatnonzero(~head_ok),
                 "unwritten or invalid entries before the queue's first live entry")
    body = np.arange(start, count)
    _report_runs(out, FindingKind.CQ_GAP, path, first, body[~written[start:] | filler[start:]],
                 "unwritten entries inside the queue")
    for i in body[written[start:] & ~filler[start:] & ~live[start:]]:
        out.add(FindingKind.CQ_ENTRY_MISMATCH, path, f"offset {first + i}: entry ({cp[i]}, {size[i]}) "
                "is not a live entry (negative, empty or below the log start)", int(cp[i]))
    live_idx = body[live[start:]]
    at_bad = scan.at_damage(cp[live_idx])
    past = cp[live_idx] + size[live_idx] > scan.data_end
    for i in live_idx[past & ~at_bad]:  # a reference to a reported bad record is not reported again
        out.add(FindingKind.CQ_PAST_END, path, f"offset {first + i}: entry [{cp[i]}, +{size[i]}) ends "
                f"past the end of valid data {scan.data_end}", int(cp[i]))
    _match_entries(topic, queue_id, first, live_idx[~past & ~at_bad], cp, size, tags, scan, path, out)
    positions, counts = np.unique(cp[live_idx], return_counts=True)
    dup = (counts > 1) & ~scan.at_damage(positions)
    for pos in positions[dup]:  # placeholders of a salvage share their damaged span's start
        offsets = (first + live_idx[cp[live_idx] == pos]).tolist()
        out.add(FindingKind.CQ_DUPLICATE, path, f"offsets {offsets} all point at {pos}", int(pos))
    _report_missing(topic, queue_id, first, cp, live, scan, path, out, pending)


def _match_entries(topic: str, queue_id: int, first: int, idx: np.ndarray, cp, size, tags,
                   scan: LogScan, path: str, out: FindingList) -> None:
    """Each entry must point at the start of a consumable record of this queue and offset."""
    a = scan.arrays
    if len(idx) == 0:
        return
    tid = scan.topic_ids.get(topic, -1)
    rec = np.searchsorted(a["pos"], cp[idx])
    recc = np.minimum(rec, max(len(a["pos"]) - 1, 0))
    if len(a["pos"]) == 0:
        ok = np.zeros(len(idx), dtype=bool)
        hit = ok
    else:
        hit = a["pos"][recc] == cp[idx]
        ok = (hit & (a["topic"][recc] == tid) & (a["queue_id"][recc] == queue_id)
              & (a["queue_offset"][recc] == first + idx) & (a["size"][recc] == size[idx])
              & (a["tags_code"][recc] == tags[idx]) & a["consumable"][recc])
    for k in np.flatnonzero(~ok):
        i, r = idx[k], recc[k]
        if not hit[k]:
            what = "no valid record starts there"
        else:
            what = (f"the record there is {scan.topic_name(a['topic'][r])}/{a['queue_id'][r]} "
                    f"offset {a['queue_offset'][r]} size {a['size'][r]} tagsCode {a['tags_code'][r]}"
                    f"{'' if a['consumable'][r] else ' (not consumable)'}")
        out.add(FindingKind.CQ_ENTRY_MISMATCH, path, f"offset {first + i}: entry (pos {cp[i]}, size "
                f"{size[i]}, tagsCode {tags[i]}) does not match: {what}", int(cp[i]))


def _report_missing(topic: str, queue_id: int, first: int, cp, live, scan: LogScan, path: str,
                    out: FindingList, pending: PendingWork) -> None:
    """Consumable records of this queue whose offset holds no live entry with their position;
    those recovery re-dispatches go to `pending`."""
    a = scan.arrays
    tid = scan.topic_ids.get(topic, -1)
    mine = (a["topic"] == tid) & (a["queue_id"] == queue_id) & a["consumable"]
    offsets, positions = a["queue_offset"][mine], a["pos"][mine]
    at = offsets - first
    inside = (at >= 0) & (at < len(cp))
    atc = np.clip(at, 0, max(len(cp) - 1, 0))
    present = inside & (live[atc] if len(cp) else False) & (cp[atc] == positions if len(cp) else False)
    order = np.argsort(offsets[~present], kind="stable")
    missing_offsets, missing_pos = offsets[~present][order], positions[~present][order]
    redispatched = pending.cq_covers(missing_pos)
    for chosen in (~redispatched, redispatched):
        run_offsets, run_pos = missing_offsets[chosen], missing_pos[chosen]
        for run in _runs(run_offsets):
            detail = (f"{len(run)} record(s) at queue offsets {int(run_offsets[run[0]])}.."
                      f"{int(run_offsets[run[-1]])} have no consume-queue entry")
            if chosen is redispatched:
                pending.add(FindingKind.CQ_MISSING_ENTRY, path, detail, run_pos[run])
            else:
                out.add(FindingKind.CQ_MISSING_ENTRY, path, detail, int(run_pos[run[0]]))


def _runs(values: np.ndarray) -> list[np.ndarray]:
    """Index runs of consecutive values (values sorted)."""
    if len(values) == 0:
        return []
    breaks = np.flatnonzero(np.diff(values) != 1) + 1
    return np.split(np.arange(len(values)), breaks)


def _report_runs(out: FindingList, kind: FindingKind, path: str, first: int, idx: np.ndarray,
                 what: str) -> None:
    for run in _runs(idx):
        lo, hi = first + int(idx[run[0]]), first + int(idx[run[-1]])
        out.add(kind, path, f"{what}: offsets {lo}..{hi}")
