"""mqstore's storage engine: the on-disk formats and everything about a store's files, in one process."""
