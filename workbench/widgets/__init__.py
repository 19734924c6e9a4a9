"""Widgets: presentation over plain-Python state (``state.py``) that tests reach without a browser."""

from .dashboard import Dashboard, active_dashboards
from .state import DashboardState

__all__ = ["Dashboard", "DashboardState", "active_dashboards"]
