"""The closed forms of checkpoint-restart: Young's and Daly's checkpoint periods, first-order goodput.

Daly's period is the model's default checkpoint period (``CheckpointRestart.period_s=None``);
the first-order goodput is what the Monte-Carlo model (``model``) is checked
against where first-order theory holds (``M ≫ τ, D``).
"""

from __future__ import annotations

import math


def young_period(write_s: float, mtbf_s: float) -> float:
    """Young (1974): τ = √(2 C M)."""
    return math.sqrt(2 * write_s * mtbf_s)


def daly_period(write_s: float, mtbf_s: float) -> float:
    """Daly (2006), the higher-order optimum: √(2CM)(1 + ⅓√(C/2M) + C/18M) − C for C < 2M, else M."""
    c, m = write_s, mtbf_s
    if c <= 0:
        return m
    if c >= 2 * m:
        return m
    return math.sqrt(2 * c * m) * (1 + math.sqrt(c / (2 * m)) / 3 + c / (18 * m)) - c


def first_order_restart(write_s: float, period_s: float, down_s: float, mtbf_s: float) -> float:
    """Goodput of checkpoint-restart to first order: 1 − C/(τ+C) − (τ/2 + D)/M (valid for M ≫ τ, D)."""
    return 1 - write_s / (period_s + write_s) - (period_s / 2 + down_s) / mtbf_s
