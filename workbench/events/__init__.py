"""The event log, the only channel from jobs to the notebook: one append-only JSONL file per writer process
(``writer``), read incrementally (``reader``), with a typed schema (``layout``: who writes which file; ``kinds``
and ``fields``: what an event holds; ``states``: the sets of values) that ``schema`` renders as docs/events.md.
The bottom layer of the package: it imports nothing of the workbench above it (only the process identity,
``workbench.cluster.procs``, when a ``start`` event is written)."""
