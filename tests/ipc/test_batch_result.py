"""ipc.batch_result: numpy answer rows in, the PutResults the message path made, on demand."""

from __future__ import annotations

import numpy as np
import pytest

from engine.formats.msg_id import make_msg_id
from engine.refusal import Refusal
from engine.status import PUT_OK_CODE, SERVICE_NOT_AVAILABLE_CODE, PutResult, PutStatus
from ipc.batch_result import BatchResult, BatchResultBuilder, failed_rows
from ipc.mailbox import REFUSAL_DTYPE, RESULT_DTYPE

STORE_HOST = ("127.0.0.1", 10911)
PREFIX = make_msg_id(STORE_HOST, 0)[:-16]


def rows(*spec) -> np.ndarray:
    """(status, queue_id, commit_pos, queue_offset, store_ts_ms) tuples as answer rows."""
    return np.array(list(spec), dtype=RESULT_DTYPE)


def test_a_refused_row_carries_the_supervisor_reason_into_the_result():
    answer = rows((0, 1, 500, 7, 99), (2, 0, 0, 0, 0), (2, 0, 0, 0, 0))
    refusals = answer.view(REFUSAL_DTYPE)
    refusals[1] = (PutStatus.MESSAGE_ILLEGAL, Refusal.SEGMENT_FIT, 65528, 70123, 0)
    refusals[2] = (PutStatus.MESSAGE_ILLEGAL, 999, 0, 0, 0)  # a code this producer does not know
    result = BatchResult(answer, {}, PREFIX)
    words = ("invalid record: 70123 bytes does not fit a commitlog segment, which holds records "
             "of at most 65528 bytes")
    assert result[1] == PutResult(PutStatus.MESSAGE_ILLEGAL, reason=words) and result.reason(1) == words
    assert result.reason(2) == "the supervisor refused the record (reason code 999)"
    assert result.reason(0) is None


def test_results_are_built_like_the_message_path():
    result = BatchResult(rows((0, 1, 500, 7, 99), (1, 2, 900, 3, 98), (2, 0, 0, 0, 0), (5, 0, 0, 0, 0)),
                         {3: "custom reason"}, PREFIX)
    expected = [
        PutResult(PutStatus.PUT_OK, commit_pos=500, queue_id=1, queue_offset=7,
                  msg_id=make_msg_id(STORE_HOST, 500), store_ts_ms=99),
        PutResult(PutStatus.FLUSH_DISK_TIMEOUT, commit_pos=900, queue_id=2, queue_offset=3,
                  msg_id=make_msg_id(STORE_HOST, 900), store_ts_ms=98),
        PutResult(PutStatus.MESSAGE_ILLEGAL, reason="the supervisor refused the record"),
        PutResult(PutStatus.DISK_FULL, reason="custom reason"),
    ]
    assert list(result) == expected
    assert [result[i] for i in range(4)] == expected and result[-1] == expected[3]
    assert result[1:3] == expected[1:3]
    assert len(result) == 4 and not result.ok
    assert result.msg_ids() == [e.msg_id for e in expected]
    assert [result.msg_id(i) for i in range(4)] == [e.msg_id for e in expected]
    assert [result.reason(i) for i in range(-4, 0)] == [e.reason for e in expected]
    assert result.stored.tolist() == [True, True, False, False]
    assert result.status_counts() == {PutStatus.PUT_OK: 1, PutStatus.FLUSH_DISK_TIMEOUT: 1,
                                      PutStatus.MESSAGE_ILLEGAL: 1, PutStatus.DISK_FULL: 1}
    assert result.commit_pos.tolist() == [500, 900, 0, 0] and result.queue_id[0] == 1
    with pytest.raises(IndexError):
        result[4]
    assert "PUT_OK=1" in repr(result)


def test_all_ok_and_empty():
    assert BatchResult(rows((0, 0, 1, 1, 1), (0, 1, 2, 2, 2)), {}, PREFIX).ok
    empty = BatchResult(np.zeros(0, dtype=RESULT_DTYPE), {}, PREFIX)
    assert empty.ok and list(empty) == [] and empty.status_counts() == {} and empty.msg_ids() == []


