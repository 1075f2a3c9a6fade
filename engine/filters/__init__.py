"""What a consumer subscribed to: tag expressions and SQL92 property filters, one rule for every read."""
