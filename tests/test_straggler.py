"""The straggler score (workbench.analysis.straggler): which replica group is slow, named on the tile,
in ``workbench status`` and in the exporter, before a slow group turns into a hang.

Pure tests on hand-written step sequences (window 20, 3 warm-up steps; the expected scores worked
out by hand), then the issue's criterion on a real torchft-lite run: a ``straggler`` fault on one of
three groups gives it the worst score within 10 of its steps, and a fault-free minute flags nothing.
"""

import json
import os

import pytest

from workbench.analysis import straggler
from workbench.state import steptimes
from workbench.state.fold import RunState

from .conftest import workbench_cli

W, WARM = steptimes.WINDOW, steptimes.WARMUP


def _steps(replica, n, step_time_s, comm_s=None, attempt=0, t0=1000.0, first_step=1, gap=0.2, **extra):
    """``n`` step events of one group, 0.2 s apart (20 steps span 3.8 s, over the window's 3 s: the window
    is the last 20 steps); ``step_time_s``/``comm_s``: a number or a list."""
    out = []
    for i in range(n):
        e = {"kind": "step", "replica": replica, "attempt": attempt, "t": t0 + gap * i, "step": first_step + i}
        dt = step_time_s[i] if isinstance(step_time_s, list) else step_time_s
        if dt is not None:
            e["step_time_s"] = dt
        c = comm_s[i] if isinstance(comm_s, list) else comm_s
        if c is not None:
            e["comm_s"] = c
        out.append({**e, **extra})
    return out


def _run(*groups):
    """Interleave the groups' events by time, as the reader would, and fold them."""
    state = RunState(len(groups))
    state.apply(sorted((e for g in groups for e in g), key=lambda e: e["t"]))
    return state


def test_in_lockstep_the_slow_group_is_the_one_that_did_not_wait():
    """Synchronous DDP: every group's step takes 50 ms, because groups 0 and 2 (10 ms of work) wait
    40 ms in the all-reduce for group 1 (40 ms of work, 10 ms in the all-reduce). Own times 10, 40, 10 ms:
    group 1's relative score is 10/40 = 0.25, flagged; the others 10/10 = 1."""
    n = WARM + W
    s = straggler.scores(_run(_steps(0, n, 0.050, 0.040), _steps(1, n, 0.050, 0.010), _steps(2, n, 0.050, 0.040)))
    assert s[1].relative == pytest.approx(0.25) and s[1].flagged
    assert s[0].relative == s[2].relative == 1.0 and not s[0].flagged and not s[2].flagged
    assert s[1].window_s == pytest.approx(0.040) and s[1].individual == 1.0  # it has never been faster
    assert straggler.straggler(s) == 1

    # The same steps without the all-reduce time: every group took 50 ms; nobody can be named.
    s = straggler.scores(_run(*(_steps(r, n, 0.050) for r in range(3))))
    assert {r: x.relative for r, x in s.items()} == {0: 1.0, 1: 1.0, 2: 1.0} and straggler.straggler(s) is None


def test_a_window_is_the_mean_of_its_steps_not_the_median():
    """A throttled group stalls on some steps and runs at full speed on the others: 12 steps of 10 ms
    and 8 of 70 ms take (0.120 + 0.560) / 20 = 0.034 s a step, 3.4 times a 10 ms group's time,
    though the median (10 ms) says it is as fast. Its relative score: 0.010 / 0.034 = 0.294."""
    assert W == 20
    slow = [0.010] * WARM + [0.010] * 12 + [0.070] * 8
    s = straggler.scores(_run(_steps(0, WARM + W, 0.010), _steps(1, len(slow), slow)))
    assert s[1].window_s == pytest.approx(0.034) and s[1].relative == pytest.approx(0.010 / 0.034)
    assert s[1].flagged and straggler.straggler(s) == 1


def test_a_window_of_short_steps_spans_3_s_so_a_one_second_hiccup_is_not_a_straggler():
    """Steps 0.125 s apart: 20 of them span 2.4 s, so the window holds the last 3 s, 25 steps. Group 1
    runs 22 steps at 10 ms, then 8 (one second) at 40 ms, the scheduler passing it over: its window is
    (17 × 0.010 + 8 × 0.040) / 25 = 0.49 / 25 = 0.0196 s, relative 0.010 / 0.0196 = 0.510, not flagged
    (over its last 20 steps alone, (12 × 0.010 + 8 × 0.040) / 20 = 0.022 s, it would be: 0.455)."""
    assert steptimes.MIN_WINDOW_S == 3.0
    hiccup = [0.010] * (WARM + 22) + [0.040] * 8
    s = straggler.scores(_run(_steps(0, len(hiccup), 0.010, gap=0.125), _steps(1, len(hiccup), hiccup, gap=0.125)))
    assert s[1].window_s == pytest.approx(0.0196) and s[1].relative == pytest.approx(0.010 / 0.0196)
    assert not s[1].flagged and straggler.straggler(s) is None


