"""Fault kinds: the table, targeting, injection, armed faults, host faults and their undo."""
