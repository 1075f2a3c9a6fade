"""Recovery: the checkpoint, the durable line, crash recovery, salvage and accepted damage."""
