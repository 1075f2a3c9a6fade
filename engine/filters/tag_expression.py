"""A tag subscription, RocketMQ's expression syntax: `*` (every message), `A`, `A || B || C`.

RocketMQ (FilterAPI.buildSubscriptionData) splits on `||`, trims each part and drops empty
ones; the tags form a set, so `B || A` is the same subscription as `A || B`. The consume
queue's tagsCode (Java hashCode of the TAGS property) picks candidates without reading the
record; the record's own TAGS confirms, since hashes collide ("Aa" and "BB" are both 2112).

Where mqstore differs: an expression with no tag in it ("", " || ") is refused rather than
read as `*`, `*` beside tags ("A || *") is refused rather than taken as the literal tag "*",
and " * " (spaces around `*`) is every message here, while RocketMQ, which compares the
untrimmed text with `*`, reads it as the literal tag "*".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.errors import BadInputError
from engine.formats.java_hash import tags_code

SUB_ALL = "*"
TAG_SEPARATOR = "||"


@dataclass(frozen=True, slots=True)
class TagExpression:
    """A parsed tag expression: `tags` is empty for `*` (every message, tagged or not)."""

    tags: frozenset[str]

    @property
    def matches_all(self) -> bool:
        return not self.tags

    @property
    def codes(self) -> np.ndarray:
        """The tagsCode of each tag (int64, as the consume queue stores them)."""
        return np.array(sorted(tags_code(tag) for tag in self.tags), dtype=np.int64)

    def candidates(self, entry_codes: np.ndarray) -> np.ndarray:
        """A mask of the consume-queue entries whose tagsCode may be one of the tags."""
        if self.matches_all:
            return np.ones(len(entry_codes), dtype=bool)
        return np.isin(entry_codes.astype(np.int64), self.codes)

    def matches(self, tags: str | None) -> bool:
        """Whether a record with this TAGS value is subscribed (exact string, as the client
        re-check does): an untagged record never reaches a tag subscriber."""
        return self.matches_all or tags in self.tags

    def __str__(self) -> str:
        """The canonical form: `*`, or the tags sorted and joined by ` || `."""
        return SUB_ALL if self.matches_all else f" {TAG_SEPARATOR} ".join(sorted(self.tags))


MATCH_ALL_TAGS = TagExpression(frozenset())


def parse_tag_expression(text: str) -> TagExpression:
    """The TagExpression of `text`; BadInputError naming the expression when it holds no tag."""
    if not isinstance(text, str):
        raise BadInputError("tags", f"must be a str, not {type(text).__name__}")
    if text.strip() == SUB_ALL:
        return MATCH_ALL_TAGS
    tags = frozenset(part.strip() for part in text.split(TAG_SEPARATOR)) - {""}
    if not tags:
        raise BadInputError("tags", f"{text!r} names no tag (use '*' for every message)")
    if SUB_ALL in tags:
        raise BadInputError("tags", f"{text!r}: '*' means every message and cannot be combined with tags")
    for tag in tags:
        if "\x01" in tag or "\x02" in tag:
            raise BadInputError("tags", f"{text!r}: a tag must not contain the bytes 0x01 or 0x02")
    return TagExpression(tags)
