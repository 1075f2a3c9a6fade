"""Retention: segments expired by their records' age and by disk use, and the retention line."""
