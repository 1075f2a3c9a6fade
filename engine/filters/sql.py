"""A property filter, RocketMQ's SQL92 subset (`MessageSelector.bySql`), compiled once.

Grammar (SelectorParser.jj's, by precedence from low to high; keywords case-insensitive):

    condition  := or
    or         := and ("OR" and)*
    and        := not ("AND" not)*
    not        := "NOT"* equality
    equality   := comparison (("=" | "<>") comparison | "IS" ["NOT"] "NULL")*
    comparison := unary (("<" | ">" | "<=" | ">=") unary
                        | ["NOT"] "BETWEEN" unary "AND" unary
                        | ["NOT"] "IN" "(" string ("," string)* ")")*
    unary      := ("+" | "-")* number | primary
    primary    := property | string | number | "TRUE" | "FALSE" | "NULL" | "(" or ")"

A property reads the record's property of that name (user and system ones: TAGS, KEYS, ...):
a str, or NULL when absent. Evaluation follows RocketMQ: a string compared with a number is read as that
number's type ("10" > 5; "10.5" > 5 is unknown, "10.5" > 5.0 true), two properties ordered by
`<` are read as decimals, `=` and `<>` compare strings exactly, and logic is three-valued (a
missing property makes a comparison NULL; NULL or a failed number read never matches).

Where mqstore differs: NOT binds looser than a comparison, as in SQL (`NOT a = 1` is
`NOT (a = 1)`; RocketMQ's NOT takes the next term only), a property or literal standing alone
as a condition is refused when compiled (RocketMQ compiles it and never matches), unary minus
applies to numbers only, and a string that does not read as a number makes only its
comparison NULL, not the whole expression false, while a number past Java's int range
("3000000000" against an int literal) or in non-ASCII digits (fullwidth, Arabic-Indic) does
read as a number (RocketMQ's valueOf refuses both). CONTAINS, STARTSWITH and ENDSWITH
(RocketMQ 5.1.3+) are not implemented. Tokens: engine.filters.sql_tokens.

Bounds: an expression longer than MAX_EXPRESSION_CHARS or with parentheses nested deeper than
MAX_NESTING_DEPTH is refused (FilterSyntaxError), so neither compiling nor evaluating can
exhaust Python's stack. AND and OR chains are one node each, evaluated in a loop, and runs of
NOT or of unary signs collapse as they are read (`NOT NOT a = 1` is `a = 1`); compiling is
linear in the expression's length.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from engine.errors import FilterSyntaxError
from engine.filters.sql_tokens import Token, tokenize

Predicate = Callable[[Mapping[str, str]], object]
LONG_MAX = 2**63 - 1
MAX_EXPRESSION_CHARS = 64 * 1024
# Each level of parentheses costs 7 parser frames and up to 2 evaluation frames: 64 levels stay
# far below Python's default recursion limit of 1000, with room for the caller's own frames.
MAX_NESTING_DEPTH = 64
_INT_RE = re.compile(r"[+-]?\d+")
_DECIMAL_RE = re.compile(r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*")
_ORDER_OPS = {"<": operator.lt, ">": operator.gt, "<=": operator.le, ">=": operator.ge}
_EQUALITY_OPS = {"=": operator.eq, "<>": operator.ne}


class Kind(Enum):
    """What a term yields: a condition (True, False, None) or a value of one type."""

    CONDITION = "condition"
    PROPERTY = "property"
    STRING = "string"
    NUMBER = "number"
    BOOLEAN = "boolean"
    NULL = "null"


@dataclass(frozen=True, slots=True)
class _Term:
    """A compiled piece: its kind, its canonical text, how to evaluate it, where it starts,
    and the logic operator at the top of its text ("OR", "AND", or "" for none)."""

    kind: Kind
    text: str
    fn: Predicate
    pos: int
    value: object = None  # a literal's value; a property's name
    top: str = ""


@dataclass(frozen=True, slots=True)
class SqlFilter:
    """A compiled property filter; equal filters have equal canonical text (`str`)."""

    text: str
    predicate: Predicate = field(compare=False, repr=False)

    def matches(self, properties: Mapping[str, str]) -> bool:
        """True only when the condition holds (NULL, unknown, false: no match)."""
        return self.predicate(properties) is True

    def __str__(self) -> str:
        return self.text


def compile_sql_filter(expression: str, field_name: str = "where") -> SqlFilter:
    """Parse and compile `expression`; FilterSyntaxError names the position where it fails."""
    if not isinstance(expression, str):
        raise FilterSyntaxError(field_name, repr(expression), 0, "the expression must be a str")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise FilterSyntaxError(field_name, expression[:80] + "...", 0,
                                f"the expression is {len(expression)} characters, more than "
                                f"{MAX_EXPRESSION_CHARS}")
    parser = _Parser(expression, field_name)
    if parser.peek.kind == "end":
        parser.fail(parser.peek, "the expression is empty")
    term = parser.or_()
    if parser.peek.kind != "end":
        parser.fail(parser.peek, f"expected AND, OR or the end, found {_shown(parser.peek)}")
    parser.require_condition(term)
    return SqlFilter(term.text, term.fn)


class _Parser:
    """Recursive descent over the tokens, one method per grammar rule, each returning a _Term."""

    def __init__(self, expression: str, field_name: str):
        self.expression = expression
        self.field_name = field_name
        self.tokens = tokenize(expression, field_name)
        self.at = 0
        self.depth = 0  # parentheses open around the token being read

    @property
    def peek(self) -> Token:
        return self.tokens[self.at]

    def take(self) -> Token:
        token = self.tokens[self.at]
        self.at += 1
        return token

    def accept(self, *texts: str) -> Token | None:
        token = self.peek
        if token.kind in ("keyword", "op") and token.text in texts:
            return self.take()
        return None

    def expect(self, text: str) -> Token:
        token = self.accept(text)
        if token is None:
            self.fail(self.peek, f"expected {text!r}, found {_shown(self.peek)}")
        return token

    def fail(self, token: Token | _Term, reason: str):
        raise FilterSyntaxError(self.field_name, self.expression, token.pos, reason)

    def require_condition(self, term: _Term) -> None:
        if term.kind is not Kind.CONDITION and term.kind is not Kind.BOOLEAN:
            self.fail(term, f"expected a condition, found the {term.kind.value} {term.text}")

    # -- logic -------------------------------------------------------------------------------
    def or_(self) -> _Term:
        terms = [self.and_()]
        while self.accept("OR"):
            terms.append(self.and_())
        return terms[0] if len(terms) == 1 else _or([self._condition(term) for term in terms])

    def and_(self) -> _Term:
        terms = [self.not_()]
        while self.accept("AND"):
            terms.append(self.not_())
        return terms[0] if len(terms) == 1 else _and([self._condition(term) for term in terms])

    def not_(self) -> _Term:
        nots = []
        while (token := self.accept("NOT")) is not None:
            nots.append(token)
        term = self.equality()
        if not nots:
            return term
        self._condition(term)
        return _not(term, nots[0].pos) if len(nots) % 2 else _Term(
            term.kind, term.text, term.fn, nots[0].pos, term.value, term.top)

    def _condition(self, term: _Term) -> _Term:
        self.require_condition(term)
        return term

    # -- comparisons -------------------------------------------------------------------------
    def equality(self) -> _Term:
        term = self.comparison()
        while True:
            op = self.accept("=", "<>", "IS")
            if op is None:
                return term
            if op.text == "IS":
                negated = self.accept("NOT") is not None
                self.expect("NULL")
                term = self._is_null(term, negated)
            else:
                term = self._compare(op.text, term, self.comparison())

    def comparison(self) -> _Term:
        term = self.unary()
        while True:
            op = self.accept("<", ">", "<=", ">=", "BETWEEN", "IN")
            negated = False
            if op is None and self.peek.text == "NOT" and self.tokens[self.at + 1].text in ("BETWEEN", "IN"):
                self.take()
                negated, op = True, self.take()
            if op is None:
                return term
            if op.text == "BETWEEN":
                low = self.unary()
                self.expect("AND")
                term = self._between(term, low, self.unary(), negated)
            elif op.text == "IN":
                term = self._in(term, negated)
            else:
                term = self._compare(op.text, term, self.unary())

    def _compare(self, op: str, left: _Term, right: _Term) -> _Term:
        for side in (left, right):
            if side.kind is Kind.NULL:
                self.fail(side, "NULL compares with nothing (use IS NULL or IS NOT NULL)")
            if side.kind is Kind.CONDITION:
                self.fail(side, f"a condition cannot be compared with {op}")
            if op in _ORDER_OPS and side.kind in (Kind.STRING, Kind.BOOLEAN):
                self.fail(side, f"{op} orders numbers, not the {side.kind.value} {side.text}")
        fn = _comparison(op, left, right)
        return _Term(Kind.CONDITION, f"{left.text} {op} {right.text}", fn, left.pos)

    def _between(self, term: _Term, low: _Term, high: _Term, negated: bool) -> _Term:
        if low.kind is Kind.NUMBER and high.kind is Kind.NUMBER and low.value > high.value:
            self.fail(low, f"BETWEEN {low.text} AND {high.text} is empty (the low bound is above the high)")
        inside = _and([self._compare(">=", term, low), self._compare("<=", term, high)])
        word = "NOT BETWEEN" if negated else "BETWEEN"
        fn = _not(inside).fn if negated else inside.fn
        return _Term(Kind.CONDITION, f"{term.text} {word} {low.text} AND {high.text}", fn, term.pos)

    def _in(self, term: _Term, negated: bool) -> _Term:
        if term.kind is not Kind.PROPERTY:
            self.fail(term, f"IN needs a property on its left, not the {term.kind.value} {term.text}")
        self.expect("(")
        values = []
        while True:
            token = self.take()
            if token.kind != "string":
                self.fail(token, f"IN takes string literals only, found {_shown(token)}")
            values.append(_string_value(token.text))
            if not self.accept(","):
                break
        self.expect(")")
        wanted, name = frozenset(values), term.value

        def fn(props: Mapping[str, str]) -> object:
            value = props.get(name)
            return None if value is None else (value in wanted) is not negated

        listed = ", ".join(_quote(v) for v in sorted(wanted))
        return _Term(Kind.CONDITION, f"{name} {'NOT IN' if negated else 'IN'} ({listed})", fn, term.pos)

    def _is_null(self, term: _Term, negated: bool) -> _Term:
        if term.kind is Kind.CONDITION:
            self.fail(term, "IS NULL applies to a property or a literal, not a condition")
        if term.kind is Kind.PROPERTY:
            name = term.value

            def fn(props: Mapping[str, str]) -> object:
                return (props.get(name) is None) is not negated
        else:
            constant = (term.kind is Kind.NULL) is not negated
            fn = _constant(constant)
        return _Term(Kind.CONDITION, f"{term.text} IS {'NOT NULL' if negated else 'NULL'}", fn, term.pos)

    # -- terms -------------------------------------------------------------------------------
    def unary(self) -> _Term:
        signs = []
        while (token := self.accept("+", "-")) is not None:
            signs.append(token)
        term = self.primary()
        if not signs:
            return term
        if term.kind is not Kind.NUMBER:
            self.fail(signs[-1], f"unary {signs[-1].text} applies to numbers only, not {term.text}")
        negated = sum(sign.text == "-" for sign in signs) % 2
        return _literal(Kind.NUMBER, -term.value if negated else term.value, signs[0].pos)

    def primary(self) -> _Term:
        token = self.take()
        if token.kind == "name":
            name = token.text
            return _Term(Kind.PROPERTY, name, lambda props: props.get(name), token.pos, name)
        if token.kind == "string":
            return _literal(Kind.STRING, _string_value(token.text), token.pos)
        if token.kind == "number":
            return _literal(Kind.NUMBER, self._number(token), token.pos)
        if token.text in ("TRUE", "FALSE"):
            return _literal(Kind.BOOLEAN, token.text == "TRUE", token.pos)
        if token.text == "NULL":
            return _Term(Kind.NULL, "NULL", _constant(None), token.pos)
        if token.text == "(":
            if self.depth == MAX_NESTING_DEPTH:
                self.fail(token, f"parentheses nested deeper than {MAX_NESTING_DEPTH}")
            self.depth += 1
            term = self.or_()
            self.expect(")")
            self.depth -= 1
            return term
        self.fail(token, f"expected a property, a literal or '(', found {_shown(token)}")

    def _number(self, token: Token) -> int | float:
        text = token.text.rstrip("lL")
        if text.isdigit():
            value = int(text)
            if value > LONG_MAX:
                self.fail(token, f"{token.text} is out of a long's range")
            return value
        return float(text)


def _shown(token: Token) -> str:
    return token.text if token.kind == "end" else repr(token.text)


# ---------------------------------------------------------------------------------- builders
def _constant(value: object) -> Predicate:
    return lambda props: value


def _literal(kind: Kind, value: object, pos: int) -> _Term:
    if kind is Kind.STRING:
        text = _quote(value)
    else:
        text = str(value).upper() if kind is Kind.BOOLEAN else repr(value)
    return _Term(kind, text, _constant(value), pos, value)


def _string_value(token_text: str) -> str:
    return token_text[1:-1].replace("''", "'")


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _and(terms: list[_Term]) -> _Term:
    """The conjunction of conditions, one node: False if any is False, else NULL if any is."""
    text = " AND ".join(f"({term.text})" if term.top == "OR" else term.text for term in terms)
    return _Term(Kind.CONDITION, text, _junction(terms, False), terms[0].pos, top="AND")


def _or(terms: list[_Term]) -> _Term:
    """The disjunction of conditions, one node: True if any is True, else NULL if any is."""
    text = " OR ".join(term.text for term in terms)
    return _Term(Kind.CONDITION, text, _junction(terms, True), terms[0].pos, top="OR")


def _junction(terms: list[_Term], decisive: bool):
    """Three-valued AND (`decisive` False) or OR (True) of the terms, evaluated in a loop (no
    recursion however long the chain): the decisive value wins at once, else NULL if any is."""
    fns = tuple(term.fn for term in terms)

    def fn(props: Mapping[str, str]) -> object:
        result = not decisive
        for f in fns:
            value = f(props)
            if value is decisive:
                return decisive
            if value is not (not decisive):
                result = None
        return result

    return fn


def _not(term: _Term, pos: int | None = None) -> _Term:
    inner = term.fn

    def fn(props: Mapping[str, str]) -> object:
        value = inner(props)
        return None if value is None else not value

    text = f"NOT ({term.text})" if " " in term.text else f"NOT {term.text}"
    return _Term(Kind.CONDITION, text, fn, term.pos if pos is None else pos)


# ---------------------------------------------------------------------------------- comparing
def _comparison(op: str, left: _Term, right: _Term) -> Predicate:
    """How `left op right` evaluates on a record's properties (None: unknown)."""
    compare = _ORDER_OPS.get(op) or _EQUALITY_OPS[op]
    ordering = op in _ORDER_OPS
    lread, rread = _reader(left, right, ordering), _reader(right, left, ordering)
    lf, rf = left.fn, right.fn

    def fn(props: Mapping[str, str]) -> object:
        a, b = lread(lf(props)), rread(rf(props))
        if a is None or b is None:
            return None
        return compare(a, b)

    return fn


def _reader(term: _Term, other: _Term, ordering: bool) -> Callable[[object], object]:
    """How a term's value is read for comparing with `other` (RocketMQ's string conversion)."""
    if term.kind is not Kind.PROPERTY:
        return _same
    if other.kind is Kind.NUMBER:
        return _as_int if isinstance(other.value, int) else _as_decimal
    if other.kind is Kind.BOOLEAN:
        return _as_boolean
    if other.kind is Kind.PROPERTY and ordering:
        return _as_decimal
    return _same


def _same(value: object) -> object:
    return value


def _as_int(value: str | None) -> int | None:
    if value is None or _INT_RE.fullmatch(value) is None:
        return None
    number = int(value)
    return number if -LONG_MAX - 1 <= number <= LONG_MAX else None


def _as_decimal(value: str | None) -> float | None:
    if value is None or _DECIMAL_RE.fullmatch(value) is None:
        return None
    return float(value)


def _as_boolean(value: str | None) -> bool | None:
    lowered = None if value is None else value.lower()
    return {"true": True, "false": False}.get(lowered)
