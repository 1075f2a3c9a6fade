"""config/delayOffset.json: the delivery service's progress, in RocketMQ's layout.

    {"offsetTable": {"1": 12, "3": 40}, "rescanFromPos": 1048576,
     "timerMinuteMs": 1796170000000, "timerOffsetTable": {"2871": 5}}

`offsetTable` is RocketMQ's ScheduleMessageService table: per delay level (1-based), the next
SCHEDULE_TOPIC_XXXX queue offset to deliver (queue level - 1). RocketMQ's fastjson writes the
keys as bare integers (`{1:12}`), which is not JSON; both are read, quoted keys are written.
The rest is mqstore's (fastjson ignores unknown keys): `rescanFromPos`, the commit position from
which a restart looks for copies delivered after the file was written (exactly-once delivery);
`timerMinuteMs` and `timerOffsetTable`, the timer wheel's minute being delivered and, per slot
(timer queue), its next queue offset (engine.delivery.timer).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from engine.errors import DelayOffsetError

_BARE_KEY = re.compile(r"([{,]\s*)(-?\d+)(\s*:)")


@dataclass(frozen=True)
class DelayOffsets:
    """Next queue offset per delay level, where a restart rescans the log from, and the timer
    wheel's minute and next offset per slot."""

    offsets: dict[int, int] = field(default_factory=dict)
    rescan_from_pos: int = 0
    timer_minute_ms: int | None = None  # None: no timer message was delivered yet
    timer_offsets: dict[int, int] = field(default_factory=dict)


def encode_delay_offsets(progress: DelayOffsets) -> bytes:
    document: dict = {"offsetTable": {str(k): v for k, v in sorted(progress.offsets.items())},
                      "rescanFromPos": progress.rescan_from_pos}
    if progress.timer_minute_ms is not None:
        document["timerMinuteMs"] = progress.timer_minute_ms
        document["timerOffsetTable"] = {str(k): v for k, v in sorted(progress.timer_offsets.items())}
    return (json.dumps(document, indent=2) + "\n").encode("utf-8")


def decode_delay_offsets(raw: bytes, *, path: str | None = None) -> DelayOffsets:
    """Parse the file (bare integer keys allowed); DelayOffsetError naming what is wrong."""
    try:
        data = json.loads(_BARE_KEY.sub(r'\1"\2"\3', raw.decode("utf-8")))
    except (UnicodeDecodeError, ValueError) as exc:
        raise DelayOffsetError(f"delayOffset.json is not JSON: {exc}", path=path) from None
    if not isinstance(data, dict):
        raise DelayOffsetError("delayOffset.json is not a JSON object", path=path)
    rescan, minute = data.get("rescanFromPos", 0), data.get("timerMinuteMs")
    if not _is_count(rescan) or not (minute is None or _is_count(minute)):
        raise DelayOffsetError(f"delayOffset.json: rescanFromPos {rescan!r} or timerMinuteMs {minute!r} "
                               "is not a position or a time", path=path)
    offsets = _offset_table(data.get("offsetTable", {}), "offsetTable", 1, path)
    timer = _offset_table(data.get("timerOffsetTable", {}), "timerOffsetTable", 0, path)
    return DelayOffsets(offsets, rescan, minute, timer)


def _offset_table(table: object, name: str, lowest_key: int, path: str | None) -> dict[int, int]:
    """{key: queue offset} of one table; DelayOffsetError naming the bad pair."""
    if not isinstance(table, dict):
        raise DelayOffsetError(f"delayOffset.json: {name} is not {{key: offset}}", path=path)
    out = {}
    for key, offset in table.items():
        if not (key.isdigit() and int(key) >= lowest_key and _is_count(offset)):
            raise DelayOffsetError(f"delayOffset.json: {name} {key!r} -> {offset!r} is not a level or "
                                   "slot and a queue offset", path=path)
        out[int(key)] = offset
    return out


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
