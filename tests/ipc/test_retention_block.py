"""The control block's retention area (layout version 2): the supervisor's line, the clean
request of `mqstore clean`, each child's clean position; another process sees what one wrote."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from engine.retention.expiry import RetentionReason
from ipc.control_block import (
    LAYOUT_VERSION,
    PUT_LATENCY_GROUP_OFFSET,
    PUT_STATUS_GROUP_OFFSET,
    TOTAL_SIZE,
    Role,
)
from ipc.retention_block import SHARD_CLEAN_OFFSET, ChildClean, RetentionBlock, RetentionLine
from tests.ipc.control_blocks import control_block


@pytest.fixture
def ctl(tmp_path):
    with control_block(tmp_path, 3) as block:
        yield block


def test_the_retention_area_fits_the_layout_before_the_put_status_and_latency_groups():
    assert LAYOUT_VERSION == 4
    assert SHARD_CLEAN_OFFSET + 64 * 64 == PUT_STATUS_GROUP_OFFSET == PUT_LATENCY_GROUP_OFFSET - 64
    assert PUT_LATENCY_GROUP_OFFSET == TOTAL_SIZE - 3 * 64


def test_a_new_block_has_the_line_at_zero_and_no_request(ctl):
    block = RetentionBlock(ctl)
    assert block.line() == RetentionLine(0)
    assert block.manual_requested() == 0
    assert set(block.cleans()) == {"consumequeue", "index/0", "index/1", "index/2"}


def test_the_line_never_moves_down(ctl):
    block = RetentionBlock(ctl)
    block.publish_line(RetentionLine(4096, passes=1, segments_removed=1, bytes_removed=4096,
                                     last_reason=RetentionReason.TIME_UP))
    with pytest.raises(ValueError, match="may only grow"):
        block.publish_line(RetentionLine(0))
    assert block.line().min_commit_pos == 4096


def test_a_child_group_outside_the_shards_is_refused(ctl):
    with pytest.raises(ValueError, match="no clean group"):
        RetentionBlock(ctl).publish_clean(Role.INDEX_BUILDER, 3, ChildClean(0, 0))


def test_another_process_reads_the_line_and_asks_for_a_pass(ctl, tmp_path):
    block = RetentionBlock(ctl)
    block.publish_line(RetentionLine(8192, passes=2, segments_removed=2, bytes_removed=8192,
                                     last_pass_ms=123, manual_done=0,
                                     last_reason=RetentionReason.MANUAL))
    block.publish_clean(Role.INDEX_BUILDER, 2, ChildClean(8192, 5))
    code = textwrap.dedent("""
        import sys
        from ipc.control_block import ControlBlock, Role
        from ipc.retention_block import RetentionBlock
        with ControlBlock.attach(sys.argv[1]) as ctl:
            block = RetentionBlock(ctl)
            line = block.line()
            clean = block.child_clean(Role.INDEX_BUILDER, 2)
            print(line.min_commit_pos, line.last_reason.value, clean.files_removed, block.request_manual())
    """)
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["8192", "manual", "5", "1"]
    assert block.manual_requested() == 1
