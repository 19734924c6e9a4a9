"""torchtitan's private names the trainers reach, one function each (torchtitan 0.3.0).

Each docstring names the private and why torchtitan's public API does not
serve. torchtitan is imported inside the functions that need it: a rank
imports this module before its CPU patches, which must precede torchtitan
(see the package docstring). ``tests/test_upstream_compat.py`` checks every
name here on the installed torchtitan.
"""

from __future__ import annotations

from typing import Callable


def set_block_mask_builder(create_block_mask: Callable) -> None:
    """torchtitan's attention masks are built by ``create_block_mask`` (``attention._compiled_create_block_mask``).

    ``models/common/attention.py``'s ``create_attention_mask`` calls that module
    global, ``torch.compile(create_block_mask)``, with no option to build
    eagerly; on CPU its compile cost ~40 s of the first step for a mask only
    read for its ``mask_mod`` (``titan/cpu_patches.py``,
    ``flex_attention_no_backward_on_cpu``).
    """
    from torchtitan.models.common import attention

    attention._compiled_create_block_mask = create_block_mask


def checkpoint_path(checkpointer, step: int) -> str:
    """Where ``checkpointer`` writes the checkpoint of ``step`` (``CheckpointManager._create_checkpoint_id``).

    The ``checkpoint`` event reports the path and its size; torchtitan builds
    it from its folder without a public call.
    """
    return checkpointer._create_checkpoint_id(step)


def save_off_interval(checkpointer, step: int) -> None:
    """Save the checkpoint of ``step`` now, whatever the checkpoint interval.

    ``CheckpointManager.save`` writes only when ``_should_save`` agrees (the
    interval, the first step, the last step); ``save(step, last_step=True)``
    writes a different checkpoint (the last step's, model only if so
    configured). So ``_should_save`` says yes on the instance, this once
    (``titan/hooks.py``, a planned stop off the interval).
    """
    checkpointer._should_save = lambda curr_step, last_step=False: True
    try:
        checkpointer.save(step)
    finally:
        del checkpointer._should_save
