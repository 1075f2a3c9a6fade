"""The commitlog: its segments' records, walked, scanned, read and ended."""
