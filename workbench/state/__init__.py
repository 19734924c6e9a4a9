"""The one fold of the event log: run state, replica and node views, the checkpoint ledger."""
