"""The tokens of a property filter (RocketMQ's SelectorParser.jj lexicon).

A property is `[A-Za-z_$][A-Za-z0-9_$]*` (case-sensitive); keywords are case-insensitive;
strings are '...' with '' for a quote; numbers are integers (an optional L) or decimals
(5.5, .5, 5E10); `--` to the end of the line and `/* */` are comments.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.errors import FilterSyntaxError

KEYWORDS = frozenset({"AND", "OR", "NOT", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE"})
_TOKEN_RE = re.compile(r"""
    (?P<space>\s+|--[^\n]*|/\*.*?\*/)
   |(?P<number>(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+[lL]?)
   |(?P<string>'(?:[^']|'')*')
   |(?P<name>[A-Za-z_$][A-Za-z0-9_$]*)
   |(?P<op><>|<=|>=|[=<>(),+-])
""", re.VERBOSE | re.DOTALL)


@dataclass(frozen=True, slots=True)
class Token:
    """One token: its kind, its text (a keyword upper-cased) and where it starts."""

    kind: str  # number, string, name, keyword, op, end
    text: str
    pos: int


def tokenize(expression: str, field_name: str = "where") -> list[Token]:
    """The tokens of `expression`, ending with an `end` token; FilterSyntaxError on a character
    no token starts with, or an unterminated string or comment."""
    tokens, pos = [], 0
    while pos < len(expression):
        match = _TOKEN_RE.match(expression, pos)
        if match is None:
            if expression.startswith("/*", pos):
                reason = "unterminated comment"
            elif expression[pos] == "'":
                reason = "unterminated string"
            else:
                reason = f"unexpected character {expression[pos]!r}"
            raise FilterSyntaxError(field_name, expression, pos, reason)
        kind, text = match.lastgroup, match.group()
        if kind == "name" and text.upper() in KEYWORDS:
            kind, text = "keyword", text.upper()
        if kind != "space":
            tokens.append(Token(kind, text, pos))
        pos = match.end()
    tokens.append(Token("end", "the end", len(expression)))
    return tokens
