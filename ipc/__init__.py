"""Shared-memory IPC between the supervisor, its children and co-located clients (DESIGN §1, §4).

Every name lives in its defining module: import from there (`from ipc.control_block import ...`).
"""
