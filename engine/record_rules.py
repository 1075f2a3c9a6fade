"""Which records enter a consume queue and which are indexed: each rule written once, as data.

A rule is a small expression over a record's header fields (`Clause`, combined by `AllOf` and
`AnyOf`). It is rendered three ways from that one definition, so the store, the dispatcher,
recovery, `mqstore check` and the Spark jobs cannot disagree:

- `scalar_function`: a plain Python function of the fields, generated once at import, so a
  hot loop pays one call and no interpretation;
- `numpy_function`: the same test over numpy columns, a boolean mask, generated the same way;
- `render_text(expr, SPARK_SQL)`: a Spark SQL condition over the dispatch view's columns.

The rules (RocketMQ stores transactional half (PREPARED) and ROLLBACK records with QUEUEOFFSET 0
and gives them no consume-queue entry; a rollback gets no index keys either). mqstore refuses
these bits from producers (workers.request_check), but an older mqstore gave such records the
queue's next offset and acknowledged them: a record carrying an offset other than 0 holds its
place in its queue, so it is a message like any other (skipping it left a gap that stopped the
store). One at offset 0 stays out as RocketMQ's do. An entry's tag field is the TAGS hash, or
in SCHEDULE_TOPIC_XXXX the delivery time (SCHEDULED_TAG_FIELD, rendered the same three ways).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from engine.formats.record import TX_TYPE_MASK, TxType
from engine.topics.system import SCHEDULE_TOPIC

# The header fields a rule may test, in the order every rendering takes them as arguments.
FIELDS = ("sys_flag", "queue_offset")


class Op(Enum):
    """How a clause compares a field with its values."""

    IN = "in"
    NOT_IN = "not in"


@dataclass(frozen=True)
class Clause:
    """`(field & mask) op values`: one test of one header field (`mask` None: the whole field)."""

    field: str
    op: Op
    values: tuple[int, ...]
    mask: int | None = None

    def __post_init__(self) -> None:
        if self.field not in FIELDS:
            raise ValueError(f"a rule tests only {FIELDS}, not {self.field!r}")
        if not self.values:
            raise ValueError("a clause needs at least one value")


@dataclass(frozen=True)
class AllOf:
    """True when every part holds."""

    parts: tuple[Expr, ...]


@dataclass(frozen=True)
class AnyOf:
    """True when some part holds."""

    parts: tuple[Expr, ...]


Expr = Clause | AllOf | AnyOf
_OPPOSITE = {Op.IN: Op.NOT_IN, Op.NOT_IN: Op.IN}


def negation(expr: Expr) -> Expr:
    """The expression true exactly where `expr` is false (De Morgan: no NOT node to render)."""
    if isinstance(expr, Clause):
        return Clause(expr.field, _OPPOSITE[expr.op], expr.values, expr.mask)
    if isinstance(expr, AllOf):
        return AnyOf(tuple(negation(part) for part in expr.parts))
    return AllOf(tuple(negation(part) for part in expr.parts))


# ------------------------------------------------------------------------------ the rules

_AT_OFFSET_ZERO = Clause("queue_offset", Op.IN, (0,))
_HALF_OR_ROLLBACK = Clause("sys_flag", Op.IN, (int(TxType.PREPARED), int(TxType.ROLLBACK)), TX_TYPE_MASK)
_ROLLBACK = Clause("sys_flag", Op.IN, (int(TxType.ROLLBACK),), TX_TYPE_MASK)

# The offset clause comes first: it is the cheap one, and for nearly every record it decides.
HELD_OUT_OF_QUEUE = AllOf((_AT_OFFSET_ZERO, _HALF_OR_ROLLBACK))
ENTERS_CONSUME_QUEUE = negation(HELD_OUT_OF_QUEUE)
UNINDEXED_ROLLBACK = AllOf((_AT_OFFSET_ZERO, _ROLLBACK))

# The SYSFLAG bit set in exactly the transaction types kept out of queues (0x4 of PREPARED 0x4
# and ROLLBACK 0xC): the producer refusal (workers.request_check) tests it with one AND.
HALF_OR_ROLLBACK_BIT = _HALF_OR_ROLLBACK.values[0] & _HALF_OR_ROLLBACK.values[1]
assert all(bool(tx & HALF_OR_ROLLBACK_BIT) == (tx in _HALF_OR_ROLLBACK.values) for tx in TxType)


# ------------------------------------------------------------------------------ renderings


class Dialect(NamedTuple):
    """The words a text rendering writes: Python's or Spark SQL's."""

    equal: str
    ops: dict[Op, str]
    joiners: dict[type, str]


PYTHON = Dialect("==", {Op.IN: "in", Op.NOT_IN: "not in"}, {AllOf: " and ", AnyOf: " or "})
SPARK_SQL = Dialect("=", {Op.IN: "IN", Op.NOT_IN: "NOT IN"}, {AllOf: " AND ", AnyOf: " OR "})


def render_text(expr: Expr, dialect: Dialect) -> str:
    """`expr` as a condition over the names in FIELDS, in Python or Spark SQL."""
    if isinstance(expr, Clause):
        operand = expr.field if expr.mask is None else f"({expr.field} & {expr.mask})"
        if len(expr.values) == 1:
            return f"{operand} {dialect.equal if expr.op is Op.IN else '!='} {expr.values[0]}"
        return f"{operand} {dialect.ops[expr.op]} ({', '.join(map(str, expr.values))})"
    return "(" + dialect.joiners[type(expr)].join(render_text(part, dialect) for part in expr.parts) + ")"


def _compiled(name: str, body: list[str], expr: Expr) -> Callable:
    """`def name(*FIELDS): body`, compiled once; its docstring is the rule it renders."""
    source = f"def {name}({', '.join(FIELDS)}):\n" + "".join(f"    {line}\n" for line in body)
    namespace: dict = {}
    exec(compile(source, f"<record rule {name}>", "exec"), namespace)
    function = namespace[name]
    function.__doc__ = f"Record rule: {render_text(expr, PYTHON)}"
    function.__module__ = __name__
    return function


def scalar_function(expr: Expr, name: str) -> Callable[[int, int], bool]:
    """`expr` as `name(sys_flag, queue_offset) -> bool`, compiled from generated source once, so
    a call costs what the same function written by hand costs."""
    return _compiled(name, [f"return {render_text(expr, PYTHON)}"], expr)


def _numpy_source(expr: Expr, operands: dict[str, str]) -> str:
    """`expr` as a numpy expression over the names in FIELDS; each masked field it tests is
    computed once, into a local named in `operands` (local name -> its expression)."""
    if isinstance(expr, Clause):
        operand = expr.field
        if expr.mask is not None:
            operand = f"{expr.field}_and_{expr.mask}"
            operands[operand] = f"{expr.field} & {expr.mask}"
        compare, join = ("==", " | ") if expr.op is Op.IN else ("!=", " & ")
        return "(" + join.join(f"({operand} {compare} {value})" for value in expr.values) + ")"
    joiner = " & " if isinstance(expr, AllOf) else " | "
    return "(" + joiner.join(_numpy_source(part, operands) for part in expr.parts) + ")"


def numpy_function(expr: Expr, name: str) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """`expr` over columns: `name(sys_flag, queue_offset)` is the boolean mask of the rows it
    holds for, generated once as `scalar_function` is."""
    operands: dict[str, str] = {}
    # Parts in order, stopping at one that holds for no row: the rest cannot change the answer
    # (in a steady store no record has queue offset 0, so one whole-array compare decides).
    parts = expr.parts if isinstance(expr, AllOf) else (expr,)
    body = []
    for i, part in enumerate(parts):
        known = set(operands)
        source = _numpy_source(part, operands)
        body += [f"{local} = {operands[local]}" for local in operands if local not in known]
        body += [f"part_{i} = {source}", f"if not part_{i}.any(): return part_{i}"]
    return _compiled(name, [*body, "return " + " & ".join(f"part_{i}" for i in range(len(parts)))], expr)


enters_consume_queue = scalar_function(ENTERS_CONSUME_QUEUE, "enters_consume_queue")
is_unindexed_rollback = scalar_function(UNINDEXED_ROLLBACK, "is_unindexed_rollback")
held_out_of_queue_mask = numpy_function(HELD_OUT_OF_QUEUE, "held_out_of_queue_mask")
unindexed_rollback_mask = numpy_function(UNINDEXED_ROLLBACK, "unindexed_rollback_mask")
ENTERS_CONSUME_QUEUE_SQL = render_text(ENTERS_CONSUME_QUEUE, SPARK_SQL)


# ------------------------------------------------------------------------------ the tag field
# What a consume-queue entry's tag field holds (RocketMQ's tagsCode): the Java hash of TAGS,
# except in SCHEDULE_TOPIC_XXXX, where it is the delivery time, so the delivery service finds
# what is due without reading records (RocketMQ's CommitLog.checkMessageAndReturnSize).


@dataclass(frozen=True)
class DeliveryTimeRule:
    """In `topic`, the tag field is `store_ts_ms` plus the delay of the level the queue holds
    (queue q holds level q + 1); a queue past the table delivers at its store time."""

    topic: str


SCHEDULED_TAG_FIELD = DeliveryTimeRule(SCHEDULE_TOPIC)


def render_tag_field(rule: DeliveryTimeRule, dialect: Dialect, levels_ms: tuple[int, ...]) -> str:
    """The tag field as an expression over topic, queue_id, store_ts_ms and tags_code."""
    table = ", ".join(map(str, levels_ms))
    if dialect is SPARK_SQL:
        return (f"CASE WHEN topic = '{rule.topic}' THEN store_ts_ms + "
                f"coalesce(try_element_at(array({table}), queue_id + 1), 0) ELSE tags_code END")
    return (f"(store_ts_ms + (({table},)[queue_id] if 0 <= queue_id < {len(levels_ms)} else 0) "
            f"if topic == {rule.topic!r} else tags_code)")


@lru_cache(maxsize=16)
def tag_field_function(levels_ms: tuple[int, ...]) -> Callable[[str, int, int, int], int]:
    """`tag_field(topic, queue_id, store_ts_ms, tags_code)`: SCHEDULED_TAG_FIELD in Python,
    compiled once per level table."""
    source = ("def tag_field(topic, queue_id, store_ts_ms, tags_code):\n"
              f"    return {render_tag_field(SCHEDULED_TAG_FIELD, PYTHON, levels_ms)}\n")
    namespace: dict = {}
    exec(compile(source, "<record rule tag_field>", "exec"), namespace)
    function = namespace["tag_field"]
    function.__doc__ = f"Record rule: {render_tag_field(SCHEDULED_TAG_FIELD, PYTHON, levels_ms)}"
    return function


def scheduled_tag_column(store_ts_ms: np.ndarray, queue_id: np.ndarray | int,
                         levels_ms: tuple[int, ...]) -> np.ndarray:
    """SCHEDULED_TAG_FIELD over the rows of SCHEDULE_TOPIC_XXXX entries: the delivery times."""
    table = np.array([*levels_ms, 0], dtype=np.int64)  # the last item: a queue past the table
    queues = np.asarray(queue_id, dtype=np.int64)
    at = np.where((queues >= 0) & (queues < len(levels_ms)), queues, len(levels_ms))
    return np.asarray(store_ts_ms, dtype=np.int64) + table[at]
