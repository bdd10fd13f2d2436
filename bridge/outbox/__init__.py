"""The outbox: the durable SQLite spool every record is committed to first, and the delivery
workers that ship it to each sink at least once. Shared by the agent and the consumer (whose
Decision records travel the same way)."""
