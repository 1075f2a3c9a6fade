"""The log level every mqstore process uses, handed from `--log-level` to child processes.

The CLI puts the level in the environment (MQSTORE_LOG_LEVEL), which the supervisor's children
inherit, so `mqstore start --log-level DEBUG` reaches the dispatcher and index builders without
a flag of their own.
"""

from __future__ import annotations

import logging
import os

LOG_LEVEL_ENV = "MQSTORE_LOG_LEVEL"
LOG_LEVEL_NAMES = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def parse_log_level(name: str) -> int:
    """The logging level named `name` (case-insensitive); ValueError for any other word."""
    upper = name.strip().upper()
    if upper not in LOG_LEVEL_NAMES:
        raise ValueError(f"{name!r} is not one of {', '.join(LOG_LEVEL_NAMES)}")
    return getattr(logging, upper)


def env_log_level(default: int) -> int:
    """The level the environment asks for, else `default` (a bad value counts as unset: a child
    must not fail to start over its log level)."""
    try:
        return parse_log_level(os.environ[LOG_LEVEL_ENV])
    except (KeyError, ValueError):
        return default
