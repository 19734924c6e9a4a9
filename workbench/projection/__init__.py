"""What-if at cluster scale: project a measured run to thousands of accelerators.

- ``model``: the Monte-Carlo projection of a job's goodput per strategy;
- ``inputs``: the job, its failure process, the three strategies' costs;
- ``replicate``: one replicate of each strategy over one draw of failures;
- ``closed_form``: Young/Daly checkpoint periods, first-order goodput;
- ``sources``: the published inputs and anchors, each cited;
- ``calibrate``: a projection's inputs from a run directory's own events;
- ``figures``: goodput against scale for the three strategies, crossings marked.
"""

from workbench.projection.closed_form import daly_period, first_order_restart, young_period
from workbench.projection.inputs import CheckpointRestart, DiLoCo, Elastic, Failures, Job, input_names
from workbench.projection.model import STRATEGIES, Projection

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
