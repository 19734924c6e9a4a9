"""What the dashboard's tiles and feed say while a run goes on, without a browser: events written by a
real EventWriter into a real run directory, read back by the dashboard's own reader.

- the "latest events" feed keeps what happens once (a kill, a heal, an end) among the periodic samples
  (``node_health`` every 2 s, heartbeats, steps, commits), which belong in the tiles and health panels;
- a tile's memory is a real measurement (the trainer's accelerator memory, else the controller's
  per-group resident memory, ``node_health``'s ``groups``) or absent, never a placeholder;
- a tile says why its group's last attempt ended (``EndCause.summary()``) while the group is dead or
  on its way back, until it takes part in a committed step again.
"""

from __future__ import annotations

import re
import subprocess
import sys

import psutil
import pytest

from workbench.controller import nodehealth
from workbench.events.writer import EventWriter
from workbench.run import rundir
from workbench.spec.load import load_spec
from workbench.widgets import Dashboard


@pytest.fixture
def run_dir(tmp_path):
    spec = load_spec("demo", {"replicas": 2, "steps": 1000, "faults": [], "run_root": str(tmp_path)})
    return rundir.create(tmp_path, "20250101-000000-feed-abcdef", spec.to_dict())


class Run:
    """The writers of a run: the controller, a control file, one per replica attempt."""

    def __init__(self, run_dir):
        self.run_dir = run_dir
        self.controller = EventWriter(run_dir, "controller", run="feed")
        self.control = EventWriter(run_dir, "control-1", run="feed")
        self._w = {}

    def replica(self, r: int, attempt: int = 0) -> EventWriter:
        if (r, attempt) not in self._w:
            self._w[(r, attempt)] = EventWriter(
                self.run_dir, f"replica-{r}.attempt-{attempt}", run="feed", replica=r, attempt=attempt
            )
        return self._w[(r, attempt)]

    def start(self, r: int, attempt: int = 0) -> None:
        self.controller.emit("submit", replica=r, attempt=attempt, job_id=f"j{r}.{attempt}")
        self.replica(r, attempt).emit("start", role="replica", trainer="torchft-lite", node="n1", pid=1000 + r)

    def step(self, r: int, s: int, attempt: int = 0, participating: bool = True, **fields) -> None:
        self.replica(r, attempt).emit(
            "step", step=s, loss=1.0 / s, committed=participating, participating=participating, **fields
        )


@pytest.fixture
def run(run_dir):
    return Run(run_dir)


def dashboard(run_dir) -> Dashboard:
    d = Dashboard(run_dir, start=False)
    d.stop()
    return d


def tile(d: Dashboard, r: int) -> str:
    found = re.search(rf"<div class='wb-tile' data-replica='{r}'.*?</div>", d.tiles.value)
    assert found, d.tiles.value
    return found.group(0)


def text(tile_html: str) -> str:
    return re.sub(r"<[^>]+>", "", tile_html)


def feed_lines(d: Dashboard) -> list[str]:
    return re.search(r"<pre class='wb-tail'>(.*)</pre>", d.tail_panel.value, re.S).group(1).splitlines()


# -- the feed ----------------------------------------------------------------------------------------


def test_a_kill_a_heal_and_the_end_stay_in_the_feed_among_a_minute_of_health_samples(run, run_dir):
    for r in (0, 1):
        run.start(r)
        run.step(r, 1)
    d = Dashboard(run_dir, start=False)
    try:
        run.control.emit("fault", action="kill", target=1, attempt=0, origin="button")
        d.update()
        run.start(1, attempt=1)
        run.replica(1, 1).emit("heal", step=1, seconds=0.05, bytes=1_600_000, from_address="pg://127.0.0.1/replica_0")
        d.update()
        # then a minute of what a running run writes all the time: a sample per node every 2 s, heartbeats,
        # steps and commits, polled as the dashboard polls
        for i in range(30):
            run.controller.emit("node_health", node="n1", cpu_percent=90.0, rss_bytes=300_000_000, mem_share=0.1)
            for r, a in ((0, 0), (1, 1)):
                run.replica(r, a).emit("heartbeat", step=2 + i)
                run.step(r, 2 + i, attempt=a)
                run.replica(r, a).emit("commit", step=1 + i, commit_result=True)
            d.update()
        # a semi-synchronous run's syncs: each group's committed sync is periodic (marked on the plot); a
        # sync that did not commit is news
        run.replica(0).emit("sync", step=5, sync_index=5, committed=True, algorithm="diloco")
        run.replica(0).emit("sync", step=5, sync_index=6, committed=False, algorithm="diloco")
        run.controller.emit("run_end", state="stopped", reason="stop requested")
        d.update()
    finally:
        d.stop()
    lines = feed_lines(d)
    kinds = [line.split()[1] for line in lines]
    assert {"fault", "heal", "run_end"} <= set(kinds), lines
    assert "action=kill target=1 origin=button" in lines[kinds.index("fault")]
    assert kinds.count("sync") == 1 and kinds[:2] == ["run_end", "sync"], lines  # newest first
    assert not {"node_health", "heartbeat", "step", "commit"} & set(kinds), lines


