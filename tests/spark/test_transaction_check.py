"""The Spark fsck on a store holding transaction records agrees with `mqstore check`.

PREPARED and ROLLBACK records at queue offset 0 (RocketMQ's: no consume-queue entry) and at other
offsets (an older mqstore's: messages of their queue), as tests/engine/test_transaction_records.py
writes them; the consume-queue rule comes from engine.record_rules for both checks.
"""

from __future__ import annotations

import itertools

import pytest

from engine.check.fsck import check as engine_check
from engine.formats.record import TxType
from engine.record_rules import ENTERS_CONSUME_QUEUE_SQL, enters_consume_queue
from tests.engine.test_transaction_records import crashed_store_with
from tests.helpers import reopen
from tools.spark import jobs

pytestmark = pytest.mark.slow  # Spark jobs

RAW = [(b"half", 0, 0, TxType.PREPARED), (b"undo", 0, 0, TxType.ROLLBACK), (b"after0", 0, 2, TxType.NOT),
       (b"prepared", 1, 2, TxType.PREPARED), (b"rollback", 1, 3, TxType.ROLLBACK),
       (b"committed", 1, 4, TxType.COMMIT), (b"after1", 1, 5, TxType.NOT)]


def test_spark_check_of_transaction_records_at_offset_zero_and_beyond_agrees_with_mqstore_check(
        spark, tmp_path):
    crashed_store_with(tmp_path, RAW)
    with reopen(tmp_path) as store:  # recovery dispatches the records after the crash
        assert store.max_offset("T", 0) == 3 and store.max_offset("T", 1) == 6
    assert engine_check(tmp_path) == []
    report = jobs.check(spark, tmp_path)
    assert report.findings == []
    assert report.records == 4 + len(RAW)
    assert report.cq_entries == 4 + len(RAW) - 2  # the two records at offset 0 have no entry


def test_the_consume_queue_sql_selects_what_the_scalar_rule_selects_in_spark(spark):
    rows = [(int(tx) | bits, offset) for tx, bits, offset in itertools.product(TxType, (0, 0x3), (0, 1, 9))]
    frame = spark.createDataFrame(rows, "sys_flag int, queue_offset long")
    kept = sorted(tuple(r) for r in frame.where(ENTERS_CONSUME_QUEUE_SQL).collect())
    assert kept == sorted(row for row in rows if enters_consume_queue(*row))
