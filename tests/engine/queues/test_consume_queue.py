"""ConsumeQueue: a port of RocketMQ's ConsumeQueueTest plus mqstore's rules."""

from __future__ import annotations

import ctypes
import itertools
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import BadInputError, CorruptConsumeQueueError
from engine.files.mapped_file import Access, MappedFile
from engine.files.naming import consume_queue_dir, offset_to_name
from engine.formats.cq_entry import CQ_ENTRY_SIZE, FILLER_ENTRY, CqEntry, encode_cq_entry
from engine.queues.consume_queue import Boundary, ConsumeQueue
from engine.queues.table import ConsumeQueueTable
from engine.tuning import FEW_QUEUE_ENTRIES
from tests.engine.files.test_mapped_file import resident_pages

EPF = 10  # entries per file: files of 200 bytes, so rolls happen
FILE_BYTES = EPF * CQ_ENTRY_SIZE
TOPIC = "TopicTest"
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
KPF_DIRTY = 4  # include/uapi/linux/kernel-page-flags.h
MSG = 100  # every test record is 100 bytes: entry i points at commit_pos i * 100


def load(root, topic=TOPIC, queue_id=0, epf=EPF, access=Access.READ_WRITE) -> ConsumeQueue:
    return ConsumeQueue.load(root, topic, queue_id, epf, access)


def qdir(root, topic=TOPIC, queue_id=0):
    return consume_queue_dir(root, topic, queue_id)


def file_names(root, topic=TOPIC, queue_id=0) -> list[str]:
    return sorted(os.listdir(qdir(root, topic, queue_id)))


def disk(root, base: int) -> bytes:
    with open(qdir(root) / offset_to_name(base), "rb") as f:
        return f.read()


def put_range(queue: ConsumeQueue, start: int, stop: int) -> None:
    for i in range(start, stop):
        assert queue.put_entries([i], [i * MSG], [MSG], [i % 7]) == 1


def expected(start: int, stop: int) -> list[tuple[int, int, int]]:
    return [(i * MSG, MSG, i % 7) for i in range(start, stop)]


def as_tuples(entries: np.ndarray) -> list[tuple[int, int, int]]:
    return [(int(e["commit_pos"]), int(e["size"]), int(e["tags_code"])) for e in entries]


# --------------------------------------------------------------------------------- put


def test_consume_queue_put_rolls_files_at_entries_per_file(tmp_path):
    queue = load(tmp_path)
    assert not qdir(tmp_path).exists()  # no file before the first put
    put_range(queue, 0, 25)
    assert file_names(tmp_path) == [offset_to_name(0), offset_to_name(200), offset_to_name(400)]
    assert (queue.min_offset, queue.max_offset, queue.max_commit_end) == (0, 25, 2500)
    assert queue.entry(10) == CqEntry(1000, MSG, 10 % 7)
    assert (queue.entry(25), queue.entry(-1)) == (None, None)


def test_consume_queue_reput_returns_false_and_writes_no_duplicate(tmp_path):  # buildCQRepeatedly
    queue = load(tmp_path)
    put_range(queue, 0, 12)
    before = disk(tmp_path, 0) + disk(tmp_path, 200)
    assert queue.put_entries([5], [500], [MSG], [5]) == 0
    assert queue.put_entries([11], [1100], [MSG], [4]) == 0
    assert queue.max_offset == 12
    assert disk(tmp_path, 0) + disk(tmp_path, 200) == before
    queue.close()
    assert load(tmp_path).max_offset == 12


def test_consume_queue_gap_raises_and_writes_nothing(tmp_path):
    queue = load(tmp_path)
    put_range(queue, 0, 3)
    with pytest.raises(CorruptConsumeQueueError) as info:
        queue.put_entries([4], [400], [MSG], [0])
    assert info.value.queue_offset == 4
    assert queue.max_offset == 3 and queue.entry(3) is None
    assert disk(tmp_path, 0)[3 * 20:] == bytes(FILE_BYTES - 60)


def test_consume_queue_conflicting_reput_raises(tmp_path):
    queue = load(tmp_path)
    put_range(queue, 0, 3)
    with pytest.raises(CorruptConsumeQueueError, match="offset 1"):
        queue.put_entries([1], [999], [MSG], [0])
    with pytest.raises(CorruptConsumeQueueError):
        queue.put_entries([1], [100], [MSG + 1], [0])
    with pytest.raises(CorruptConsumeQueueError, match=r"tags_code 1, re-put .* tags_code 0"):
        queue.put_entries([1], [100], [MSG], [0])  # the whole entry is compared, tags_code too


