"""The `mqstore` data source's options: names, defaults, parsing (one place for batch and stream).

Every option is optional and a string, as Spark hands them over; names are case-insensitive.
An option this module does not know is refused (a typo such as `topic` for `topics` would
otherwise read everything without a word). docs/SPARK.md lists every option with its default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import Enum

from engine.errors import BadInputError
from engine.filters.tag_expression import MATCH_ALL_TAGS, TagExpression, parse_tag_expression
from tools.spark.layout import StoreFormat, StoreLayout
from tools.spark.partitions import DEFAULT_PARTITION_BYTES, ScanFilter, SplitMode
from tools.spark.scan import RowFilter, ScanSpec, VerifyMode, View
from tools.spark.stores import StorePaths, parse_store_paths
from tools.typo_hints import closest


class DataLoss(Enum):
    """What a read does when commit positions it has to read are gone (`failOnDataLoss`)."""

    FAIL = "fail"
    SKIP = "skip"


class OutputView(Enum):
    """The rows a read returns: the scan's views, or KAFKA (messages shaped as Spark's Kafka
    source gives them, tools/spark/kafka_view.py)."""

    MESSAGES = "messages"
    DISPATCH = "dispatch"
    KAFKA = "kafka"

    @property
    def scan_view(self) -> View:
        return View.DISPATCH if self is OutputView.DISPATCH else View.MESSAGES


# Below this a partition's fixed cost (task launch, Python worker, planning walk) dominates
# its reading: 1 MiB of ~1 KiB records is ~12 ms of decoding.
MIN_PARTITION_BYTES = 1 << 20
OPTION_DEFAULTS = {
    "path": None, "paths": None, "topics": None, "startTime": None, "endTime": None, "startPos": "0",
    "endPos": None,
    "verify": "none", "format": "auto", "maxPartitionBytes": str(DEFAULT_PARTITION_BYTES),
    "splitMode": "sample", "topicPruning": "consumequeue", "timeSlackMs": "60000", "view": "messages",
    "startingOffsets": "earliest", "failOnDataLoss": "true", "maxRecordsPerTrigger": None,
    "maxBytesPerTrigger": None, "filterPushdown": "false", "tags": None,
}


@dataclass(frozen=True)
class SourceOptions:
    """The parsed options of one read (batch or stream); `stores` narrows `paths` to the
    stores a pushed-down `store` filter keeps."""

    paths: StorePaths
    scan_filter: ScanFilter
    verify_mode: VerifyMode = VerifyMode.NONE
    store_format: StoreFormat | None = None
    target_bytes: int = DEFAULT_PARTITION_BYTES
    split_mode: SplitMode = SplitMode.SAMPLE
    prune_topics: bool = True
    output: OutputView = OutputView.MESSAGES
    starting_offsets: str = "earliest"
    on_data_loss: DataLoss = DataLoss.FAIL
    max_records_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    filter_pushdown: bool = False
    stores: frozenset[str] | None = None

    def scan_spec(self, layout: StoreLayout, columns: frozenset[str] | None) -> ScanSpec:
        """How a store of `layout` is scanned, decoding only `columns` (None: all of the view's)."""
        f = self.scan_filter
        row_filter = RowFilter(f.topics, f.start_ms, f.end_ms, f.tags)
        return ScanSpec(self.verify_mode, layout.full_verify, row_filter, self.output.scan_view, columns)

    def pruning_filter(self) -> ScanFilter:
        """The filter the planner prunes with (topics only when topic pruning is on)."""
        return self.scan_filter if self.prune_topics else replace(self.scan_filter, topics=None)


def refuse_unknown(options: Mapping[str, str]) -> None:
    """BadInputError for the first option name the reader does not know (with a suggestion)."""
    refuse_options(options, OPTION_DEFAULTS, "mqstore option")


def refuse_options(options: Mapping[str, str], known: Mapping[str, str | None], what: str) -> None:
    """BadInputError for the first option name not in `known` (case-insensitive; with a suggestion)."""
    by_lower = {name.lower(): name for name in known}
    for key in options:
        if key.lower() not in by_lower:
            close = closest(key.lower(), by_lower)
            hint = f"; did you mean {by_lower[close]!r}?" if close else ""
            raise BadInputError(key, f"unknown {what}{hint} (known: {', '.join(known)})")


def option_value(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    """Case-insensitive lookup (Spark lower-cases option names on some paths)."""
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return value
    return default


def _choice(options: Mapping[str, str], name: str, default: str, allowed: tuple[str, ...]) -> str:
    value = (option_value(options, name, default) or default).strip().lower()
    if value not in allowed:
        raise BadInputError(name, f"{value!r} is not one of {', '.join(allowed)}")
    return value


def _int_option(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    text = option_value(options, name)
    if text is None or not text.strip():
        return default
    try:
        return int(text)
    except ValueError:
        raise BadInputError(name, f"{text!r} is not an integer") from None


def _positive(options: Mapping[str, str], name: str) -> int | None:
    value = _int_option(options, name, None)
    if value is not None and value < 1:
        raise BadInputError(name, f"{value} is not a positive number")
    return value


def parse_time_ms(name: str, text: str | None) -> int | None:
    """Epoch milliseconds from digits or an ISO-8601 time (a naive time is UTC)."""
    if text is None or not text.strip():
        return None
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadInputError(name, f"{text!r} is neither epoch ms nor an ISO-8601 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate the reader options (BadInputError names the bad option)."""
    refuse_unknown(options)
    paths = parse_store_paths(option_value(options, "path"), option_value(options, "paths"))
    topics_text = option_value(options, "topics")
    topics = frozenset(t.strip() for t in topics_text.split(",") if t.strip()) if topics_text else None
    scan_filter = ScanFilter(
        start_pos=_int_option(options, "startPos", 0) or 0, end_pos=_int_option(options, "endPos", None),
        start_ms=parse_time_ms("startTime", option_value(options, "startTime")),
        end_ms=parse_time_ms("endTime", option_value(options, "endTime")), topics=topics,
        time_slack_ms=_int_option(options, "timeSlackMs", 60_000) or 0, tags=_tags_option(options))
    store_format = _choice(options, "format", "auto", ("auto", "mqstore", "rocketmq"))
    target_bytes = _int_option(options, "maxPartitionBytes", DEFAULT_PARTITION_BYTES)
    if target_bytes is None or target_bytes < MIN_PARTITION_BYTES:
        raise BadInputError("maxPartitionBytes", f"{target_bytes} is below the floor of "
                            f"{MIN_PARTITION_BYTES} bytes (smaller partitions cost more than they read)")
    output = OutputView(_choice(options, "view", "messages", ("messages", "dispatch", "kafka")))
    if output is OutputView.DISPATCH and not scan_filter.tags.matches_all:
        raise BadInputError("tags", "the dispatch view has no TAGS to filter on (use view messages or kafka)")
    return SourceOptions(
        paths=paths, scan_filter=scan_filter,
        verify_mode=VerifyMode(_choice(options, "verify", "none", ("none", "fail", "report"))),
        store_format=None if store_format == "auto" else StoreFormat(store_format),
        target_bytes=target_bytes,
        split_mode=SplitMode(_choice(options, "splitMode", "sample", ("sample", "walk"))),
        prune_topics=_choice(options, "topicPruning", "consumequeue", ("consumequeue", "off")) != "off",
        output=output,
        starting_offsets=(option_value(options, "startingOffsets", "earliest") or "earliest").strip().lower(),
        on_data_loss=DataLoss.FAIL if _choice(options, "failOnDataLoss", "true", ("true", "false")) == "true"
        else DataLoss.SKIP,
        max_records_per_trigger=_positive(options, "maxRecordsPerTrigger"),
        max_bytes_per_trigger=_positive(options, "maxBytesPerTrigger"),
        filter_pushdown=_choice(options, "filterPushdown", "false", ("true", "false")) == "true")


def _tags_option(options: Mapping[str, str]) -> TagExpression:
    """`tags`: the consumers' tag expression ('A || B'; unset or '*': every message)."""
    text = option_value(options, "tags")
    return MATCH_ALL_TAGS if text is None else parse_tag_expression(text)
