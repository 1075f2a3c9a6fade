"""The hash index: RocketMQ index files in shards, put, queried, synced, trimmed and checked for health."""
