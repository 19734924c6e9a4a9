"""Pieces every torchft trainer shares: logs to events, collective failure, commit vote, DDP hook, group stop, quorum epochs."""
