"""ipc.queue_allocation equals RocketMQ's AllocateMessageQueueAveragely for the same members
and queues: the expected lists below are what its Java code returns (its arithmetic traced
by hand, and the examples of rocketmq-consumption.md §6.3)."""

from __future__ import annotations

import pytest

from engine.errors import BadInputError
from ipc.queue_allocation import allocate_averagely

CASES = [  # (queue count, member count, what each member gets, in member order)
    (8, 1, [[0, 1, 2, 3, 4, 5, 6, 7]]),
    (8, 2, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    (8, 3, [[0, 1, 2], [3, 4, 5], [6, 7]]),
    (8, 5, [[0, 1], [2, 3], [4, 5], [6], [7]]),
    (8, 8, [[0], [1], [2], [3], [4], [5], [6], [7]]),
    (8, 10, [[0], [1], [2], [3], [4], [5], [6], [7], [], []]),
    (2, 3, [[0], [1], []]),
    (7, 3, [[0, 1, 2], [3, 4], [5, 6]]),
    (16, 6, [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11], [12, 13], [14, 15]]),
    (1, 4, [[0], [], [], []]),
    (0, 2, [[], []]),
]


@pytest.mark.parametrize(("queue_count", "member_count", "expected"), CASES)
def test_allocation_equals_rocketmq_averagely(queue_count, member_count, expected):
    members = [f"m{i:02d}" for i in range(member_count)]
    got = [allocate_averagely(m, members, range(queue_count)) for m in members]
    assert got == expected
    assert sorted(q for share in got for q in share) == list(range(queue_count))  # each once


def test_every_member_computes_the_same_answer_from_any_listing_order():
    members = ["b", "c", "a"]
    shuffled_queues = [5, 0, 7, 2, 1, 6, 3, 4]
    assert allocate_averagely("a", members, shuffled_queues) == [0, 1, 2]
    assert allocate_averagely("c", list(reversed(members)), shuffled_queues) == [6, 7]


def test_a_member_not_listed_is_refused():
    with pytest.raises(BadInputError, match="not among"):
        allocate_averagely("z", ["a", "b"], range(8))
