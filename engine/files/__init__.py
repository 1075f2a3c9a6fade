"""The store's files and directories: mapping, segments, durable file operations, names, owners."""
