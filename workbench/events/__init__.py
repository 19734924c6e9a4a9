"""The event log: one append-only JSONL file per writer process, read incrementally."""
