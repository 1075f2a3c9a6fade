"""Shared-memory IPC between the supervisor, its children and co-located clients (DESIGN §1, §4).

Two sides (docs/ARCHITECTURE.md "Layers"; tests/test_layers.py holds them). The shared-memory
primitives, used by everyone: shm, seqlock, slot_claim, control_block, retention_block, mailbox,
wakeup, key_ring, run_info, and offsets_fallbacks (a file record the status reads). The client
side of co-located producers and consumers: producer, slot_sender, batch_result, reattach,
consumer, consumer_offsets, store_log, group_members. A primitive never imports the client
side, and neither does workers/. Import each name from the module that defines it.
"""
