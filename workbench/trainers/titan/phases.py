"""Where a TorchTitan rank's start goes: ``phase`` events from inside torchtitan's ``train.main()``.

A replacement rank's way from its start to its first step, each a ``phase``
event of rank 0 (``seconds``: since the rank started), in order:
``imports_done`` (:mod:`.rank`; ``warm``: true for a rank forked warm from its
job, false for a fresh interpreter), ``config_parsed``
(torchtitan's ``ConfigManager.parse_args``: tyro over the flags, and the config
function's module), ``distributed_ready`` (``init_distributed``: the group's
store rendezvous, gloo's process group, torchft's Manager and its connection
to the lighthouse), ``model_built`` (the model built, parallelised and
initialised: just before the optimizer is built from it), ``manager_ready``
(:mod:`.hooks`: the whole trainer built: optimizer, tokenizer, dataloader,
checkpointer), ``quorum_done`` (the attempt's first quorum returned, before
its first forward); then the ``heal`` event and the first committed step.
The recovery analysis reads them per fault (``analysis/phases.py``).

Installed by wrapping methods of torchtitan's and torchft's classes before
torchtitan's ``main`` runs, as :mod:`.hooks` does; torch and torchtitan are
imported inside (see :mod:`.hooks`).
"""

from __future__ import annotations

import time
from typing import Callable


def install(emit: Callable[..., None], t_start: float) -> None:
    """Wrap the methods after which each phase is reached; ``emit("phase", ...)`` once per phase."""
    from torchft.manager import Manager
    from torchtitan.config.manager import ConfigManager
    from torchtitan.experiments.torchft.trainer import FaultTolerantTrainer

    reached: set[str] = set()

    def phase(name: str) -> None:
        if name not in reached:
            reached.add(name)
            emit("phase", phase=name, seconds=time.time() - t_start)

    def after(cls: type, method: str, name: str, then: Callable = lambda result: None) -> None:
        original = getattr(cls, method)

        def wrapper(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            phase(name)
            then(result)
            return result

        setattr(cls, method, wrapper)

    def before(cls: type, method: str, name: str) -> None:
        original = getattr(cls, method)

        def wrapper(self, *args, **kwargs):
            phase(name)
            return original(self, *args, **kwargs)

        setattr(cls, method, wrapper)

    def hook_config(config) -> None:
        # the optimizer is built from the model parts once they are built, parallelised and initialised
        before(type(config.optimizer), "build", "model_built")

    after(ConfigManager, "parse_args", "config_parsed", hook_config)
    after(FaultTolerantTrainer, "init_distributed", "distributed_ready")
    after(Manager, "wait_quorum", "quorum_done")
