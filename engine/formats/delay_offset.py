"""config/delayOffset.json: the delivery service's progress, in RocketMQ's layout.

    {"offsetTable": {"1": 12, "3": 40}, "rescanFromPos": 1048576}

`offsetTable` is RocketMQ's ScheduleMessageService table: per delay level (1-based), the next
SCHEDULE_TOPIC_XXXX queue offset to deliver (queue level - 1). RocketMQ's fastjson writes the
keys as bare integers (`{1:12}`), which is not JSON; both are read, quoted keys are written.
`rescanFromPos` is mqstore's (fastjson ignores unknown keys): the commit position from which a
restart looks for copies delivered after the table was written (exactly-once delivery).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from engine.errors import DelayOffsetError

_BARE_KEY = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")


@dataclass(frozen=True)
class DelayOffsets:
    """Next queue offset per delay level, and where a restart rescans the log from."""

    offsets: dict[int, int] = field(default_factory=dict)
    rescan_from_pos: int = 0


def encode_delay_offsets(progress: DelayOffsets) -> bytes:
    table = {str(level): offset for level, offset in sorted(progress.offsets.items())}
    return (json.dumps({"offsetTable": table, "rescanFromPos": progress.rescan_from_pos}, indent=2)
            + "\n").encode("utf-8")


def decode_delay_offsets(raw: bytes, *, path: str | None = None) -> DelayOffsets:
    """Parse the file (bare integer keys allowed); DelayOffsetError naming what is wrong."""
    try:
        data = json.loads(_BARE_KEY.sub(r'\1"\2"\3', raw.decode("utf-8")))
    except (UnicodeDecodeError, ValueError) as exc:
        raise DelayOffsetError(f"delayOffset.json is not JSON: {exc}", path=path) from None
    table = data.get("offsetTable", {}) if isinstance(data, dict) else None
    rescan = data.get("rescanFromPos", 0) if isinstance(data, dict) else None
    if not isinstance(table, dict) or not _is_count(rescan):
        raise DelayOffsetError("delayOffset.json is not {\"offsetTable\": {level: offset}}", path=path)
    offsets = {}
    for level, offset in table.items():
        if not (level.isdigit() and int(level) >= 1 and _is_count(offset)):
            raise DelayOffsetError(f"delayOffset.json: level {level!r} -> {offset!r} is not a level "
                                       "and a queue offset", path=path)
        offsets[int(level)] = offset
    return DelayOffsets(offsets, rescan)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
