"""The Spark fsck and rebuild on a store holding delayed messages agree with `mqstore check`: a
SCHEDULE_TOPIC_XXXX entry's tag field is the delivery time (engine.record_rules), no finding."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import pytest

from engine.check.fsck import check as engine_check
from engine.record_rules import SCHEDULED_TAG_FIELD, SPARK_SQL, render_tag_field, tag_field_function
from engine.store import MessageStore
from engine.topics.system import SCHEDULE_TOPIC
from tests.helpers import SMALL_CONFIG
from tools.spark import jobs

pytestmark = pytest.mark.slow  # Spark jobs

LEVELS_MS = (100, 2000, 7000)
CONFIG = SMALL_CONFIG.replace(message_delay_level="100ms 1h 2h")  # only level 1 falls due in a test


def test_spark_check_of_delayed_messages_finds_nothing_as_mqstore_check(spark, tmp_path):
    with MessageStore.open(tmp_path, CONFIG) as store:
        sent = [store.put("Orders", b"d-%d" % i, tags="TagA", queue_id=i % 4, delay_level=1 + i % 3)
                for i in range(6)]
        assert store.put("Orders", b"plain", tags="TagA", queue_id=0).ok
        assert store.deliver_due(now_ms=sent[-1].store_ts_ms + 100) == 2  # level 1: d-0 and d-3
    assert engine_check(tmp_path) == []
    report = jobs.check(spark, tmp_path)
    assert report.findings == []
    assert report.cq_entries == 6 + 1 + 2


def test_the_tag_field_sql_computes_what_the_scalar_rule_computes_in_spark(spark):
    rows = [(topic, queue_id, 1_000_000, 77) for topic, queue_id in
            itertools.product((SCHEDULE_TOPIC, "Orders"), (0, 1, 2, 3, 40))]
    frame = spark.createDataFrame(rows, "topic string, queue_id int, store_ts_ms long, tags_code long")
    sql = render_tag_field(SCHEDULED_TAG_FIELD, SPARK_SQL, LEVELS_MS)
    computed = sorted(tuple(r) for r in frame.selectExpr("topic", "queue_id", f"{sql} AS tag").collect())
    scalar = tag_field_function(LEVELS_MS)
    assert computed == sorted((t, q, scalar(t, q, ts, tag)) for t, q, ts, tag in rows)


def test_spark_rebuild_writes_the_delivery_times_the_dispatcher_wrote(spark, tmp_path):
    original = tmp_path / "store"
    with MessageStore.open(original, CONFIG) as store:
        for i in range(5):
            assert store.put("Orders", b"d-%d" % i, tags="TagA", queue_id=i % 4, delay_level=1 + i % 3).ok
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copytree(original / "commitlog", copy / "commitlog")
    shutil.copy(original / "store.json", copy / "store.json")
    jobs.rebuild(spark, copy)
    for level in range(3):
        queue = Path(SCHEDULE_TOPIC) / str(level)
        files = sorted((original / "consumequeue" / queue).iterdir())
        assert [p.read_bytes() for p in files] == \
            [(copy / "consumequeue" / queue / p.name).read_bytes() for p in files]
    assert engine_check(copy) == []
