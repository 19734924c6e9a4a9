"""A child forked warm (``workbench.trainers.forked``), as TorchTitan's job forks its ranks.

The child waits for its environment, holds a stop signal sent meanwhile until
it releases it, writes its stderr to the job's per-rank file through a
``ProcessGroup`` (whose traceback read-back names its exception), and an
abandoned child is gone. Each child is a fork of the test process running a
function of this module: about 0.3 s in all.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from workbench.trainers import forked
from workbench.trainers.kit import StopRequest, release_stop_signals
from workbench.trainers.process_group import ProcessGroup


def report_env_and_stop(delay_s: float) -> None:
    stop = StopRequest()
    time.sleep(delay_s)  # the stop signal was sent before the release: held, not yet seen
    seen_before = stop.reason
    release_stop_signals()
    print(f"env={os.environ.get('WB_TEST_VALUE')} before={seen_before} after={stop.reason}", file=sys.stderr)


def fail() -> None:
    raise ValueError("the child's own failure")


def interrupted() -> None:
    raise KeyboardInterrupt


def exit_with_a_message() -> None:
    sys.exit("the child's own message")


def test_child_gets_its_env_holds_a_stop_until_released_and_its_stderr_goes_to_the_rank_file(tmp_path):
    group = ProcessGroup()
    try:
        child = forked.fork_waiting(report_env_and_stop, 0.2)
        os.kill(child.pid, signal.SIGTERM)  # before its environment: it must neither die nor lose it
        group.adopt(0, child.release({"WB_TEST_VALUE": "forty"}), stderr_path=tmp_path / "rank-0.stderr")
        assert group.wait() is None
        assert [(e["rank"], e.get("exit_code")) for e in group.ended] == [(0, 0)]
        assert (tmp_path / "rank-0.stderr").read_text().strip() == "env=forty before=None after=preempted"
    finally:
        group.close()


def test_a_failed_child_traceback_is_read_back_and_an_abandoned_child_is_gone(tmp_path):
    group = ProcessGroup()
    abandoned = forked.fork_waiting(fail)
    try:
        group.adopt(0, forked.fork_waiting(fail).release({}), stderr_path=tmp_path / "rank-0.stderr")
        assert group.wait() == 0  # rank 0 failed
        assert [(e["rank"], e.get("exit_code")) for e in group.ended] == [(0, 1)]
        fields = group.exit_fields()
        assert fields["exception"]["type"] == "ValueError", fields
        abandoned.abandon()
        assert not os.path.exists(f"/proc/{abandoned.pid}")
    finally:
        group.close()


def test_a_child_ends_as_a_fresh_interpreter_would_a_keyboard_interrupt_with_130(tmp_path):
    """The end the fork server's jobs have (``run_child``): a ``KeyboardInterrupt`` (a cancel's SIGINT) is 130
    with its traceback, a ``SystemExit`` with a message prints it and is 1."""
    for target, code, stderr in [(interrupted, 130, "KeyboardInterrupt"), (exit_with_a_message, 1, "message")]:
        group = ProcessGroup()
        try:
            group.adopt(0, forked.fork_waiting(target).release({}), stderr_path=tmp_path / "rank-0.stderr")
            assert group.wait() == 0
            assert [e.get("exit_code") for e in group.ended] == [code]
            assert (tmp_path / "rank-0.stderr").read_text().splitlines()[-1].endswith(stderr)
        finally:
            group.close()
