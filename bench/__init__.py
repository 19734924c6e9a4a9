"""Benchmarks of the workbench's claims: ``python -m bench [--quick]`` (``make bench``).

Each benchmark is a module: ``sessions`` runs the training variants interleaved
in one session (fault-free torchft-lite vs the ddp-restart baseline, kill
recovery, a kill every 60 s), ``recovery`` turns their event logs into the
recovery, throughput and startup figures, ``pipeline`` times the event log and
the dashboard without training, ``report`` writes ``docs/benchmarks.md`` and its
figures. Ratios between variants measured side by side are the claim; the
absolute times depend on the machine, which the report describes.
"""
