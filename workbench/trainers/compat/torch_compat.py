"""torch's private names the trainers reach, one function each (torch >=2.13,<2.15; 2.13.0 here).

Each docstring names the private and why torch's public API does not serve.
torch is imported inside the function that needs it (see the package
docstring). ``tests/test_upstream_compat.py`` checks every name here on the
installed torch.
"""

from __future__ import annotations

from datetime import timedelta


def set_pg_timeout(timeout: timedelta, group=None) -> None:
    """Set the timeout of ``group`` (None: the default group) (``distributed_c10d._set_pg_timeout``).

    torchtitan's ``set_pg_timeouts`` calls ``torch.distributed.set_timeout``,
    which torch 2.13.0 does not have; c10d's private setter is what it would
    call (``titan/cpu_patches.py``, ``barrier_device_ids_and_set_timeout``).
    """
    from torch.distributed.distributed_c10d import _set_pg_timeout

    _set_pg_timeout(timeout, group)


def non_persistent_buffers(module) -> set[str]:
    """The names of ``module``'s own buffers that its state dict leaves out (``Module._non_persistent_buffers_set``).

    ``named_buffers`` lists persistent and non-persistent buffers alike, and
    the public way to tell them apart, ``state_dict()``, runs the module's
    state-dict hooks: torchtitan's fused-QKV hook all-gathers across the group,
    which the rank-local heal state must not (``titan/rank_state.py``).
    """
    return module._non_persistent_buffers_set
