"""The offline check (`mqstore check`): each structure verified against the log, findings reported."""
