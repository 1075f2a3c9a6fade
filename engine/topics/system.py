"""The topics the store owns, and the properties only the store sets.

SCHEDULE_TOPIC_XXXX holds delayed messages, one queue per delay level (level N in queue N - 1),
until the delivery service (engine.delivery.scheduled) puts each into its real topic; the timer
topic is RocketMQ 5's; `%RETRY%` and `%DLQ%` topics are written by redelivery. A producer
reaches SCHEDULE_TOPIC_XXXX only by a delayed send (engine.message writes the record) and none
of the others, and sets none of the properties that route a message through them: a record
claiming to be store-made would be delivered, or skipped, on the producer's word.
"""

from __future__ import annotations

from engine.errors import BadInputError

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TIMER_TOPIC = "rmq_sys_wheel_timer"  # RocketMQ 5's TimerMessageStore topic
RETRY_TOPIC_PREFIX = "%RETRY%"
DLQ_TOPIC_PREFIX = "%DLQ%"

# Delivery properties (RocketMQ's MessageConst names, and the store's own DELIVERED_FROM).
PROP_DELAY = "DELAY"
PROP_REAL_TOPIC = "REAL_TOPIC"
PROP_REAL_QID = "REAL_QID"
# The commit position of the scheduled record a delivered copy came from: after a crash the
# delivery service skips what it finds already delivered, so a delivery happens exactly once.
PROP_DELIVERED_FROM = "DELIVERED_FROM"
PROP_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"  # a timer message's delivery time, ms since the epoch
TIMER_PROPERTIES = frozenset({PROP_TIMER_DELIVER_MS, "TIMER_DELAY_SEC", "TIMER_DELAY_MS",
                              "TIMER_OUT_MS", "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS",
                              "TIMER_ROLL_TIMES", "__STARTDELIVERTIME"})
# The timer topic's queues: a wheel of one-minute slots (engine.delivery.timer), one turn longer
# than the longest delay allowed plus a slot, so a slot holds one turn's messages at a time.
TIMER_SLOT_MS = 60_000
TIMER_MAX_DELAY_LIMIT_S = 7 * 24 * 3600  # the largest timer_max_delay_s
TIMER_SLOTS = TIMER_MAX_DELAY_LIMIT_S * 1000 // TIMER_SLOT_MS + 2

STORE_SET_PROPERTIES = frozenset({PROP_REAL_TOPIC, PROP_REAL_QID, PROP_DELIVERED_FROM}) | TIMER_PROPERTIES


def is_system_topic(topic: str) -> bool:
    """Whether the store owns the topic (no producer writes it)."""
    return topic in (SCHEDULE_TOPIC, TIMER_TOPIC) or topic.startswith((RETRY_TOPIC_PREFIX, DLQ_TOPIC_PREFIX))


def refuse_system_topic(topic: str) -> None:
    """BadInputError (MESSAGE_ILLEGAL) for a producer's message to a store-owned topic."""
    if is_system_topic(topic):
        how = {SCHEDULE_TOPIC: "send to the real topic with delay_level=N"}.get(
            topic, "the store writes it itself")
        raise BadInputError("topic", f"{topic!r} is a system topic: {how}")


def queue_count_of(topic: str, queue_count: int, delay_level_count: int) -> int:
    """How many queues a topic has: one per delay level for SCHEDULE_TOPIC_XXXX, TIMER_SLOTS for
    the timer topic, else the store's queue_count (the put path's bound on a queue id)."""
    if topic == SCHEDULE_TOPIC:
        return delay_level_count
    return TIMER_SLOTS if topic == TIMER_TOPIC else queue_count


def system_topic_counts(delay_level_count: int) -> dict[str, int]:
    """The store's own topics and their queue counts: the store's, never topics.json's (the
    topic table holds them beside the configured ones, and never writes them to the file)."""
    return {SCHEDULE_TOPIC: delay_level_count, TIMER_TOPIC: TIMER_SLOTS}


def is_written_by_delayed_sends(topic: str) -> bool:
    """The system topics a producer's delayed or timed send writes (engine.message makes the
    record); the supervisor's check lets these through and refuses the others."""
    return topic in (SCHEDULE_TOPIC, TIMER_TOPIC)

