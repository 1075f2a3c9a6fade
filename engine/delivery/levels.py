"""The delay level table: RocketMQ's `messageDelayLevel` text parsed to one delay per level.

Level N (1-based) waits `levels_ms[N - 1]` after the message is stored; a delayed message lives
in SCHEDULE_TOPIC_XXXX queue N - 1 until then (engine.topics.system). The text is RocketMQ's
("1s 5s 10s 30s 1m ... 2h") with `ms` added, so tests can wait milliseconds instead of seconds.
"""

from __future__ import annotations

import re

from engine.errors import BadInputError

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
MAX_DELAY_LEVELS = 64  # RocketMQ's table is 18 long; a queue per level, so keep it small

_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_TOKEN = re.compile(r"([0-9]+)(ms|s|m|h|d)")


def parse_delay_levels(text: object) -> tuple[int, ...]:
    """Each level's delay in ms from text such as "100ms 1s 5m"; BadInputError naming the token."""
    if not isinstance(text, str):
        raise BadInputError("message_delay_level", f"must be a str, not {type(text).__name__}")
    tokens = text.split()
    if not tokens:
        raise BadInputError("message_delay_level", "names no level (RocketMQ's default is "
                            f"{DEFAULT_DELAY_LEVELS!r})")
    if len(tokens) > MAX_DELAY_LEVELS:
        raise BadInputError("message_delay_level", f"{len(tokens)} levels; at most {MAX_DELAY_LEVELS}")
    delays = []
    for token in tokens:
        match = _TOKEN.fullmatch(token)
        if match is None or int(match.group(1)) == 0:
            raise BadInputError("message_delay_level", f"{token!r} is not a positive delay such as "
                                "'100ms', '5s', '2m', '1h' or '1d'")
        delays.append(int(match.group(1)) * _UNIT_MS[match.group(2)])
    return tuple(delays)


DEFAULT_DELAY_LEVELS_MS = parse_delay_levels(DEFAULT_DELAY_LEVELS)


def validate_delay_level(level: object, level_count: int) -> int:
    """A delay level as an int in 1..level_count; BadInputError (MESSAGE_ILLEGAL) naming it."""
    if isinstance(level, str) and level.strip().isdigit():
        level = int(level)  # the DELAY property carries it as text
    if not isinstance(level, int) or isinstance(level, bool):
        raise BadInputError("delay_level", f"must be an int, not {type(level).__name__}")
    if not 1 <= level <= level_count:
        raise BadInputError("delay_level", f"level {level} is outside 1..{level_count} "
                            "(the store's message_delay_level table)")
    return level
