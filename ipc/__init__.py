"""Shared-memory IPC between the supervisor, its children and co-located clients (facade)."""

from ipc.control_block import (
    ControlBlock,
    FlushCode,
    Positions,
    ProcessSlot,
    ProcState,
    Role,
    StoreState,
    flush_code_for,
    pid_alive,
    process_slot_index,
    remove_stale,
)
from ipc.mailbox import (
    RESULT_DTYPE,
    Mailbox,
    MailboxServer,
    PendingRequest,
    ProducerSlot,
    RequestFlag,
    SlotState,
    split_records,
)
from ipc.seqlock import fence, order_fence, read_consistent, write_locked
from ipc.shm import SharedRegion, region_name, store_prefix, unlink_stale, unlink_stale_regions
from ipc.slot_claim import claim_slot, is_slot_owner_alive, release_slot
from ipc.wakeup import ConsumerWaiter, WaiterEntry, WaiterTable, Wakeup, unlink_all

__all__ = [
    "RESULT_DTYPE",
    "ConsumerWaiter",
    "ControlBlock",
    "FlushCode",
    "Mailbox",
    "MailboxServer",
    "PendingRequest",
    "Positions",
    "ProcState",
    "ProcessSlot",
    "ProducerSlot",
    "RequestFlag",
    "Role",
    "SharedRegion",
    "SlotState",
    "StoreState",
    "WaiterEntry",
    "WaiterTable",
    "Wakeup",
    "claim_slot",
    "fence",
    "flush_code_for",
    "is_slot_owner_alive",
    "order_fence",
    "pid_alive",
    "process_slot_index",
    "read_consistent",
    "region_name",
    "release_slot",
    "remove_stale",
    "split_records",
    "store_prefix",
    "unlink_all",
    "unlink_stale",
    "unlink_stale_regions",
    "write_locked",
]