def test_consume_queue_bad_values_raise_bad_input(tmp_path):
    queue = load(tmp_path)
    for args in [(-1, 0, 1, 0), (0, -1, 1, 0), (0, 0, 0, 0)]:
        with pytest.raises(BadInputError):
            queue.put_entries(*([value] for value in args))
    with pytest.raises(BadInputError):
        load(tmp_path, topic="a/b")
    with pytest.raises(BadInputError):
        load(tmp_path, queue_id=-1)


def test_consume_queue_first_put_past_zero_fills_prefix_with_fillers(tmp_path):
    queue = load(tmp_path)
    assert queue.put_entries([13], [1300], [MSG], [0]) == 1
    assert file_names(tmp_path) == [offset_to_name(200)]
    assert (queue.min_offset, queue.max_offset) == (13, 14)
    assert disk(tmp_path, 200)[:60] == encode_cq_entry(*FILLER_ENTRY) * 3
    assert queue.entry(12) is None
    queue.close()
    reloaded = load(tmp_path)
    assert (reloaded.min_offset, reloaded.max_offset, reloaded.max_commit_end) == (13, 14, 1400)


def test_consume_queue_put_batch_writes_same_bytes_as_single_puts(tmp_path):
    single, batch = load(tmp_path / "a"), load(tmp_path / "b")
    put_range(single, 3, 27)
    offsets = np.arange(3, 27)
    assert batch.put_entries(offsets[:5], offsets[:5] * MSG, [MSG] * 5, offsets[:5] % 7) == 5
    assert batch.put_entries(offsets, offsets * MSG, np.full(24, MSG), offsets % 7) == 19  # 5 present
    assert batch.max_offset == single.max_offset == 27
    for base in (0, 200, 400):
        assert disk(tmp_path / "a", base) == disk(tmp_path / "b", base)
    assert batch.put_entries([], [], [], []) == 0


@pytest.mark.parametrize("kind", [list, np.array])
def test_put_entries_struct_and_numpy_ways_write_the_same_bytes(tmp_path, monkeypatch, kind):
    """A run of up to FEW_QUEUE_ENTRIES is packed with struct, a longer one by numpy: same files."""
    rng = np.random.default_rng(3)
    count = 3 * FEW_QUEUE_ENTRIES + 5  # runs of both sizes, crossing files
    tags = rng.integers(-2**40, 2**40, count)
    offsets = np.arange(count)
    cols = [offsets, offsets * MSG, MSG + offsets % 9, tags]
    few, many = load(tmp_path / "few", epf=64), load(tmp_path / "many", epf=64)
    cuts = [*range(0, count, FEW_QUEUE_ENTRIES), count]
    for lo, hi in itertools.pairwise(cuts):
        assert few.put_entries(*[kind(c[lo:hi].tolist()) for c in cols]) == hi - lo
    monkeypatch.setattr("engine.queues.consume_queue.FEW_QUEUE_ENTRIES", 0)  # every run the numpy way
    for lo, hi in itertools.pairwise(cuts):
        assert many.put_entries(*[kind(c[lo:hi].tolist()) for c in cols]) == hi - lo
    assert few.max_offset == many.max_offset == count
    assert few.max_commit_end == many.max_commit_end == int(cols[1][-1] + cols[2][-1])
    assert np.array_equal(few.entries(0, count), many.entries(0, count))
    few.segments.close()
    many.segments.close()
    for base in range(0, count * CQ_ENTRY_SIZE, 64 * CQ_ENTRY_SIZE):
        few_bytes = (qdir(tmp_path / "few") / offset_to_name(base)).read_bytes()
        assert few_bytes == (qdir(tmp_path / "many") / offset_to_name(base)).read_bytes()


@pytest.mark.parametrize("bad", [[0, -1], [-5, 100]])  # a negative size / commit_pos, in a short run
def test_put_entries_of_a_short_run_with_a_bad_value_is_refused_and_writes_nothing(tmp_path, bad):
    queue = load(tmp_path)
    put_range(queue, 0, 2)
    sizes, commits = ([MSG, bad[1]], [200, 300]) if bad[0] == 0 else ([MSG, MSG], [200, bad[1] - 400])
    with pytest.raises(BadInputError, match="negative offset or commit_pos, or size <= 0"):
        queue.put_entries([2, 3], commits, sizes, [0, 0])
    with pytest.raises(BadInputError, match="put_entries"):
        queue.put_entries([2, 3], [200, 300], [MSG, MSG], [0, 2**63])  # tags_code past int64
    assert queue.max_offset == 2 and len(queue.entries(0, 100)) == 2


