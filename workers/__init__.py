"""The supervisor and its child processes (DESIGN §4).

    supervisor.py      start order, the serve/supervise loop, stop (`mqstore start`)
    appender.py        producer mailbox requests -> checked, stamped commitlog appends
    request_check.py   structural check of producer-encoded records
    group_commit.py    the flush thread: group commit (sync) or timed flushes (async)
    shared_state.py    the shared memory a supervisor creates, and a crashed one's cleanup
    child_handle.py    spawn / watch / stop one child process
    restart_policy.py  backoff with jitter inside a restart budget
    exit_codes.py      the child <-> supervisor exit-code contract, and the CLI's codes
    child.py           the child-process base: heartbeat, orphan check, signals
    dispatcher.py      the dispatcher process (consume queues)
    index_builder.py   an index-builder process (one shard)
    step_window.py     how much commitlog a child works through per step (MAX_STEP_BYTES)
    status_report.py   `mqstore status`
"""
