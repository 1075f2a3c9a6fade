"""Which queues of a topic one member of a consumer group reads: RocketMQ's
`AllocateMessageQueueAveragely` ported as it is, so every member computes the same answer
from the same sorted members and sorted queues, and nothing has to coordinate them.

    q queues, n members, member i:  avg = q // n (+1 for the first q % n members; 1 if q <= n)
    start = i * avg (+ q % n for the members past the remainder); take min(avg, q - start)

q=8, n=3 gives [0-2], [3-5], [6-7]; q=2, n=3 gives [0], [1], [] (RocketMQ §6.3).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.errors import BadInputError


def allocate_averagely(member: str, members: Sequence[str], queue_ids: Sequence[int]) -> list[int]:
    """The queue ids `member` reads among `members` (both sorted here, as RocketMQ sorts its
    client ids and queues); BadInputError when `member` is not one of them."""
    ordered_members = sorted(members)
    ordered_queues = sorted(queue_ids)
    if member not in ordered_members:
        raise BadInputError("member", f"{member!r} is not among the group's members")
    index = ordered_members.index(member)
    queue_count, member_count = len(ordered_queues), len(ordered_members)
    remainder = queue_count % member_count
    if queue_count <= member_count:
        average = 1
    elif remainder > 0 and index < remainder:
        average = queue_count // member_count + 1
    else:
        average = queue_count // member_count
    start = index * average if remainder > 0 and index < remainder else index * average + remainder
    take = min(average, queue_count - start)
    return ordered_queues[start:start + max(take, 0)]
