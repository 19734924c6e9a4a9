"""workbench: fault-tolerance experiments on training jobs, from a notebook.

import workbench as wb
run = wb.submit("demo", ["steps=400"])     # spec → controller → jobs → events
run.metrics()                               # pandas, one row per replica per step
run.kill(replica=1)                         # SIGKILL; the group is relaunched and heals
wb.dashboard(run)                           # the live view (loss, groups, faults) in a notebook
run.wait(); run.summary()
wb.attach(run.run_dir)                      # from any other kernel
wb.matrix("demo", faults="kill,hang", trials=10)  # fault kinds × trainers, N runs each: rates, phases
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from workbench.errors import ControllerGone, FaultError, SpecError

# PEP 562: ``import workbench`` loads this file and ``errors`` only; each public name imports its
# module on first use, so a job, the undo helper or the controller loads only what it touches.
_LAZY: dict[str, str] = {
    "Run": "workbench.run.handle",
    "attach": "workbench.run.handle",
    "submit": "workbench.run.handle",
    "Spec": "workbench.spec.models",
    "load_spec": "workbench.spec.load",
    "Sweep": "workbench.experiments.sweep",
    "attach_sweep": "workbench.experiments.sweep",
    "sweep": "workbench.experiments.sweep",
    "replay": "workbench.run.replay",
    "Matrix": "workbench.experiments.matrix",
    "attach_matrix": "workbench.experiments.matrix",
    "matrix": "workbench.experiments.matrix",
}

if TYPE_CHECKING:
    from workbench.experiments.matrix import Matrix, attach_matrix, matrix
    from workbench.experiments.sweep import Sweep, attach_sweep, sweep
    from workbench.run.handle import Run, attach, submit
    from workbench.run.replay import replay
    from workbench.spec.load import load_spec
    from workbench.spec.models import Spec


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def dashboard(run: Any, **kwargs: Any) -> Any:
    """The live dashboard of a run (a ``Run`` or its directory): ``wb.dashboard(run)``.

    Here rather than a ``Run`` method so that the core never imports its presentation.
    """
    from workbench.widgets import Dashboard

    return Dashboard(run, **kwargs)


def comparison(source: Any, **kwargs: Any) -> Any:
    """A live comparison of a sweep, or of a list of runs: ``wb.comparison(sweep)``."""
    from workbench.widgets.comparison import ComparisonWidget

    return ComparisonWidget(source, **kwargs)


__all__ = [
    "dashboard",
    "comparison",
    "Run",
    "Spec",
    "SpecError",
    "FaultError",
    "ControllerGone",
    "attach",
    "load_spec",
    "submit",
    "Sweep",
    "sweep",
    "attach_sweep",
    "replay",
    "Matrix",
    "matrix",
    "attach_matrix",
]
__version__ = "0.1.0"
