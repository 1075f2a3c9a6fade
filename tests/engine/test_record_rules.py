"""The record rules of engine.record_rules: one definition, three renderings that agree.

Every transaction type (with and without other SYSFLAG bits beside it) at queue offset 0 and at
other offsets, through the scalar function, the numpy mask and the Spark SQL text (evaluated by
SQLite here, which reads the same `&`, `IN`, `AND`, `OR`; tests/spark/test_transaction_check.py
runs it in Spark). The expected tables are written out by hand, so a rule that drifts fails.
"""

from __future__ import annotations

import itertools
import sqlite3

import numpy as np
import pytest

from engine import record_rules
from engine.formats.record import SysFlag, TxType
from engine.record_rules import (
    ENTERS_CONSUME_QUEUE,
    ENTERS_CONSUME_QUEUE_SQL,
    HELD_OUT_OF_QUEUE,
    SPARK_SQL,
    UNINDEXED_ROLLBACK,
    AllOf,
    AnyOf,
    Clause,
    Op,
    enters_consume_queue,
    held_out_of_queue_mask,
    is_unindexed_rollback,
    negation,
    numpy_function,
    render_text,
    scalar_function,
    unindexed_rollback_mask,
)

OTHER_BITS = (0, int(SysFlag.MULTI_TAGS) | int(SysFlag.COMPRESSED), int(SysFlag.INNER_BATCH))
QUEUE_OFFSETS = (0, 1, 7, 2**40)
GRID = [(int(tx) | bits, offset) for tx, bits, offset in itertools.product(TxType, OTHER_BITS, QUEUE_OFFSETS)]


def expected_enters(sys_flag: int, queue_offset: int) -> bool:
    """RocketMQ keeps PREPARED and ROLLBACK at offset 0 out; an offset holds the record's place."""
    return queue_offset != 0 or TxType(sys_flag & 0xC) in (TxType.NOT, TxType.COMMIT)


def expected_unindexed(sys_flag: int, queue_offset: int) -> bool:
    return queue_offset == 0 and TxType(sys_flag & 0xC) is TxType.ROLLBACK


def sql_holds(condition: str, rows: list[tuple[int, int]]) -> list[bool]:
    """`condition` per row, evaluated by SQLite over columns sys_flag and queue_offset."""
    with sqlite3.connect(":memory:") as db:
        db.execute("CREATE TABLE r (i INTEGER, sys_flag INTEGER, queue_offset INTEGER)")
        db.executemany("INSERT INTO r VALUES (?, ?, ?)", [(i, *row) for i, row in enumerate(rows)])
        held = {i for (i,) in db.execute(f"SELECT i FROM r WHERE {condition}")}
    return [i in held for i in range(len(rows))]


def test_grid_covers_every_transaction_type_at_offset_zero_and_beyond():
    assert {(TxType(f & 0xC), o == 0) for f, o in GRID} == {(t, z) for t in TxType for z in (True, False)}


@pytest.mark.parametrize(("rule", "scalar", "mask", "expected"), [
    (ENTERS_CONSUME_QUEUE, enters_consume_queue, lambda f, o: ~held_out_of_queue_mask(f, o), expected_enters),
    (UNINDEXED_ROLLBACK, is_unindexed_rollback, unindexed_rollback_mask, expected_unindexed),
], ids=["enters_consume_queue", "unindexed_rollback"])
def test_scalar_numpy_and_sql_renderings_agree_with_the_rule(rule, scalar, mask, expected):
    want = [expected(f, o) for f, o in GRID]
    assert [scalar(f, o) for f, o in GRID] == want
    flags = np.array([f for f, _ in GRID], dtype=np.int32)
    offsets = np.array([o for _, o in GRID], dtype=np.int64)
    assert mask(flags, offsets).tolist() == want
    assert numpy_function(rule, "r")(flags, offsets).tolist() == want
    assert sql_holds(render_text(rule, SPARK_SQL), GRID) == want


def test_the_spark_fsck_text_is_the_rule_rendered():
    assert render_text(ENTERS_CONSUME_QUEUE, SPARK_SQL) == ENTERS_CONSUME_QUEUE_SQL
    assert sql_holds(ENTERS_CONSUME_QUEUE_SQL, GRID) == [expected_enters(f, o) for f, o in GRID]


@pytest.mark.parametrize("rows", [[], [(4, 3), (12, 9), (0, 1)], [(12, 3), (4, 9), (12, 0)]],
                         ids=["empty", "no-offset-zero", "only-the-last"])