def test_consume_queue_put_batch_gap_or_conflict_raises(tmp_path):
    queue = load(tmp_path)
    put_range(queue, 0, 5)
    with pytest.raises(CorruptConsumeQueueError):
        queue.put_entries([6, 7], [600, 700], [MSG, MSG], [0, 0])
    with pytest.raises(CorruptConsumeQueueError):
        queue.put_entries([4, 5], [999, 500], [MSG, MSG], [0, 0])
    with pytest.raises(CorruptConsumeQueueError):
        queue.put_entries([5, 7], [500, 700], [MSG, MSG], [0, 0])  # not a run: entry by entry
    assert queue.max_offset == 6  # the batch that was not a run wrote its entry before the gap
    with pytest.raises(BadInputError):
        queue.put_entries([6, 7], [600], [MSG], [0])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(start=st.integers(0, 35),
       ops=st.lists(st.one_of(st.integers(1, 12), st.tuples(st.just("dup"), st.integers(0, 99))),
                    max_size=25))
def test_consume_queue_random_puts_with_duplicates_stay_contiguous(tmp_path_factory, start, ops):
    root = tmp_path_factory.mktemp("cq")
    queue = load(root)
    next_offset = start
    for op in ops:
        if isinstance(op, int):  # a batch of `op` new entries, alternately batched and single
            if op % 2:
                put_range(queue, next_offset, next_offset + op)
            else:
                offs = np.arange(next_offset, next_offset + op)
                assert queue.put_entries(offs, offs * MSG, [MSG] * op, offs % 7) == op
            next_offset += op
        elif next_offset > start:  # re-dispatch of an entry already there
            dup = start + op[1] % (next_offset - start)
            assert queue.put_entries([dup], [dup * MSG], [MSG], [dup % 7]) == 0
    count = next_offset - start
    assert (queue.min_offset, queue.max_offset) == ((start, next_offset) if count else (0, 0))
    assert as_tuples(queue.entries(start, 1000)) == expected(start, next_offset)
    if count:
        first_file, last_file = start // EPF, (next_offset - 1) // EPF
        assert len(file_names(root)) == last_file - first_file + 1
    queue.close()
    again = load(root)
    assert (again.min_offset, again.max_offset) == ((start, next_offset) if count else (0, 0))
    assert as_tuples(again.entries(start, 1000)) == expected(start, next_offset)
    again.close()


# -------------------------------------------------------------------------------- read


def test_consume_queue_entries_vectorised_equals_per_entry_reads(tmp_path):
    queue = load(tmp_path)
    put_range(queue, 0, 25)
    got = queue.entries(3, 20)
    assert got.dtype.names == ("commit_pos", "size", "tags_code")
    assert [CqEntry(*t) for t in as_tuples(got)] == [queue.entry(i) for i in range(3, 23)]
    assert len(queue.entries(20, 100)) == 5
    assert len(queue.entries(25, 5)) == 0 and len(queue.entries(-3, 5)) == 0
    got[0]["commit_pos"] = 12345  # a copy: the mapping is untouched
    assert queue.entry(3).commit_pos == 300


def test_consume_queue_flush_returns_flushed_offset_and_reaches_file(tmp_path):
    queue = load(tmp_path)
    put_range(queue, 0, 12)
    assert queue.flushed_offset == 0
    assert queue.flush() == queue.flushed_offset == 12
    assert disk(tmp_path, 200)[:40] == encode_cq_entry(1000, MSG, 3) + encode_cq_entry(1100, MSG, 4)


# ----------------------------------------------------------------------- offset by time


def _timed_queue(tmp_path):
    """Entries 0..29; store times 1000 + 10*i, except entries 5, 6, 7 share time 1050."""
    queue = load(tmp_path)
    put_range(queue, 0, 30)
    times = {i * MSG: 1000 + 10 * i for i in range(30)}
    times.update({600: 1050, 700: 1050})

    def store_ts_of(commit_pos, size):
        assert size == MSG
        return times[commit_pos]

    return queue, store_ts_of


def test_consume_queue_offset_for_time_exact_match_lower_and_upper(tmp_path):
    queue, ts_of = _timed_queue(tmp_path)
    assert queue.offset_for_time(1050, Boundary.LOWER, ts_of) == 5
    assert queue.offset_for_time(1050, Boundary.UPPER, ts_of) == 7
    for i in (0, 12, 29):
        assert queue.offset_for_time(1000 + 10 * i, Boundary.LOWER, ts_of) == i
        assert queue.offset_for_time(1000 + 10 * i, Boundary.UPPER, ts_of) == i


def test_consume_queue_offset_for_time_skewed_2ms_finds_that_message(tmp_path):
    queue, ts_of = _timed_queue(tmp_path)
    assert queue.offset_for_time(1120 - 2, Boundary.LOWER, ts_of) == 12
    assert queue.offset_for_time(1120 - 2, Boundary.UPPER, ts_of) == 11


