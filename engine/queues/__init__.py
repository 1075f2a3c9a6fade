"""Consume queues: each (topic, queue id)'s entries, the table of them, and recovery's cuts."""
