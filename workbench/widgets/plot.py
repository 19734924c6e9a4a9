"""How the widgets show a plotly figure: a plain ``go.Figure`` in an ``ipywidgets.Output``.

The widget sets the Output's ``outputs`` trait to the figure's plotly mime
bundle (:func:`plot_bundle`) on every change. Measured here (plotly 7.1,
anywidget 0.11, JupyterLab 4.6), a ``FigureWidget`` updated from Python is
unreliable: messages that arrive while its 4 MB ES module loads are dropped
(plots came up empty and stayed empty, even with updates re-sent every 2 s),
and a view that attaches later (a reload with the kernel alive, Voila) is sent
the data the figure had when it was built. An Output's ``outputs`` is ordinary
synced widget state: every view, including one created after a reload, renders
the current figure. The cost is a full redraw per change, so what is drawn
must stay small and change rarely: the dashboard's wall-clock plots (redrawn
at most every ``plot_every`` s) and the sweep comparison. A plot that grows
every poll is a :class:`~workbench.widgets.liveplot.LivePlot` (the loss plot),
which receives only new points.
"""

from __future__ import annotations

import json

import plotly.graph_objects as go
import plotly.io as pio

PLOTLY_MIME = "application/vnd.plotly.v1+json"


def plot_bundle(fig: go.Figure, alt: str = "loss plot") -> tuple[dict, ...]:
    """The Output ``outputs`` that show ``fig`` (plotly's JupyterLab mime renderer draws it).

    ``alt`` is the text a frontend without plotly's extension shows instead.
    """
    spec = json.loads(pio.to_json(fig, validate=False))
    spec["config"] = {"displaylogo": False, "responsive": True}
    return (
        {
            "output_type": "display_data",
            "metadata": {},
            "data": {PLOTLY_MIME: spec, "text/plain": f"{alt} (needs plotly's JupyterLab extension)"},
        },
    )