def test_consume_queue_offset_for_time_far_before_and_after(tmp_path):
    queue, ts_of = _timed_queue(tmp_path)
    assert queue.offset_for_time(1000 - 20_000, Boundary.LOWER, ts_of) == 0
    assert queue.offset_for_time(1000 - 20_000, Boundary.UPPER, ts_of) == 0
    assert queue.offset_for_time(10**12, Boundary.LOWER, ts_of) == 30  # one past the end
    assert queue.offset_for_time(10**12, Boundary.UPPER, ts_of) == 29


def test_consume_queue_offset_for_time_skips_expired_and_unreadable(tmp_path):
    queue, ts_of = _timed_queue(tmp_path)
    assert queue.offset_for_time(0, Boundary.LOWER, ts_of, min_commit_pos=1500) == 15
    assert queue.offset_for_time(1200, Boundary.LOWER, lambda pos, size: -1) == 0


def test_consume_queue_offset_for_time_unknown_or_empty_queue_is_0(tmp_path):
    table = ConsumeQueueTable.load(tmp_path, EPF, Access.READ_WRITE)
    assert table.get(TOPIC, 5) is None
    fresh = table.get_or_create(TOPIC, 5)
    assert fresh.offset_for_time(1000, Boundary.LOWER, lambda pos, size: 1000) == 0
    fresh.initialize_with_offset(40)
    assert fresh.offset_for_time(1000, Boundary.UPPER, lambda pos, size: 1000) == 40


# ---------------------------------------------------------------------- min offset


def test_consume_queue_correct_min_offset(tmp_path):  # testCorrectMinOffset
    queue = load(tmp_path, epf=1000)
    for i in range(10_000):
        queue.put_entries([i], [i * MSG], [MSG], [0])
    assert queue.max_offset == 10_000 and len(file_names(tmp_path)) == 10
    assert queue.correct_min_offset(0) == 0
    assert queue.correct_min_offset(500) == 5  # min now 5, as the Java test sets it
    assert queue.correct_min_offset(2000) == 20
    assert queue.correct_min_offset(2001) == 21
    assert queue.correct_min_offset(987_650) == 9877  # crosses files
    assert queue.correct_min_offset(10_000 * MSG) == queue.max_offset == 10_000  # all stale
    assert queue.entry(9999) is None


def test_a_reader_corrects_its_min_offset_within_the_end_it_may_read(tmp_path):
    """A reader loads the min offset from the file start; correct_min_offset moves it to the
    first entry whose record still exists, never past the end the reader passes (an entry past
    the published position may be half written)."""
    writer = load(tmp_path)
    put_range(writer, 0, 25)
    reader = load(tmp_path, access=Access.READ_ONLY)
    assert reader.min_offset == 0  # the file start: load knows nothing of the commitlog
    assert reader.correct_min_offset(1250, end=8) == 8  # all stale below the end: min = end
    assert reader.correct_min_offset(1250, end=20) == 13  # 13 * MSG is the first at/past 1250
    assert reader.correct_min_offset(0) == 13  # never moves back
    with open(qdir(tmp_path) / offset_to_name(FILE_BYTES), "r+b") as f:
        f.write(encode_cq_entry(0, MSG, 0) * 3)  # entries 10..12, now below the min: never read
    assert reader.correct_min_offset(1250) == 13
    assert reader.entries(13, 1)["commit_pos"][0] == 1300
    reader.close()
    writer.close()


