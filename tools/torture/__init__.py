"""Torture and fault injection for mqstore: kill rounds against a ledger, power loss, flips.

    mqstore torture --store DIR --rounds N --target supervisor|dispatcher|index|producer|random
    python -m tools.torture soak

Modules: `ledger` (the fsynced record of acknowledged messages), `load` (the producer process
that writes it), `processes` (the store and producer processes), `rounds` (kill rounds),
`verify` (a stopped store against the ledger), `faults` (power loss and byte flips),
`filesystems` (small and failing filesystems for the disk tests), `figures`, `cli`.
See docs/RELIABILITY.md.
"""
