"""The test suite, importable as a package: shared helpers are `tests.helpers`,
`tests.workers.store_harness` and `tests.faults.fault_harness` (no sys.path edits)."""