def test_consume_queue_initialize_with_offset_survives_reload(tmp_path):  # testFillBank...
    for epf in (1000, EPF):  # fillers inside the file, and a start on a file boundary
        root = tmp_path / str(epf)
        queue = load(root, epf=epf)
        put_range(queue, 0, 3)
        queue.initialize_with_offset(100)
        assert (queue.min_offset, queue.max_offset) == (100, 100)
        assert file_names(root) == [offset_to_name(100 * 20 // (epf * 20) * epf * 20)]
        queue.close()
        queue = load(root, epf=epf)
        assert (queue.min_offset, queue.max_offset) == (100, 100)
        assert queue.recover() == 100
        assert queue.correct_min_offset(1) == 100
        assert (queue.min_offset, queue.max_offset, queue.max_commit_end) == (100, 100, 0)
        assert queue.put_entries([100], [5000], [MSG], [0]) == 1 and queue.max_offset == 101


def test_consume_queue_delete_expired_files_never_the_last(tmp_path):
    queue = load(tmp_path)
    put_range(queue, 0, 25)
    assert queue.delete_expired_files(1000) == 1  # file 0 ends at commit 900
    assert file_names(tmp_path) == [offset_to_name(200), offset_to_name(400)]
    assert queue.min_offset == 10
    assert queue.delete_expired_files(1500) == 0 and queue.min_offset == 15
    assert queue.delete_expired_files(10**9) == 1
    assert file_names(tmp_path) == [offset_to_name(400)]
    assert queue.min_offset == queue.max_offset == 25


# -------------------------------------------------------------------------- recovery


def test_consume_queue_empty_last_file_does_not_break_recover_or_correct(tmp_path):  # #9728
    queue = load(tmp_path)
    put_range(queue, 0, 10)
    queue.close()
    (qdir(tmp_path) / offset_to_name(200)).write_bytes(bytes(FILE_BYTES))
    queue = load(tmp_path)
    assert queue.max_offset == 10
    assert queue.correct_min_offset(0) == 0
    assert queue.recover() == 10
    assert file_names(tmp_path) == [offset_to_name(0)]
    assert queue.correct_min_offset(10 * MSG) == 10
    assert queue.put_entries([10], [1000], [MSG], [0]) == 1


def test_consume_queue_only_file_empty_recovers_to_its_base(tmp_path):
    qdir(tmp_path).mkdir(parents=True)
    (qdir(tmp_path) / offset_to_name(400)).write_bytes(bytes(FILE_BYTES))
    queue = load(tmp_path)
    assert (queue.min_offset, queue.max_offset) == (20, 20)
    assert queue.recover() == 20 and queue.correct_min_offset(5) == 20
    assert file_names(tmp_path) == [offset_to_name(400)]
    with pytest.raises(CorruptConsumeQueueError):
        queue.put_entries([21], [2100], [MSG], [0])  # a gap after the recovered end


def test_consume_queue_recover_after_a_clean_end_cuts_nothing(tmp_path):
    queue = load(tmp_path)
    put_range(queue, 0, 15)
    queue.close()
    queue = load(tmp_path)
    assert queue.recover() == 15 and queue.cut_offset is None and queue.find_cut() is None


def test_damaged_entry_keeps_the_bytes_behind_it_until_redispatch_put_them_back(tmp_path):
    """A flipped entry below valid ones: the end moves to it, and re-dispatch must start at the
    record after the last kept entry. Until clear_cut_tail the bytes stay, so a crash before
    re-dispatch leaves the next recovery the same evidence, not a clean end."""
    queue = load(tmp_path)
    put_range(queue, 0, 15)
    queue.close()
    with open(qdir(tmp_path) / offset_to_name(0), "r+b") as f:
        f.seek(7 * 20 + 8)
        f.write(b"\x80")  # entry 7's size turns negative
    for _ in range(2):  # the second time as after a crash during recovery
        queue = load(tmp_path)
        assert queue.find_cut() == 7  # read-only, as the look before a writer opens
        assert queue.recover() == 7 == queue.max_offset
        assert queue.cut_offset == 7 and queue.record_end_before(7) == 7 * MSG  # past entry 6's record
        assert disk(tmp_path, 200)[:20] == encode_cq_entry(10 * MSG, MSG, 10 % 7)
        queue.close()
    queue = load(tmp_path)
    queue.recover()
    put_range(queue, 7, 15)  # what re-dispatch puts back
    queue.clear_cut_tail()
    queue.close()
    assert load(tmp_path).max_offset == 15
    assert load(tmp_path).entries(0, 20)["commit_pos"].tolist() == [i * MSG for i in range(15)]


def test_consume_queue_recover_zeroes_stale_bytes_behind_last_valid_entry_after_redispatch(tmp_path):
    queue = load(tmp_path)
    put_range(queue, 0, 15)
    queue.close()
    with open(qdir(tmp_path) / offset_to_name(200), "r+b") as f:
        f.seek(5 * 20)
        f.write(encode_cq_entry(1500, MSG, 1)[:10])  # torn: commit_pos written, size still 0
        f.seek(7 * 20)
        f.write(encode_cq_entry(1700, MSG, 1))  # stale but valid-looking
    (qdir(tmp_path) / offset_to_name(400)).write_bytes(encode_cq_entry(2000, MSG, 0) * EPF)
    queue = load(tmp_path)
    assert queue.recover() == 15 == queue.max_offset
    assert queue.flushed_offset == 15 and queue.max_commit_end == 1500
    assert queue.cut_offset == 15  # re-dispatch puts back entries 15.. from their records
    assert queue.raw_entry(15).commit_pos == 1500 and queue.record_end_before(15) == 1500
    queue.clear_cut_tail()  # after re-dispatch
    assert queue.cut_offset is None
    assert disk(tmp_path, 200)[5 * 20:] == bytes(FILE_BYTES - 100)
    assert file_names(tmp_path) == [offset_to_name(0), offset_to_name(200)]
    put_range(queue, 15, 16)
    queue.close()
    assert load(tmp_path).max_offset == 16  # the stale entry at 17 cannot come back


def test_consume_queue_truncate_from_commit_pos_drops_zeroes_and_deletes(tmp_path):
    queue = load(tmp_path)
    put_range(queue, 0, 25)
    assert queue.truncate_from_commit_pos(1250) == 12  # entries 13..24
    assert (queue.max_offset, queue.max_commit_end) == (13, 1300)
    assert file_names(tmp_path) == [offset_to_name(0), offset_to_name(200)]
    assert disk(tmp_path, 200)[3 * 20:] == bytes(FILE_BYTES - 60)
    assert queue.truncate_from_commit_pos(5000) == 0
    assert queue.truncate_from_commit_pos(1000) == 3  # a file boundary: file 200 goes
    assert file_names(tmp_path) == [offset_to_name(0)]
    assert queue.truncate_from_commit_pos(0) == 10
    assert (queue.min_offset, queue.max_offset, queue.max_commit_end) == (0, 0, 0)
    assert file_names(tmp_path) == [offset_to_name(0)] and disk(tmp_path, 0) == bytes(FILE_BYTES)
    put_range(queue, 0, 2)


def test_consume_queue_truncate_keeps_start_of_queue_past_zero(tmp_path):
    queue = load(tmp_path)
    put_range(queue, 13, 30)
    assert queue.truncate_from_commit_pos(0) == 17
    assert (queue.min_offset, queue.max_offset) == (13, 13)
    assert disk(tmp_path, 200)[:60] == encode_cq_entry(*FILLER_ENTRY) * 3
    put_range(queue, 13, 14)


# ------------------------------------------------------- recovery past the durable position


def patch_entry(root, queue_offset: int, data: bytes, at: int = 0) -> None:
    """Write through the file (what a torn write-back leaves), not through the mapping."""
    lpos = queue_offset * CQ_ENTRY_SIZE
    with open(qdir(root) / offset_to_name(lpos - lpos % FILE_BYTES), "r+b") as fh:
        fh.seek(lpos % FILE_BYTES + at)
        fh.write(data)


def reput(queue: ConsumeQueue, start: int, stop: int) -> int:
    offsets = np.arange(start, stop)
    return queue.put_entries(offsets, offsets * MSG, np.full(len(offsets), MSG), offsets % 7)


def test_recover_with_durable_pos_repairs_a_torn_entry_past_it(tmp_path):
    """Finding 6: an entry whose tags_code sat in a sector that was not written back keeps
    commit_pos and size; re-dispatch compares the whole entry and rewrites it."""
    put_range(load(tmp_path / "ref"), 0, 30)
    queue = load(tmp_path)
    put_range(queue, 0, 30)
    queue.close()
    patch_entry(tmp_path, 25, bytes(8), at=12)  # entry 25's tags_code (25 % 7 = 4) lost
    patch_entry(tmp_path, 15, bytes(8), at=12)  # and entry 15's, below the durable position
    queue = load(tmp_path)
    assert queue.recover(20 * MSG) == 30  # both still look valid
    assert reput(queue, 20, 30) == 1  # the torn one, rewritten
    assert queue.entry(25) == CqEntry(2500, MSG, 4)
    with pytest.raises(CorruptConsumeQueueError, match="offset 15"):
        reput(queue, 15, 16)  # durable entries are trusted: a difference there is corruption
    patch_entry(tmp_path, 15, (15 % 7).to_bytes(8, "big"), at=12)
    queue.close()
    for base in (0, 200, 400):
        assert disk(tmp_path, base) == disk(tmp_path / "ref", base)
    trusting = load(tmp_path)
    patch_entry(tmp_path, 25, bytes(8), at=12)
    trusting.recover()  # no durable position known: every valid entry is trusted
    with pytest.raises(CorruptConsumeQueueError, match=r"offset 25 .* tags_code 0"):
        reput(trusting, 20, 30)


def test_unconfirmed_entries_that_re_dispatch_does_not_reach_are_dropped(tmp_path):
    """Past the durable position, only what re-dispatch confirms stays: the records of entries
    26.. lie past the recovery cut, and entry 27 was torn to a position below the cut, which the
    cut by commit_pos alone would keep."""
    queue = load(tmp_path)
    put_range(queue, 0, 30)
    queue.close()
    patch_entry(tmp_path, 27, (500).to_bytes(8, "big"))
    table = ConsumeQueueTable.load(tmp_path, EPF, Access.READ_WRITE)
    table.recover_all(20 * MSG)
    queue = table.get(TOPIC, 0)
    assert queue.max_offset == 30
    assert reput(queue, 20, 26) == 0  # confirmed as they are
    assert table.truncate_all_from(26 * MSG) == 4
    assert queue.max_offset == 26 and queue.entry(26) is None
    assert as_tuples(queue.entries(0, 100)) == expected(0, 26)
    table.close()
    reloaded = load(tmp_path)
    assert reloaded.max_offset == 26
    assert disk(tmp_path, 400)[6 * CQ_ENTRY_SIZE:] == bytes(FILE_BYTES - 6 * CQ_ENTRY_SIZE)


def test_re_dispatch_past_the_unconfirmed_entries_keeps_them_all(tmp_path):
    queue = load(tmp_path)
    put_range(queue, 0, 25)
    queue.close()
    table = ConsumeQueueTable.load(tmp_path, EPF, Access.READ_WRITE)
    table.recover_all(10 * MSG)
    queue = table.get(TOPIC, 0)
    assert reput(queue, 10, 32) == 7  # confirms 10..24, appends 25..31
    assert table.truncate_all_from(32 * MSG) == 0
    assert as_tuples(queue.entries(0, 100)) == expected(0, 32)
    table.close()


# ------------------------------------------------------------- read-only view: refresh

_LISTED_DIRS: list[str] = []


def _record_listings(event: str, args: tuple) -> None:
    if event in ("os.listdir", "os.scandir") and args and isinstance(args[0], (str, os.PathLike)):
        _LISTED_DIRS.append(os.fspath(args[0]))


sys.addaudithook(_record_listings)  # observes real directory listings; cannot be removed, so cheap


def listings_of(directory) -> int:
    return _LISTED_DIRS.count(os.fspath(directory))


def test_refresh_adopts_the_files_the_writer_rolls_to(tmp_path):
    writer = load(tmp_path)
    put_range(writer, 0, EPF)  # exactly one full file: the reader sits at its end
    reader = load(tmp_path, access=Access.READ_ONLY)
    assert reader.max_offset == EPF and len(reader.segments.segments) == 1
    reader.refresh()
    assert reader.max_offset == EPF
    put_range(writer, EPF, 3 * EPF + 4)  # the writer rolls to three more files
    reader.refresh()
    assert reader.max_offset == 3 * EPF + 4 and len(reader.segments.segments) == 4
    assert as_tuples(reader.entries(0, 100)) == expected(0, 3 * EPF + 4)
    assert reader.max_commit_end == (3 * EPF + 4) * MSG
    put_range(writer, 3 * EPF + 4, 3 * EPF + 6)  # more entries in the last known file
    reader.refresh()
    assert reader.max_offset == 3 * EPF + 6 and reader.entry(3 * EPF + 5) == writer.entry(3 * EPF + 5)
    reader.close()
    writer.close()


def test_refresh_forgets_the_files_retention_deleted(tmp_path):
    writer = load(tmp_path)
    put_range(writer, 0, 3 * EPF + 5)
    reader = load(tmp_path, access=Access.READ_ONLY)
    assert writer.delete_expired_files(2 * EPF * MSG) == 2
    assert file_names(tmp_path) == [offset_to_name(2 * FILE_BYTES), offset_to_name(3 * FILE_BYTES)]
    reader.refresh()
    assert [reader.segments.base_of(s) for s in reader.segments.segments] == [2 * FILE_BYTES, 3 * FILE_BYTES]
    assert (reader.min_offset, reader.max_offset) == (2 * EPF, 3 * EPF + 5)
    assert reader.entry(2 * EPF - 1) is None and reader.entry(2 * EPF) == writer.entry(2 * EPF)
    put_range(writer, 3 * EPF + 5, 4 * EPF + 1)  # and it still follows the writer afterwards
    reader.refresh()
    assert reader.max_offset == 4 * EPF + 1 and len(reader.segments.segments) == 3
    reader.close()
    writer.close()


def test_refresh_lists_the_directory_only_when_files_change(tmp_path):
    writer = load(tmp_path)
    put_range(writer, 0, EPF + 3)
    reader = load(tmp_path, access=Access.READ_ONLY)
    before = listings_of(qdir(tmp_path))
    for stop in range(EPF + 4, 2 * EPF + 1):  # new entries in known files, up to the end of one
        put_range(writer, stop - 1, stop)
        reader.refresh()
        assert reader.max_offset == stop
    for _ in range(5):
        reader.refresh()  # at the end of a full file, no next file yet
    assert listings_of(qdir(tmp_path)) == before
    put_range(writer, 2 * EPF, 2 * EPF + 1)  # a roll: now the directory is looked at
    reader.refresh()
    assert reader.max_offset == 2 * EPF + 1 and listings_of(qdir(tmp_path)) > before
    reader.close()
    writer.close()


def test_a_reader_scanning_past_the_last_entry_does_not_zero_fill_the_rest_of_the_file(tmp_path):
    """A reader's scan for new entries reads a chunk past the last one, into blocks the writer
    reserved but has not written. With the kernel's read-around (8 MiB on the bench VM) that one
    fault zero-filled the whole 6 MB file: ~18 ms of system time per queue at each roll, all
    queues at once, in the consumer. Now each fault brings in its own page."""
    entries_per_file = 300_000  # RocketMQ's default: a 6 MB file
    writer = load(tmp_path, epf=entries_per_file)
    put_range(writer, 0, 10)  # reserves the first 4 MiB, writes one page
    reader = load(tmp_path, epf=entries_per_file, access=Access.READ_ONLY)
    try:
        assert reader.max_offset == 10
        path = qdir(tmp_path) / offset_to_name(0)
        # one scan chunk (4,096 entries: 21 pages) at most, not the file's 1,465
        assert resident_pages(path, 0, entries_per_file * CQ_ENTRY_SIZE) <= 32
    finally:
        reader.close()
        writer.close()


def _page_is_dirty(mapping, file_pos: int) -> bool:
    """The kernel's dirty flag of the page cache page at `file_pos` of a mapped file
    (/proc/self/pagemap for its frame, /proc/kpageflags for the flag; root only)."""
    anchor = ctypes.c_char.from_buffer(mapping)
    try:
        vaddr = ctypes.addressof(anchor) + file_pos - file_pos % PAGE_BYTES
    finally:
        del anchor
    mapping[file_pos]  # mapped in this process, so the page table names the frame
    with open("/proc/self/pagemap", "rb") as fh:
        fh.seek(vaddr // PAGE_BYTES * 8)
        frame = int.from_bytes(fh.read(8), "little") & ((1 << 55) - 1)
    assert frame, "no page frame number: /proc/kpageflags needs root"
    with open("/proc/kpageflags", "rb") as fh:
        fh.seek(frame * 8)
        return bool(int.from_bytes(fh.read(8), "little") & (1 << KPF_DIRTY))


def test_a_reput_equal_entry_is_written_again_so_the_next_flush_writes_it(tmp_path):
    """After a failed writeback the kernel keeps a page clean though the disk never got it; a
    restart's re-dispatch re-puts its entries, and only writing them again makes the next flush
    write them (otherwise that flush succeeds having written nothing)."""
    queue = load(tmp_path)
    put_range(queue, 0, 8)
    queue.flush()
    mapping = queue.segments.segments[0]._mmap
    assert not _page_is_dirty(mapping, 3 * CQ_ENTRY_SIZE)  # written back
    assert queue.put_entries([3], [3 * MSG], [MSG], [3 % 7]) == 0  # already there: nothing differs
    assert _page_is_dirty(mapping, 3 * CQ_ENTRY_SIZE)
    queue.flush()
    assert not _page_is_dirty(mapping, 3 * CQ_ENTRY_SIZE)
    queue.close()


def test_a_queue_file_costs_64_kib_of_disk_at_its_first_entry_and_grows_by_doubling(tmp_path, monkeypatch):
    """RocketMQ's 300,000-entry file (6 MB) took a 4 MiB step at its first entry, so 100 topics
    of 8 queues took ~3 GB before any data; the steps now start at 64 KiB, and entries put one by
    one allocate once a doubling, not once a put."""
    allocations = []
    real_allocate = MappedFile.allocate
    monkeypatch.setattr(MappedFile, "allocate", lambda self, start, end: (
        allocations.append(end), real_allocate(self, start, end)))
    queue = load(tmp_path, epf=300_000)
    put_range(queue, 0, 1)
    path = qdir(tmp_path) / offset_to_name(0)
    assert path.stat().st_size == 300_000 * CQ_ENTRY_SIZE  # RocketMQ's file size and name
    assert path.stat().st_blocks * 512 <= 64 << 10
    put_range(queue, 1, 10_000)
    assert path.stat().st_blocks * 512 <= 256 << 10  # 200 KB of entries
    assert allocations == [64 << 10, 128 << 10, 256 << 10]
    queue.close()
    reader = load(tmp_path, epf=300_000, access=Access.READ_ONLY)
    assert (reader.max_offset, reader.entry(9_999)) == (10_000, CqEntry(9_999 * MSG, MSG, 9_999 % 7))
    reader.close()
