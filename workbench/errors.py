"""The errors the public API raises, importable without the rest of the package.

Each message is one line that names the field and what is allowed; nothing was
submitted, injected or written when one is raised.
"""


class SpecError(ValueError):
    """A spec that must not be run. The message names the field(s) and what is allowed."""


class FaultError(ValueError):
    """A fault that was not injected; nothing was done. The message names the field."""


class ControllerGone(RuntimeError):
    """The run's controller died without ending the run (OOM, SIGKILL, a reboot)."""
