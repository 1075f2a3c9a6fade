"""Shared test constants: where the project's shared/ folder (RocketMQ sample files) lives."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DIR = Path(os.environ.get("MQSTORE_SHARED_DIR", REPO_ROOT.parent / "shared")).resolve()
ROCKETMQ_SAMPLES = SHARED_DIR / "data" / "rocketmq-samples"
