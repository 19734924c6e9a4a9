"""A collective across groups that fails: drop its process group at once; one timeout; the armed hold before one.

Dropping the failed process group (:func:`drop_on_error`)
---------------------------------------------------------
gloo's all-reduce on CPU is a ring. When a group dies inside one, only its
two ring neighbours see it at once (their sockets to it reset); every other
group waits for data its neighbour will not send until the process group's
timeout (``torchft.pg_timeout_ms``). torchft records the neighbour's error
(``Manager.report_error``) and votes the round down, but keeps the failed
process group until the next quorum's ``configure`` replaces it, and that
quorum waits for the groups still blocked. So one kill held all 16 groups of
the classroom run for the whole 8 s (docs/classroom.md, "A dead group holds
the sync for the whole pg_timeout_ms").

torch's ``ProcessGroupGloo.abort()`` changes nothing (measured: 6 ranks on
loopback, torch 2.13, the ranks away from the dead one still failed after
8.03 s); destroying the process group closes its sockets, so the next group
round the ring fails at once, drops its own, and so on: every rank failed
within 0.11 s. :func:`drop_on_error` makes ``report_error`` also drop the
process group (torchft's ``ProcessGroupGloo.abort``: ``_pg = None``, the last
reference). The round is voted down as before; the lighthouse gives the next
quorum a new id (a member reports commit failures), so each Manager builds a
new process group there, as it would have anyway.

Measured in the workbench (``tests/test_algorithms.py``, 4 DiLoCo groups,
``pg_timeout_ms`` 20 s, a ``kill_in_allreduce``): the group opposite the
victim left the round 0.10 s after the kill, against 19.98 s with the process
group kept. At 16 groups on two busy cores the failure goes round the ring a
hop at a time, about 0.6 s a hop, since each group must be scheduled and
destroy its process group (0.2-0.6 s) before its sockets close: the last of
15 failed 4.9 s after the kill (docs/classroom.md).

A process group cannot be destroyed on one of its own threads (its destructor
joins them): an error reported from gloo's thread (a future's callback) is
dropped from a new thread, if the failed group is still the current one.

One timeout per collective (:func:`pg_timeout_only`)
----------------------------------------------------
A collective that never completes is failed by its process group's own
timeout (``torchft.pg_timeout_ms``; gloo fails the work, torchft's Manager
reports the error). torchft's ``Manager.wrap_future`` also arms a second
timer, of the Manager's ``timeout`` (``torchft.timeout_s``), on every
collective's future: a call onto its TimeoutManager's event-loop thread to
arm it, and another from the future's callback to cancel it, so that thread
wakes twice a step and takes the GIL each time. When that timer is the
longer of the two it cannot fire first, and :func:`pg_timeout_only` skips
it; a shorter one is kept. Measured, 3 groups fault-free, 15 s windows, 5
interleaved pairs (load 0.8-2.7): CPU per group-step 0.22 ms lower (median;
-0.35, -0.22, -0.15, +1.39, -0.56 ms of about 10.8), and the thread's own
0.08-0.09 ms a step gone.

The armed hold (:func:`hold_when_armed`)
----------------------------------------
``kill_in_allreduce`` (``workbench.faults.armed``; the arm file and the
trainer's side, ``workbench.faults.arm_file``) must land while the peers wait
inside an all-reduce, a window of milliseconds for the models here. The
group's process, about to join an all-reduce across groups, finds the arm
file, says ``held`` and waits; its peers enter the all-reduce and wait for
it; the controller's SIGKILL comes while they do.
"""

from __future__ import annotations

import threading
from datetime import timedelta

from workbench.faults import arm_file
from workbench.trainers.compat import torchft_compat

TRIGGER = "allreduce"


def drop_on_error(manager) -> None:
    """After ``manager.report_error``, drop the Manager's process group (see the module docstring)."""
    report = manager.report_error
    wrapper = torchft_compat.manager_process_group(manager)

    def report_and_drop(e: Exception) -> None:
        report(e)
        failed = torchft_compat.wrapped_process_group(wrapper)
        if failed is None:
            return

        def drop() -> None:
            if torchft_compat.wrapped_process_group(wrapper) is failed:
                wrapper.abort()

        if isinstance(threading.current_thread(), threading._DummyThread):
            threading.Thread(target=drop, name="drop-failed-pg", daemon=True).start()
        else:
            drop()

    manager.report_error = report_and_drop


def pg_timeout_only(pg_timeout: timedelta) -> None:
    """In this process, torchft's Manager arms no timer of its own on a collective's future when the
    process group's ``pg_timeout`` fails the collective first (see the module docstring)."""

    def skip_when_longer(armed_timer):
        def future_timeout(fut, timeout: timedelta):
            return fut if timeout >= pg_timeout else armed_timer(fut, timeout)

        return future_timeout

    torchft_compat.replace_future_timeout(skip_when_longer)


def hold_when_armed(pg, run_dir, replica: int, writer, manager_step) -> None:
    """Before each all-reduce across groups: if ``kill_in_allreduce`` is armed for ``replica``, say
    ``held`` and wait (at most ``arm_file.HOLD_S``) for the controller's kill or a disarm."""
    allreduce = pg.allreduce
    path = arm_file.arm_path(run_dir, TRIGGER, replica)

    def held_allreduce(tensors, *args, **kwargs):
        if path.exists() and pg.size() > 1:
            writer.emit("held", trigger=TRIGGER, step=manager_step())
            waited = arm_file.hold_while_armed(run_dir, TRIGGER, replica)
            writer.emit("held", trigger=TRIGGER, step=manager_step(), released=True, seconds=waited)
        return allreduce(tensors, *args, **kwargs)

    pg.allreduce = held_allreduce
