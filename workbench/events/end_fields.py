"""What the log says of an attempt's end: the fields of ``exit``, ``job``, ``stacks`` and ``state_lost``.

An attempt's end is told by three writers, and readers join them (``workbench.state.causes``):

- the trainer, in its own ``exit``, when it lived to write one: its reason, the exception it caught
  (``exception``: type, message, the innermost frames, from ``workbench.events.tracebacks``), and for a
  group of several processes how each ended and which failed first;
- the controller, in ``job``, once the scheduler's job is gone: what the backend knows and the trainer
  cannot say (the exit code or the signal, the kernel's OOM killer, Slurm's final state and node), the
  step the attempt reached, an exception read back from the job's stderr when no ``exit`` carried one,
  and the last lines the job wrote (the files stay in ``<run_dir>/jobs/``, named by ``log``);
- whoever injected a fault, in ``fault``: an injected end keeps that attribution, and the other two never
  replace it.
"""

from __future__ import annotations

import signal

from workbench.events import states
from workbench.events.fields import optional, required


def signal_name(number: int) -> str:
    """A ``signal`` field's value: ``SIGSEGV`` for 11; ``SIG<n>`` for a number Python has no name for (a
    real-time signal)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


EXCEPTION = optional(
    "exception",
    "an exception that ended it: `type`, `message` and `frames` (the last few, innermost last: `file`, `line`, "
    "`function`) (`workbench/events/tracebacks.py`); of a group's process read back from its stderr, also its "
    "`rank`",
)
PROCESSES = optional(
    "processes",
    "a group of several processes (TorchTitan's ranks, MaxText's processes): how each ended, in the order "
    "they ended: `rank`, `exit_code` or `signal`, `t`",
)
FIRST_FAILED = optional("first_failed", "of those processes, the rank of the first that ended unclean")

EXIT = (
    required("reason", "why", states.ExitReason),
    required("step", "its last step (`null`: it never stepped)"),
    optional("weights", "checksum of the final weights"),
    optional("error", "what failed, in one line (`Type: message`)"),
    EXCEPTION,
    PROCESSES,
    FIRST_FAILED,
    optional("saved_step", "MaxText: its last saved step"),
    optional("returncode", "MaxText: its training process's"),
    optional("loop_seconds", "torchft-lite: the training loop's length"),
    optional("iterations", "torchft-lite: iterations of the loop"),
    optional("titan_step", "TorchTitan's own step counter"),
)

JOB = (
    required("replica", "the group"),
    required("attempt", "its attempt"),
    required("job_id", "the scheduler's job id"),
    required("state", "what it saw", states.JobState),
    required("clean", "whether the job's own `exit` said completed"),
    required("reason", "the `exit`'s reason, or `died` without one"),
    optional("exit_code", "the job's process exited with this status (0-255)"),
    optional("signal", "the signal that ended the job's process, by name (`SIGSEGV`, `SIGKILL`)"),
    optional(
        "oom",
        "the kernel's OOM killer ended it, and how that is known: `kernel_log` (its `Killed process` line for this "
        "PID), `memory_cgroup` (the cgroup's `oom_kill` count rose), `slurm` (`OUT_OF_MEMORY`)",
    ),
    optional("slurm_state", "Slurm: the job's final state from `sacct` (`NODE_FAIL`, `TIMEOUT`, `CANCELLED by 0`)"),
    optional("slurm_exit_code", "Slurm: `sacct`'s `ExitCode`, `code:signal`"),
    optional("node", "where the job ran"),
    optional("step", "the last step the attempt reached"),
    EXCEPTION,
    optional("exception_source", "`exit` (the trainer caught it) or `stderr` (read back from the job's stderr)"),
    FIRST_FAILED,
    optional("last_lines", "the last lines the job wrote to stdout and stderr (at most 20)"),
    optional("log", "the job's stdout and stderr files, relative to the run directory"),
)

STACKS = (
    required("target", "the group sampled, or `controller`"),
    required("origin", "who asked: the hang detector (`watchdog`), `cli`, `api`, `button`", states.FaultOrigin),
    required("path", "the file with every process's stack, relative to the run directory (`stacks/…`)"),
    optional("attempt", "the group's attempt"),
    optional(
        "processes",
        "each process sampled: `pid`, `rank`, `where` (its innermost frame in the trainer's, torchft's or "
        "torchtitan's code; the controller's: in the workbench's), `innermost` (its innermost frame of all, native "
        "ones included), `thread` (whose frames those are), `error`",
    ),
    optional("error", "why a process could not be sampled"),
)

STATE_LOST = (
    required("step", "the newest committed step, whose model state no live process holds any more"),
    required(
        "action", "what the run does: `resume` from durable state (`resumed_from`), `restart` from scratch, or `fail`"
    ),
    optional(
        "resumed_from",
        "with `resume`: the step of the newest durable state the log recorded; the groups load the newest on disk,"
        " which their `phase restored` names and the fold and summary take",
    ),
    optional("source", "with `resume`: where it comes from (`checkpoint`, `snapshot`)"),
)
