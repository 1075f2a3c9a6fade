"""Topics as configuration: config/topics.json, per-topic queues and permissions, tombstones."""
