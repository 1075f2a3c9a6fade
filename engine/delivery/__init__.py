"""Delayed and timed delivery: messages that wait in the store's own topics until they are due."""
