"""Dispatch: what the records of the log contribute to the consume queues and the index."""
