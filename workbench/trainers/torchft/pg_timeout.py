"""The cross-group process group's timeout where the spec leaves ``torchft.pg_timeout_ms`` unset.

The timeout is how long a group waits in a collective for its slowest peer before it gives the step
up. A killed peer does not need it (its sockets reset, and ``drop_failed_pg`` passes the failure
round the ring), so it is sized for the peer that is slow but alive: a ``straggler`` (one group of
three throttled to 25 % of a CPU, its steps 0.6-1.0 s) committed 1-4 of ~21 steps per group while
the timeout followed the 300 ms heartbeat timeout, and the peers that stop without closing their
sockets (a hang, a freeze, a partition) stall the survivors this long. Never below the heartbeat
timeout: a collective should not give up on a peer the lighthouse still counts in the quorum.
Both torchft trainers take it (torchft-lite's process group, TorchTitan's
``fault_tolerance.process_group_timeout_ms``).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

DEFAULT_MS = 2000


def pg_timeout_ms(set_ms: Optional[int], heartbeat_timeout_ms: int) -> int:
    """The timeout in effect: ``torchft.pg_timeout_ms`` where set, else the default or the heartbeat timeout."""
    return int(set_ms) if set_ms else max(DEFAULT_MS, int(heartbeat_timeout_ms))


def in_effect_ms(spec: Mapping[str, Any]) -> int:
    """:func:`pg_timeout_ms` of a job's spec (the dict a trainer gets)."""
    return pg_timeout_ms(spec["torchft"].get("pg_timeout_ms"), spec["lighthouse"]["heartbeat_timeout_ms"])
