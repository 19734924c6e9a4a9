"""Plugin subcommands: commands the CLI names but does not import.

``workbench cluster up|down|status`` drives :mod:`workbench.devcluster`, a
local Slurm cluster for demos and tests. That is development tooling, and the
import contract in ``pyproject.toml`` ("devcluster is development tooling: no
production module imports it", checked by ``lint-imports``) keeps every
production module, this CLI included, from importing it. So the CLI reaches
it the way submitit reaches its executors: through a table of
``"module:function"`` strings, resolved with :func:`importlib.import_module`
only when the command runs. The function gets the rest of the command line
(``argparse.REMAINDER``) and returns the exit status, as ``python -m
workbench.devcluster`` does.
"""

from __future__ import annotations

import importlib
from typing import Callable

# name: ("module:function", help)
PLUGINS = {
    "cluster": ("workbench.devcluster:main", "local Slurm cluster: up | down | status"),
    "stacks": ("workbench.apps.cli.stacks:main", "where RUN's groups are stuck: every process's stack (py-spy)"),
    "timeouts": ("workbench.apps.cli.timeouts:main", "timeouts recommended from a measured RUN, checked against it"),
}


def load(target: str) -> Callable[[list[str]], int]:
    """The function ``"module:function"`` names (its module imported now, not before)."""
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)


def cmd_plugin(args) -> int:
    """Run the plugin of the command given, on the rest of the command line."""
    return load(PLUGINS[args.command][0])(args.rest)
