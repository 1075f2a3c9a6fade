"""The SQL92 property filter: each operator, RocketMQ's number reading and NULL logic, canonical
text, and syntax errors that name their position."""

from __future__ import annotations

import time

import pytest

from engine.errors import FilterSyntaxError
from engine.filters.sql import MAX_EXPRESSION_CHARS, MAX_NESTING_DEPTH, compile_sql_filter

RECORDS = [{"a": "2", "s": "eu"}, {"a": "10", "s": "us"}, {"a": "10.5", "s": "x'y"}, {"s": "eu"},
           {"a": "x"}, {"a": "-3", "b": "-3"}]


def _matching(expression: str) -> list[int]:
    f = compile_sql_filter(expression)
    return [i for i, props in enumerate(RECORDS) if f.matches(props)]


@pytest.mark.parametrize("expression, expected", [
    ("a = 2", [0]), ("a <> 2", [1, 5]), ("a < 10", [0, 5]), ("a > 5", [1]), ("a <= 2", [0, 5]),
    ("a >= 10", [1]), ("a > 5.0", [1, 2]), ("a BETWEEN 2 AND 10", [0, 1]), ("a NOT BETWEEN 0 AND 5", [1, 5]),
    ("s IN ('eu', 'us')", [0, 1, 3]), ("s NOT IN ('eu')", [1, 2]), ("a IS NULL", [3]),
    ("a IS NOT NULL", [0, 1, 2, 4, 5]), ("s = 'x''y'", [2]), ("a > 1 AND s = 'eu'", [0]),
    ("a > 5 OR s = 'eu'", [0, 1, 3]), ("NOT a = 2", [1, 5]), ("NOT (a > 5 OR a < 0)", [0]),
    ("a = -3", [5]), ("a = b", [5]), ("a < b", []), ("a = 2L", [0]), ("a >= .5e1", [1, 2]),
    ("TRUE", [0, 1, 2, 3, 4, 5]), ("FALSE OR a = 10", [1]),
    ("a > 1 /* block */ AND -- line\n s = 'us'", [1]), ("a = 2 and S = 'eu'", []),
])
def test_each_operator(expression, expected):
    assert _matching(expression) == expected


def test_null_logic_is_three_valued():
    missing = {}
    assert not compile_sql_filter("a = 1").matches(missing)
    assert not compile_sql_filter("NOT a = 1").matches(missing)  # NOT NULL is NULL: no match
    assert compile_sql_filter("a = 1 OR TRUE").matches(missing)  # NULL OR TRUE is TRUE
    assert not compile_sql_filter("a = 1 AND TRUE").matches(missing)
    assert compile_sql_filter("NOT (a = 1 AND FALSE)").matches(missing) is not False
    assert compile_sql_filter("a IS NULL").matches(missing)
    assert not compile_sql_filter("a NOT IN ('x')").matches(missing)


def test_numbers_read_as_the_literal_type():
    ten_and_a_half = {"a": "10.5"}
    assert not compile_sql_filter("a > 5").matches(ten_and_a_half)  # an int literal: no long read
    assert compile_sql_filter("a > 5.0").matches(ten_and_a_half)
    assert not compile_sql_filter("a > 5").matches({"a": " 10"})
    assert not compile_sql_filter("a = 'x'").matches({"a": "X"})  # strings compare exactly


def test_canonical_text_and_equality():
    a = compile_sql_filter("a>1 and (b='x' or c is not null)")
    b = compile_sql_filter("A>1 AND (b = 'x' OR c IS NOT NULL)".replace("A>", "a>"))
    assert a == b and str(a) == "a > 1 AND (b = 'x' OR c IS NOT NULL)"
    assert compile_sql_filter(str(a)) == a
    assert str(compile_sql_filter("s in ('b','a','b')")) == "s IN ('a', 'b')"
    assert compile_sql_filter("a = 1") != compile_sql_filter("a = 2")