def test_numpy_masks_where_the_first_clause_decides_every_row(rows):
    """The generated numpy form stops at a clause that holds for no row (no queue offset 0)."""
    flags = np.array([f for f, _ in rows], dtype=np.int32)
    offsets = np.array([o for _, o in rows], dtype=np.int64)
    for mask, expected in ((held_out_of_queue_mask, lambda f, o: not expected_enters(f, o)),
                           (unindexed_rollback_mask, expected_unindexed)):
        got = mask(flags, offsets)
        assert got.dtype == bool and got.tolist() == [expected(f, o) for f, o in rows]


def test_held_out_is_the_exact_negation_of_entering_a_queue():
    assert negation(HELD_OUT_OF_QUEUE) == ENTERS_CONSUME_QUEUE
    assert negation(negation(ENTERS_CONSUME_QUEUE)) == ENTERS_CONSUME_QUEUE
    assert [scalar_function(HELD_OUT_OF_QUEUE, "held")(f, o) for f, o in GRID] == \
        [not expected_enters(f, o) for f, o in GRID]


def test_scalar_rendering_is_a_plain_generated_function():
    """No interpretation per call: the function's code compares the fields directly."""
    code = enters_consume_queue.__code__
    assert code.co_varnames[:code.co_argcount] == record_rules.FIELDS
    assert code.co_consts.count((int(TxType.PREPARED), int(TxType.ROLLBACK))) == 1
    assert not code.co_names  # no globals looked up: no helper called, no rule data read
    assert enters_consume_queue.__module__ == "engine.record_rules"


def test_renderings_of_a_rule_with_a_single_value_and_no_mask():
    rule = AnyOf((Clause("queue_offset", Op.IN, (5,)), AllOf((Clause("sys_flag", Op.NOT_IN, (1, 2)),))))
    rows = [(f, o) for f in (0, 1, 2, 3) for o in (0, 5)]
    want = [o == 5 or f not in (1, 2) for f, o in rows]
    assert [scalar_function(rule, "r")(f, o) for f, o in rows] == want
    flags, offsets = np.array([f for f, _ in rows]), np.array([o for _, o in rows])
    assert numpy_function(rule, "r")(flags, offsets).tolist() == want
    assert sql_holds(render_text(rule, SPARK_SQL), rows) == want


@pytest.mark.parametrize(("field", "values", "message"), [
    ("topic", (1,), "a rule tests only"),
    ("sys_flag", (), "at least one value"),
])
def test_a_clause_on_an_unknown_field_or_without_values_is_refused(field, values, message):
    with pytest.raises(ValueError, match=message):
        Clause(field, Op.IN, values)


def test_the_producer_refusal_bit_marks_exactly_the_types_kept_out_of_queues():
    """workers.request_check refuses records with this bit: PREPARED and ROLLBACK, no others."""
    bit = record_rules.HALF_OR_ROLLBACK_BIT
    assert bit == 0x4
    assert {tx for tx in TxType if tx & bit} == {TxType.PREPARED, TxType.ROLLBACK}
    assert {tx for tx in TxType if not enters_consume_queue(int(tx), 0)} == {TxType.PREPARED, TxType.ROLLBACK}


# ------------------------------------------------------------------------------ the tag field

def test_tag_field_scalar_numpy_and_sql_agree():
    """SCHEDULED_TAG_FIELD: the delivery time in SCHEDULE_TOPIC_XXXX (a queue past the level
    table delivers at its store time), the tag hash elsewhere; the same in every rendering."""
    levels = (100, 5000, 60_000)
    grid = list(itertools.product(("SCHEDULE_TOPIC_XXXX", "Orders"), (0, 1, 2, 3, 17), (1_000, 7_777)))
    scalar = record_rules.tag_field_function(levels)
    want = [ts + levels[q] if t == "SCHEDULE_TOPIC_XXXX" and q < 3 else (ts if t != "Orders" else 42)
            for t, q, ts in grid]
    assert [scalar(t, q, ts, 42) for t, q, ts in grid] == want
    scheduled = [row for row in grid if row[0] == "SCHEDULE_TOPIC_XXXX"]
    column = record_rules.scheduled_tag_column(np.array([ts for _, _, ts in scheduled]),
                                               np.array([q for _, q, _ in scheduled]), levels)
    assert column.tolist() == [scalar(t, q, ts, 42) for t, q, ts in scheduled]
    sql = record_rules.render_tag_field(record_rules.SCHEDULED_TAG_FIELD, SPARK_SQL, levels)
    assert "try_element_at(array(100, 5000, 60000), queue_id + 1)" in sql
