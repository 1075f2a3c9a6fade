"""The read-only web console of a store (`mqstore console`): server, API and static page."""
