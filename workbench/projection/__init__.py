"""What-if at cluster scale: project a measured run to thousands of accelerators.

- ``model``: the job, its failure process, the three strategies' costs, the
  Monte-Carlo projection, Young/Daly checkpoint periods;
- ``sources``: the published inputs and anchors, each cited;
- ``calibrate``: a projection's inputs from a run directory's own events;
- ``figures``: goodput against scale for the three strategies, crossings marked.
"""

from workbench.projection.model import (
    STRATEGIES,
    CheckpointRestart,
    DiLoCo,
    Elastic,
    Failures,
    Job,
    Projection,
    daly_period,
    first_order_restart,
    input_names,
    young_period,
)

__all__ = [
    "STRATEGIES",
    "CheckpointRestart",
    "DiLoCo",
    "Elastic",
    "Failures",
    "Job",
    "Projection",
    "daly_period",
    "first_order_restart",
    "input_names",
    "young_period",
]