def test_individual_score_is_the_best_window_so_far_over_the_current_one():
    """One group: 20 counted steps of 10 ms, then 20 of 30 ms: best 10 ms, now 30 ms, individual 1/3.
    Alone it is not flagged (no peer: relative None): a machine-wide slowdown lowers every group's
    individual score at once, so only the relative score flags. Beside a 10 ms peer: relative 1/3 < 0.5, flagged."""
    times = [0.010] * (WARM + W) + [0.030] * W
    s = straggler.scores(_run(_steps(0, len(times), times)))[0]
    assert s.relative is None and not s.flagged
    assert s.best_s == pytest.approx(0.010) and s.window_s == pytest.approx(0.030)
    assert s.individual == pytest.approx(1 / 3)
    s = straggler.scores(_run(_steps(0, len(times), times), _steps(1, len(times), 0.010)))
    assert s[0].relative == pytest.approx(1 / 3) and s[0].flagged and not s[1].flagged


def test_warm_up_healing_and_a_new_attempt_are_not_counted_and_time_comes_from_timestamps_without_step_time():
    """No ``step_time_s`` (a trainer that reports none): the 0.2 s between events. The first 3 steps
    of an attempt and a healing step (participating false) are not samples: 3 + 19 steps leave the
    window one short, so no score; one more fills it. A new attempt starts an empty window (no
    score), and keeps the group's best."""
    healing = _steps(0, 1, None, t0=999.8, first_step=0, participating=False)
    events = healing + _steps(0, WARM + W - 1, None)
    assert straggler.scores(_run(events)) == {}
    events += _steps(0, 1, None, t0=1000.0 + 0.2 * (WARM + W - 1), first_step=WARM + W)
    s = straggler.scores(_run(events))[0]
    assert s.window_s == pytest.approx(0.2) and s.best_s == pytest.approx(0.2)

    state = _run(events + _steps(0, WARM + 5, None, attempt=1, t0=2000.0))
    assert straggler.scores(state) == {} and state.step_times.groups[0].best == pytest.approx(0.2)


def test_status_tile_and_exporter_name_the_slow_group(tmp_path):
    """Written by hand into a run directory: `workbench status` (text and --json), ``Run.status()``,
    the dashboard's tile and the exporter's gauge all name group 1."""
    from prometheus_client import generate_latest

    from workbench.apps import exporter
    from workbench.events.writer import EventWriter
    from workbench.run import rundir
    from workbench.run.handle import attach
    from workbench.spec.load import load_spec
    from workbench.widgets.panels import tiles_html
    from workbench.widgets.state import DashboardState

    spec = load_spec("demo", {"faults": [], "replicas": 3}).to_dict()
    run_dir = rundir.create(tmp_path / "runs", "slow", spec)
    n = WARM + W
    for r, comm in ((0, 0.040), (1, 0.010), (2, 0.040)):
        w = EventWriter(run_dir, f"replica-{r}.attempt-0", run="slow", replica=r, attempt=0)
        w.emit("start", role="replica")
        for i in range(n):
            w.emit("step", t=1000.0 + 0.2 * i, step=i + 1, loss=1.0, committed=True, step_time_s=0.050, comm_s=comm)
        w.close()

    st = attach(str(run_dir)).status()["stragglers"]
    assert st["straggler"] == 1 and st["groups"]["1"]["relative"] == 0.25 and st["groups"]["1"]["flagged"]
    assert not st["groups"]["0"]["flagged"] and not st["groups"]["2"]["flagged"]

    cli = workbench_cli("status", str(run_dir), "--json")
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["stragglers"]["straggler"] == 1
    text = workbench_cli("status", str(run_dir))
    assert "straggler: replica 1" in text.stdout and "1 0.25/1.00 SLOW" in text.stdout, text.stdout

    d = DashboardState(3, 100)
    from workbench.events.reader import EventReader

    d.apply(EventReader(run_dir).poll())
    tiles = tiles_html(d)
    assert "data-relative='0.25' data-flagged='true'" in tiles
    assert tiles.count("data-flagged='true'") == 1 and tiles.count("data-flagged='false'") == 2

    metrics = generate_latest(exporter.registry_for(exporter.RunCollector(attach(str(run_dir))))).decode()
    assert 'workbench_straggler_score{replica="1",run="slow",score="relative"} 0.25' in metrics, metrics
    assert 'workbench_straggler_score{replica="0",run="slow",score="relative"} 1.0' in metrics


# A decoder whose step's own work is ~0.15 s: longer than the 0.1 s period of the CPU quota a
# ``straggler`` fault sets, so every throttled step shows it (the test's docstring).
LONG_STEPS = {"dim": 256, "heads": 4, "layers": 2, "seq_len": 64, "batch_size": 16}
FAULT_S, WITHIN = 10.0, 10


def _worst(by_group):
    return min(by_group.values(), key=lambda s: s.relative).replica


def _live_worst(run):
    """The group ``Run.status()`` gives the lowest relative score, once all three are scored."""
    groups = run.status()["stragglers"]["groups"]
    return min(groups, key=lambda r: groups[r]["relative"]) if len(groups) == 3 else None


