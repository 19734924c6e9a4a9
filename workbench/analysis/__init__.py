"""From events to answers: metrics, what each fault cost, goodput, and figures.

All functions take the list of event dicts (as read from the run directory)
and are pure, so the notebook, the CLI, the dashboard and the tests compute
the same figures. One concept per module:

- ``metrics``: the step metrics frame, the furthest committed step;
  ``step_columns`` reads the same frame columnar from the events files
  (``step_parse``), starting from the controller's ``step_index``;
- ``recovery``: the recovery timeline, one row per fault (milestones, stall,
  heal, steps lost), which every other view reads instead of re-deriving it;
- ``useful``: which steps were useful work (a semi-synchronous algorithm's inner
  steps once their sync committed), read by recovery, summary, goodput and the
  classroom views alike;
- ``summary``: a run's headline figures, derived from the timeline;
- ``evictions``: the quorums the lighthouse formed without a live, unfaulted group;
- ``goodput``: useful work against the run's own fault-free rate;
- ``goodput_vocabulary``: its badput causes as ``ml-goodput-measurement``'s ``BadputType``;
- ``figures``: plotly figures of the timeline and of goodput;
- ``compare``: several runs side by side (a table of their figures), drawn by ``compare_figures``.

Where a run stands now (its state, each group's process) is the run-state
fold's (``workbench.state.fold``), not an analysis.

``summary`` and ``goodput`` take an optional precomputed ``timeline`` so a
caller that shows both computes it once.
"""

from __future__ import annotations

from workbench.analysis.evictions import live_evictions
from workbench.analysis.figures import goodput_figure, timeline_figure
from workbench.analysis.goodput import BADPUT_PARTS, goodput
from workbench.analysis.goodput_vocabulary import BADPUT_TYPES, badput_by_type, badput_vocabularies
from workbench.analysis.metrics import STEP_COLUMNS, max_committed_step, metrics_frame
from workbench.analysis.recovery import MILESTONES, ends_process, recovery_timeline
from workbench.analysis.step_columns import StepColumns
from workbench.analysis.summary import counts, summary, survivor_steps
from workbench.analysis.useful import UsefulSteps, decided

__all__ = [
    "BADPUT_PARTS",
    "BADPUT_TYPES",
    "MILESTONES",
    "STEP_COLUMNS",
    "StepColumns",
    "UsefulSteps",
    "badput_by_type",
    "badput_vocabularies",
    "counts",
    "decided",
    "ends_process",
    "goodput",
    "goodput_figure",
    "live_evictions",
    "max_committed_step",
    "metrics_frame",
    "recovery_timeline",
    "summary",
    "survivor_steps",
    "timeline_figure",
]
