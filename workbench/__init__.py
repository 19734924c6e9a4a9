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

from .run import Run, attach, submit
from .spec import Spec, SpecError
from .spec_load import load_spec
from .faults import FaultError
from .sweep import Sweep, attach_sweep, sweep
from .replay import replay
from .fault_matrix import Matrix, attach_matrix, matrix


def dashboard(run, **kwargs):
    """The live dashboard of a run (a ``Run`` or its directory): ``wb.dashboard(run)``.

    Here rather than a ``Run`` method so that the core never imports its presentation.
    """
    from .widgets import Dashboard

    return Dashboard(run, **kwargs)


def comparison(source, **kwargs):
    """A live comparison of a sweep, or of a list of runs: ``wb.comparison(sweep)``."""
    from .widgets.comparison import ComparisonWidget

    return ComparisonWidget(source, **kwargs)


__all__ = ["dashboard", "comparison", "Run", "Spec", "SpecError", "FaultError", "attach", "load_spec", "submit", "Sweep", "sweep", "attach_sweep", "replay",
           "Matrix", "matrix", "attach_matrix"]
__version__ = "0.1.0"