@pytest.mark.parametrize("expression, position, words", [
    ("", 0, "empty"), ("   ", 3, "empty"), ("a >", 3, "found the end"), ("s = 'eu", 4, "unterminated string"),
    ("a = 1 /* x", 6, "unterminated comment"), ("a = NULL", 4, "IS NULL"), ("a", 0, "expected a condition"),
    ("a > 'x'", 4, "orders numbers"), ("a BETWEEN 5 AND 1", 10, "empty"), ("a IN (1)", 6, "string literals"),
    ("5 IN ('a')", 0, "property on its left"), ("a # 1", 2, "unexpected character"),
    ("a / 2 = 1", 2, "unexpected character '/'"), ("a OR b = 1", 0, "expected a condition"),
    ("a = 1 b = 2", 6, "expected AND, OR"), ("(a = 1", 6, "expected ')'"),
    ("a = 99999999999999999999", 4, "long"), ("a = -b", 4, "numbers only"),
    ("a = 1 AND 'x'", 10, "expected a condition"), ("a = (b = 1)", 5, "compared"),
])
def test_syntax_errors_name_the_position(expression, position, words):
    with pytest.raises(FilterSyntaxError) as info:
        compile_sql_filter(expression)
    assert info.value.position == position and info.value.expression == expression
    assert words in str(info.value) and f"position {position}" in str(info.value)
    assert info.value.field == "where"


def test_nesting_past_the_limit_is_refused_not_a_recursion_error():
    deepest = "(" * MAX_NESTING_DEPTH + "a = 1" + ")" * MAX_NESTING_DEPTH
    assert compile_sql_filter(deepest).matches({"a": "1"})
    mixed = "a = 1"
    for level in range(MAX_NESTING_DEPTH):  # alternating AND / OR nodes, each a level deeper
        mixed = f"(b = {level} {'OR' if level % 2 else 'AND'} {mixed})"
    assert compile_sql_filter(mixed).matches({"b": "63"})
    too_deep = "(" * (MAX_NESTING_DEPTH + 1) + "a = 1" + ")" * (MAX_NESTING_DEPTH + 1)
    with pytest.raises(FilterSyntaxError) as info:
        compile_sql_filter(too_deep)
    assert info.value.position == MAX_NESTING_DEPTH and "nested deeper than 64" in str(info.value)


def test_runs_of_not_and_of_signs_collapse():
    assert str(compile_sql_filter("NOT " * 5000 + "a = 1")) == "a = 1"
    assert compile_sql_filter("NOT " * 5001 + "a = 1").matches({"a": "2"})
    assert compile_sql_filter("a = " + "- " * 5001 + "1").matches({"a": "-1"})
    assert str(compile_sql_filter("a = - + - 1")) == "a = 1"
    with pytest.raises(FilterSyntaxError, match="expected a condition"):
        compile_sql_filter("NOT NOT 'x'")


def test_long_and_or_chains_evaluate_without_recursion():
    ids = compile_sql_filter(" OR ".join(f"id = {i}" for i in range(1000)))  # IN takes strings only
    assert ids.matches({"id": "999"}) and not ids.matches({"id": "1000"}) and not ids.matches({})
    chain = compile_sql_filter(" AND ".join(["a = 1"] * 1000))
    assert chain.matches({"a": "1"}) and not chain.matches({"a": "2"})


def test_a_longest_and_chain_compiles_in_linear_time():
    """3,700 terms (64 KiB) took about 20 s when every AND rescanned the text built so far."""
    terms = []
    while sum(len(t) + 5 for t in terms) < MAX_EXPRESSION_CHARS - 20:
        terms.append(f"p{len(terms)} IS NULL")
    expression = " AND ".join(terms)
    started = time.monotonic()
    compiled = compile_sql_filter(expression)
    assert time.monotonic() - started < 5.0
    assert compiled.matches({}) and not compiled.matches({"p7": "x"})
    assert str(compiled) == expression


def test_an_expression_past_the_length_limit_is_refused():
    too_long = "a = 1 OR " * (MAX_EXPRESSION_CHARS // 9 + 1) + "a = 2"
    with pytest.raises(FilterSyntaxError, match=f"more than {MAX_EXPRESSION_CHARS}") as info:
        compile_sql_filter(too_long)
    assert info.value.field == "where"
