"""workers.fatal_log: what the store's log says last about why a process died."""

from __future__ import annotations

from engine.files.naming import LOG_FILE
from workers.fatal_log import last_error

LOG = """\
2026-11-27 06:24:28,322 INFO    supervisor[10] workers.child_handle: dispatcher started (pid 11)
2026-11-27 06:24:29,431 ERROR   dispatcher[11] workers.child: dispatcher failed to boot: OSError: x
Traceback (most recent call last):
OSError: x
2026-11-27 06:24:29,500 ERROR   index_builder-0[12] workers.child: index_builder[0] crashed: y
2026-11-27 06:24:29,512 WARNING supervisor[10] workers.supervisor: dispatcher (pid 11) exited
"""


def test_last_error_of_a_process_and_of_the_store(tmp_path):
    (tmp_path / LOG_FILE).write_text(LOG)
    assert last_error(tmp_path, 11) == "dispatcher[11]: dispatcher failed to boot: OSError: x"
    assert last_error(tmp_path) == "index_builder-0[12]: index_builder[0] crashed: y"
    assert last_error(tmp_path, 99) is None


def test_a_later_fatal_signal_report_is_the_stores_last_error(tmp_path):
    (tmp_path / LOG_FILE).write_text(LOG + "Fatal Python error: Bus error\n\nThread 0x1 (most recent "
                                     "call first):\n  File \"x.py\", line 1 in f\n")
    assert last_error(tmp_path) == "Fatal Python error: Bus error"
    assert last_error(tmp_path, 11) == "dispatcher[11]: dispatcher failed to boot: OSError: x"


def test_no_log_no_error(tmp_path):
    assert last_error(tmp_path) is None
