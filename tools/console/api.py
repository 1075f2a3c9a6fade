"""The console's JSON endpoints: one function per path, each returning a JSON-ready dict.

    /api/overview   status sample and chart history (tools.console.sampler)
    /api/topics     per topic and queue (tools.inventory.topic_table)
    /api/groups     per group (tools.inventory.group_table)
    /api/lag        per group and queue, ?group= to narrow (tools.inventory.lag_table)
    /api/events     recent events from mqstore.log (tools.console.events)
    /api/lookup     ?by=key&topic=&key= | ?by=msg_id&msg_id= | ?by=offset&topic=&queue_id=&queue_offset=

Bad parameters raise BadInputError, which the server answers with 400 and the reason.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs

from engine.errors import BadInputError
from tools import inventory
from tools.console import events, lookup
from tools.console.sampler import StatusSampler


class NotFound(Exception):
    """No endpoint at this path."""


def _param(params: dict[str, list[str]], name: str) -> str:
    values = params.get(name)
    if not values or not values[0].strip():
        raise BadInputError(name, "is required")
    return values[0].strip()


def _int_param(params: dict[str, list[str]], name: str) -> int:
    text = _param(params, name)
    try:
        return int(text)
    except ValueError:
        raise BadInputError(name, f"{text!r} is not an integer") from None


def _rows(rows) -> list[dict]:
    return [row.as_dict() for row in rows]


class Api:
    """Answers the console's JSON endpoints for one store."""

    def __init__(self, store_dir: Path, sampler: StatusSampler):
        self.store_dir = store_dir
        self.sampler = sampler
        self._routes: dict[str, Callable[[dict[str, list[str]]], dict]] = {
            "/api/overview": self.overview, "/api/topics": self.topics, "/api/groups": self.groups,
            "/api/lag": self.lag, "/api/events": self.events, "/api/lookup": self.lookup,
        }

    def answer(self, path: str, query: str) -> dict:
        route = self._routes.get(path)
        if route is None:
            raise NotFound(path)
        return route(parse_qs(query))

    def overview(self, params: dict[str, list[str]]) -> dict:
        return self.sampler.snapshot()

    def topics(self, params: dict[str, list[str]]) -> dict:
        return {"topics": _rows(inventory.topic_table(self.store_dir))}

    def groups(self, params: dict[str, list[str]]) -> dict:
        return {"groups": _rows(inventory.group_table(self.store_dir))}

    def lag(self, params: dict[str, list[str]]) -> dict:
        group = params.get("group", [""])[0].strip() or None
        return {"lag": _rows(inventory.lag_table(self.store_dir, group=group))}

    def events(self, params: dict[str, list[str]]) -> dict:
        return {"source": str(self.store_dir / events.LOG_FILE),
                "events": [e.as_dict() for e in events.recent_events(self.store_dir)]}

    def lookup(self, params: dict[str, list[str]]) -> dict:
        by = _param(params, "by")
        if by == "key":
            return lookup.by_key(self.store_dir, _param(params, "topic"), _param(params, "key"))
        if by == "msg_id":
            return lookup.by_msg_id(self.store_dir, _param(params, "msg_id"))
        if by == "offset":
            return lookup.by_queue_offset(self.store_dir, _param(params, "topic"),
                                          _int_param(params, "queue_id"),
                                          _int_param(params, "queue_offset"))
        raise BadInputError("by", f"{by!r} is not one of key, msg_id, offset")
