"""Subscriptions on MessageStore.get_messages: tags by tagsCode then TAGS, the property filter,
entries passed over, the next offset, and the scan bound (RocketMQ's maxFilterMessageSize)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.check.fsck import check
from engine.errors import BadInputError, FilterSyntaxError
from engine.filters.subscription import MIN_FILTER_SCAN_ENTRIES, Subscription, subscription_of
from engine.filters.tag_expression import parse_tag_expression
from engine.formats.java_hash import tags_code
from engine.message import Message
from engine.status import GetStatus
from engine.store import MessageStore
from tests.helpers import TOPIC


def _fill(store: MessageStore, tags_list, properties=None) -> None:
    store.put_batch([Message(TOPIC, f"m{i}".encode(), tags=tag, properties=(properties or {}).get(i, {}))
                     for i, tag in enumerate(tags_list)])


def _bodies(result) -> list[bytes]:
    return [record.body for record in result.messages]


def test_tags_colliding_hash_confirmed_by_the_record(tmp_path):
    assert tags_code("Aa") == tags_code("BB") == 2112  # Java String.hashCode collides
    with MessageStore.open(tmp_path / "s") as store:
        _fill(store, ["Aa", "BB", "Aa", None, "BB"])
        got = store.get_messages(TOPIC, 0, 0, 32, tags="BB")
        assert _bodies(got) == [b"m1", b"m4"]
        assert [r.tags for r in got.messages] == ["BB", "BB"]
        assert got.next_offset == 5
    assert check(tmp_path / "s") == []


def test_tags_or_with_spaces_is_the_same_subscription(tmp_path):
    assert subscription_of("A||B") == subscription_of("  B ||  A ") == subscription_of("A || B || A")
    assert str(subscription_of(" B||A ")) == "A || B"
    assert str(subscription_of(tags="*")) == "*" and subscription_of("*").matches_all
    with MessageStore.open(tmp_path / "s") as store:
        _fill(store, ["A", "C", "B", "A", "C"])
        assert _bodies(store.get_messages(TOPIC, 0, 0, tags=" A ||B ")) == [b"m0", b"m2", b"m3"]
        assert len(store.get_messages(TOPIC, 0, 0, tags="*").messages) == 5


def test_skipped_entries_do_not_count_and_next_offset_passes_them(tmp_path):
    with MessageStore.open(tmp_path / "s") as store:
        _fill(store, ["X", "A", "X", "X", "A", "X", "A", "X"])
        first = store.get_messages(TOPIC, 0, 0, 2, tags="A")
        assert first.status is GetStatus.FOUND and _bodies(first) == [b"m1", b"m4"]
        assert first.next_offset == 5  # one past the second match, as RocketMQ stops there
        second = store.get_messages(TOPIC, 0, first.next_offset, 2, tags="A")
        assert _bodies(second) == [b"m6"] and second.next_offset == 8
        unfiltered = store.get_messages(TOPIC, 0, 0, 2)
        assert _bodies(unfiltered) == [b"m0", b"m1"] and unfiltered.next_offset == 2


def test_long_non_matching_run_returns_within_the_scan_bound(tmp_path):
    run = MIN_FILTER_SCAN_ENTRIES + 500
    with MessageStore.open(tmp_path / "s") as store:
        _fill(store, ["X"] * run + ["A"])
        got = store.get_messages(TOPIC, 0, 0, 32, tags="A")
        assert got.status is GetStatus.NO_MATCHED_MESSAGE and got.messages == []
        assert got.next_offset == MIN_FILTER_SCAN_ENTRIES  # moved on, not past the bound
        rest = store.get_messages(TOPIC, 0, got.next_offset, 32, tags="A")
        assert _bodies(rest) == [f"m{run}".encode()] and rest.next_offset == run + 1


def test_where_filters_on_properties(tmp_path):
    props = {0: {"region": "eu", "amount": "150"}, 1: {"region": "us", "amount": "500"},
             2: {"region": "eu", "amount": "50"}, 3: {"region": "eu"}, 4: {"region": "eu", "amount": "101"}}
    with MessageStore.open(tmp_path / "s") as store:
        _fill(store, ["A", "A", "B", "A", "B"], props)
        got = store.get_messages(TOPIC, 0, 0, where="region = 'eu' AND amount > 100")
        assert _bodies(got) == [b"m0", b"m4"] and got.next_offset == 5
        both = store.get_messages(TOPIC, 0, 0, tags="B", where="amount > 100")
        assert _bodies(both) == [b"m4"]
        tags_as_property = store.get_messages(TOPIC, 0, 0, where="TAGS = 'B'")
        assert _bodies(tags_as_property) == [b"m2", b"m4"]


@pytest.mark.parametrize("tags, where", [("", None), (" || ", None), ("A || *", None), (None, ""),
                                         (None, "amount >"), (None, "region = 'eu"), (["A"], None)])
def test_bad_subscription_is_refused_and_changes_nothing(tmp_path, tags, where):
    with MessageStore.open(tmp_path / "s") as store:
        _fill(store, ["A"])
        before = sorted(p.name for p in (tmp_path / "s").rglob("*"))
        with pytest.raises(BadInputError) as info:
            store.get_messages(TOPIC, 0, 0, tags=tags, where=where)
        assert info.value.field == ("tags" if where is None else "where")
        assert sorted(p.name for p in (tmp_path / "s").rglob("*")) == before


def test_where_syntax_error_names_position_and_expression():
    with pytest.raises(FilterSyntaxError) as info:
        subscription_of(where="region = 'eu' AND amount >> 5")
    assert info.value.position == 26 and info.value.expression == "region = 'eu' AND amount >> 5"
    assert "position 26" in str(info.value) and "region = 'eu' AND amount >> 5" in str(info.value)


def test_subscription_equality_and_text():
    a = subscription_of("B || A", "amount   >  100 and region='eu'")
    b = subscription_of("A||B", "AMOUNT > 100 AND region = 'eu'".replace("AMOUNT", "amount"))
    assert a == b and hash(a) == hash(b)
    assert str(a) == "A || B WHERE amount > 100 AND region = 'eu'"
    assert a != subscription_of("A || B") and Subscription() == subscription_of()
    assert parse_tag_expression("*").candidates(np.array([1, 2])).all()