def test_builder_fills_from_runs_in_any_order_and_calls_done_once():
    done = []
    builder = BatchResultBuilder(5, PREFIX, done.append)
    builder.fail(1, PutStatus.MESSAGE_ILLEGAL, "invalid topic")
    builder.put(np.array([3, 4]), rows((0, 1, 30, 0, 1), (0, 1, 40, 1, 1)), None)
    assert not done
    builder.put(slice(0, 1), failed_rows(1, PutStatus.SERVICE_NOT_AVAILABLE), "the supervisor is gone")
    builder.put(np.array([2]), rows((0, 2, 20, 0, 1)), None)
    assert len(done) == 1
    result = done[0]
    assert result.status.tolist() == [4, 2, 0, 0, 0]
    assert result.reason(0) == "the supervisor is gone" and result.reason(1) == "invalid topic"
    assert result.commit_pos.tolist()[2:] == [20, 30, 40]
    builder.finish_if_complete()
    assert len(done) == 1


def test_builder_of_nothing_finishes_when_told():
    done = []
    BatchResultBuilder(0, PREFIX, done.append).finish_if_complete()
    assert len(done) == 1 and len(done[0]) == 0


def test_builder_takes_one_answer_of_the_whole_batch_as_it_is():
    done = []
    answer = rows((0, 1, 30, 0, 1), (0, 2, 40, 0, 1))
    builder = BatchResultBuilder(2, PREFIX, done.append)
    builder.put(slice(0, 2), answer, None)
    assert done[0].rows is answer  # send and wait: no second array, no copy
    done.clear()
    builder = BatchResultBuilder(2, PREFIX, done.append)
    builder.put(slice(0, 2), failed_rows(2, PutStatus.UNKNOWN_ERROR), "no answer within 5 s")
    assert [done[0].reason(i) for i in range(2)] == ["no answer within 5 s"] * 2


def test_builder_copies_answers_of_part_of_the_batch():
    done = []
    first, second = rows((0, 1, 30, 0, 1)), rows((0, 2, 40, 0, 1))
    builder = BatchResultBuilder(2, PREFIX, done.append)
    builder.put(slice(0, 1), first, None)
    builder.put(slice(1, 2), second, None)
    assert done[0].commit_pos.tolist() == [30, 40]
    assert done[0].rows is not first and done[0].rows is not second


def test_hot_path_status_codes_are_plain_ints_of_their_statuses():
    """numpy compares a plain int ~40x faster than an IntEnum member; the values must agree."""
    assert type(PUT_OK_CODE) is int and PUT_OK_CODE == PutStatus.PUT_OK
    assert type(SERVICE_NOT_AVAILABLE_CODE) is int
    assert SERVICE_NOT_AVAILABLE_CODE == PutStatus.SERVICE_NOT_AVAILABLE
    assert BatchResult(rows((PutStatus.PUT_OK, 0, 0, 0, 0)), {}, "P").ok
    mixed = rows((PutStatus.PUT_OK, 0, 0, 0, 0), (PutStatus.DISK_FULL, 0, 0, 0, 0))
    assert not BatchResult(mixed, {}, "P").ok


@pytest.mark.parametrize("count", [1, 3, 16, 17, 200])
def test_status_counts_of_few_and_many_rows_agree_with_the_statuses(count):
    """Up to BATCH_RESULT_FEW_ROWS rows are counted in Python, more by bincount: same counts, same order."""
    rng = np.random.default_rng(count)
    rows = np.zeros(count, dtype=RESULT_DTYPE)
    rows["status"] = rng.choice([int(PutStatus.FLUSH_DISK_TIMEOUT), PUT_OK_CODE, SERVICE_NOT_AVAILABLE_CODE],
                                size=count)
    counts = BatchResult(rows, {}, "P").status_counts()
    expected = {status: int((rows["status"] == status).sum()) for status in PutStatus}
    assert counts == {status: n for status, n in expected.items() if n}
    assert list(counts) == sorted(counts)  # in status order, whichever way they were counted


@pytest.mark.parametrize("count", [1, 16, 17, 100])
def test_ok_of_few_and_many_rows_is_every_status_put_ok(count):
    rows = np.zeros(count, dtype=RESULT_DTYPE)
    rows["status"] = PUT_OK_CODE
    assert BatchResult(rows, {}, "P").ok is True
    rows["status"][count // 2] = int(PutStatus.FLUSH_DISK_TIMEOUT)  # stored, but not PUT_OK
    assert BatchResult(rows, {}, "P").ok is False
