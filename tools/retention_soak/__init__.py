"""The retention soak: a supervised store with a retention of minutes under
load, with one consumer in front and one behind, for `make soak` and its short test.

`python -m tools.retention_soak run --duration-s 600 --json soak-retention.json` (see
tools.retention_soak.driver for what it checks and the figures it prints).
"""