# -- memory on the tile ------------------------------------------------------------------------------


def test_a_cpu_group_tile_shows_its_processes_resident_memory_from_the_controllers_sampler(run, run_dir):
    """A real process holding 200 MB, sampled by the controller's own Sampler as replica 0's; the sample
    goes through the event file; replica 1, which no sample names, shows no memory at all."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; b = bytearray(200_000_000); b[::4096] = b'x' * len(b[::4096]); "
            "print('ready', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        (row,) = nodehealth.Sampler().sample([("n1", [child.pid], {child.pid: (0, 0)})])
        held = psutil.Process(child.pid).memory_info().rss
    finally:
        child.kill()
        child.wait()
    assert row["groups"] == [{"replica": 0, "attempt": 0, "rss_bytes": row["rss_bytes"]}]
    assert 200_000_000 <= row["groups"][0]["rss_bytes"] <= held + 10_000_000
    for r in (0, 1):
        run.start(r)
        run.step(r, 1)  # a CPU trainer's step: no mem_gb
    run.controller.emit("node_health", **row)
    d = dashboard(run_dir)
    shown = re.search(r"rss (\d+\.\d) MB", tile(d, 0))
    assert shown and 200.0 <= float(shown.group(1)) <= (held + 10_000_000) / 1e6, tile(d, 0)
    assert "mem" not in text(tile(d, 1)) and "–" not in text(tile(d, 1)).split("tok/s")[1], tile(d, 1)


def test_a_tile_shows_accelerator_memory_when_the_trainer_reports_it_and_no_stale_rss_once_dead(run, run_dir):
    run.start(0)
    run.step(0, 1, mem_gb=2.5)
    run.start(1)
    run.step(1, 1)
    groups = [
        {"replica": 0, "attempt": 0, "rss_bytes": 900_000_000},
        {"replica": 1, "attempt": 0, "rss_bytes": 400_000_000},
    ]
    run.controller.emit(
        "node_health", node="n1", cpu_percent=1.0, rss_bytes=1_300_000_000, mem_share=0.1, groups=groups
    )
    d = dashboard(run_dir)
    assert "accel mem 2.50 GB" in tile(d, 0) and "rss" not in tile(d, 0)
    assert "rss 400.0 MB" in tile(d, 1)
    run.control.emit("fault", action="kill", target=1, attempt=0, origin="api")
    d = dashboard(run_dir)
    assert "data-state='dead'" in tile(d, 1) and "rss" not in tile(d, 1), tile(d, 1)


# -- why the last attempt ended ----------------------------------------------------------------------


def test_a_killed_group_says_who_killed_it_until_it_takes_part_again(run, run_dir):
    for r in (0, 1):
        run.start(r)
        for s in range(1, 42):
            run.step(r, s)
    run.control.emit("fault", action="kill", target=1, attempt=0, origin="button")
    said = "attempt 0 ended: kill from the dashboard at step 41"

    def cause(d):
        found = re.search(r"<span class='wb-cause'[^>]*>(.*?)</span>", tile(d, 1))
        return found and found.group(1)

    d = dashboard(run_dir)
    assert "data-state='dead'" in tile(d, 1) and cause(d) == said and "data-injected='true'" in tile(d, 1)
    assert cause(d) == said and "wb-cause" not in tile(d, 0)
    run.controller.emit("job", replica=1, attempt=0, job_id="j1.0", state="ended", clean=False, signal="SIGKILL")
    run.start(1, attempt=1)
    d = dashboard(run_dir)
    assert "data-state='starting'" in tile(d, 1) and cause(d) == said  # the job's SIGKILL is that kill
    run.step(1, 41, attempt=1, participating=False)
    d = dashboard(run_dir)
    assert "data-state='healing'" in tile(d, 1) and cause(d) == said
    run.step(1, 42, attempt=1)
    d = dashboard(run_dir)
    assert "data-state='participating'" in tile(d, 1) and "wb-cause" not in tile(d, 1), tile(d, 1)


def test_a_crash_shows_its_exception_and_a_completed_group_shows_no_cause(run, run_dir):
    run.start(0)
    run.start(1)
    run.step(0, 7)
    run.step(1, 7)
    exc = {
        "type": "RuntimeError",
        "message": "CUDA error: an illegal memory access",
        "frames": [{"file": "/src/workbench/trainers/lite/trainer.py", "line": 123, "function": "step"}],
    }
    run.replica(0).emit("exit", reason="error", step=7, error="RuntimeError: CUDA error", exception=exc)
    run.replica(1).emit("exit", reason="completed", step=7)
    d = dashboard(run_dir)
    assert "data-state='dead'" in tile(d, 0) and "data-injected='false'" in tile(d, 0)
    assert "attempt 0 ended: RuntimeError: CUDA error: an illegal memory access at step 7" in tile(d, 0), tile(d, 0)
    assert "trainers/lite/trainer.py:123 in step" in tile(d, 0)
    assert "data-state='finished'" in tile(d, 1) and "wb-cause" not in tile(d, 1)