@pytest.mark.slow
def test_a_throttled_group_has_the_worst_score_within_10_steps_and_a_fault_free_minute_flags_nothing(start_run):
    """The issue's criterion on three real torchft-lite groups: a ``straggler`` fault (25 % of a CPU,
    10 s) on one group gives it the worst (lowest) relative score within 10 of its steps, and a
    fault-free minute flags no group. Each group is throttled in turn, after a fault-free minute
    and each once the last one's window has refilled with unthrottled steps.

    The model is the demo's decoder made larger (``LONG_STEPS``, ~0.25 s a step here, ~4 a second):
    the throttle is a CFS quota, 25 ms of CPU per 100 ms period, and the demo's ~20 ms steps
    (12 ms of work) often run whole inside one period at full speed, so a throttled demo group
    has fast and stalled steps mixed and its score needed 53-59 steps to flag it. A real trainer's
    step takes far longer than 0.1 s, so every one of its steps is throttled; so are these.

    Replayed from the events step by step, as the fold computed them (``Run.status()``'s scores):
    from some step k <= 10 after the fault event through its 10th step, the throttled group is
    worst at each of its steps, and at its 10th its relative score is lower than any group's in
    the fault-free minute (measured over 12 faults, 4 runs at load 2-4.6: k = 1-2, median 1;
    relative 0.48-0.72 at the 10th step, against a fault-free lowest of 0.84-0.88; flagged
    (< 0.5) at its 10th-12th step at load 2, not within 12 steps at load 4).
    Worst at one step alone would prove little: some group is always worst, a third of the time
    each by chance (a scorer on ``step_time_s`` alone, replayed on a run of this setup, was "worst"
    at step 1-10 too, at 0.95-0.99). Live, ``Run.status()`` ranks it worst during the fault; the
    fault's cgroup is gone after its undo. Fault-free, no score sample flagged a group.
    """
    from workbench.faults import host as hostfaults

    overrides = {"faults": [], "steps": 10**7, "replicas": 3, "min_replicas": 1, "model": LONG_STEPS}
    run = start_run("demo", overrides)
    run.wait_for_step(WARM + W + 5, replica=2, timeout=180)
    t_free = run.events_read[-1]["t"]
    run.wait_for(lambda r: r.events_read[-1]["t"] - t_free >= 60, timeout=180)

    faults = []
    for g in range(3):
        fault = run.kill(replica=g, how="straggler", seconds=FAULT_S)
        run.wait_for(lambda r: _live_worst(r) == str(g), timeout=FAULT_S)
        undo = lambda r: [e["t"] for e in r.events_read if e.get("resumed") == "straggler" and e["t"] > fault["t"]]
        run.wait_for(undo, timeout=FAULT_S + 60)
        assert not os.path.exists(fault["cgroup"]) and hostfaults.cgroups(run.id) == []
        t_undo = undo(run)[0]
        faults.append((g, fault["t"], t_undo))
        fresh = lambda r: sum(
            e.get("kind") == "step" and e.get("replica") == g and e["t"] > t_undo for e in r.events_read
        )
        if g < 2:
            run.wait_for(lambda r: fresh(r) >= W, timeout=120)
    cli = workbench_cli("status", str(run.run_dir), "--json")
    assert cli.returncode == 0 and set(json.loads(cli.stdout)["stragglers"]["groups"]) == {"0", "1", "2"}, cli

    scored = [(e, s) for e, s in straggler.trace(run.event_records(), 3) if len(s) == 3]
    free = [s for e, s in scored if e["t"] < faults[0][1]]
    assert len(free) > 300  # the fault-free minute was scored (~4 steps/s each)
    flagged = [s for s in free if any(x.flagged for x in s.values())]
    assert not flagged, flagged[:3]
    lowest = min(x.relative for s in free for x in s.values())
    measured, at_10 = [], []
    for g, t_fault, t_undo in faults:
        steps = [s for e, s in scored if t_fault < e["t"] < t_undo and e.get("replica") == g][:WITHIN]
        assert len(steps) == WITHIN, (g, len(steps))  # the fault held for 10 of its steps
        # A slow peer costs the others speed, not steps: the process-group timeout waits it out (with
        # the timeout at the 300 ms heartbeat timeout, 1-4 of each group's ~21 steps here committed).
        lost = [
            (e["replica"], e["step"])
            for e in run.events_read
            if e["kind"] == "step" and t_fault < e["t"] < t_undo and not e.get("committed")
        ]
        assert lost == [], (g, lost)
        worst = [_worst(s) == g for s in steps]
        assert worst[-1], (g, worst, [round(s[g].relative, 2) for s in steps])
        measured.append(min(k + 1 for k in range(WITHIN) if all(worst[k:])))
        at_10.append(round(steps[-1][g].relative, 3))
    assert max(at_10) < lowest, (at_10, lowest)  # worse than any group was fault-free: not chance
    print(f"worst from its step {measured}; relative at its 10th {at_10}; fault-free lowest {lowest:.3f}")
