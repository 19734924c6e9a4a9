"""Widgets: presentation over plain-Python state (``state.py``) that tests reach without a browser."""

from workbench.widgets.dashboard import Dashboard, active_dashboards
from workbench.widgets.state import DashboardState

__all__ = ["Dashboard", "DashboardState", "active_dashboards"]
