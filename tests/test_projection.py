"""The projection model: hand-checked timelines, the published anchors, and this machine's own runs.

The model's speed is stated (measured) in its module docstring, not asserted in a timed test."""

import math

import numpy as np
import pytest

from workbench.projection import (
    CheckpointRestart,
    DiLoCo,
    Elastic,
    Failures,
    Job,
    Projection,
    daly_period,
    sources,
    young_period,
)
from workbench.projection.calibrate import calibrate, reproduce
from workbench.projection.figures import crossings, scale_figure, vs_scale

from .conftest import workbench_cli


def trace_job(**kw):
    return Job(gpus=4, groups=4, step_s=1.0, horizon_s=1000.0, **kw)


def test_checkpoint_restart_on_a_trace_matches_the_hand_timeline():
    """Writes of 10 s after every 40 s of training; failures at 110 s and 500 s; 30 s down each.
    [0, 110): two full cycles (80 s useful, 20 s written), 10 s lost. [110, 500): 30 s down, 360 s up =
    7 cycles (280 useful, 70 written) + 10 s lost. [500, 1000): 30 down, 470 up = 9 cycles (360, 90)
    + 20 s useful at the window's end. Useful 720 + 20 = 740 of 1000."""
    p = Projection(
        job=trace_job(),
        failures=Failures(trace=[(110.0, 0), (500.0, 2)]),
        restart=CheckpointRestart(period_s=40.0, write_s=10.0, restore_s=0.0, detect_s=0.0, restart_s=30.0),
    )
    r = p.run(strategies=("checkpoint-restart",))["checkpoint-restart"]
    assert r["goodput"] == pytest.approx(0.74, abs=1e-12)
    assert r["badput"] == pytest.approx(
        {"checkpoint": 0.18, "recompute": 0.02, "restart": 0.06, "restore": 0.0}, abs=1e-12
    )
    assert r["steps_per_s"] == pytest.approx(0.74, abs=1e-12)  # 1-s steps


def test_elastic_on_a_trace_matches_the_hand_timeline():
    """4 groups, 1,000 s. Failures of groups 0 (100 s) and 1 (500 s): each out for 10 s replacement +
    20 s restart + 5 s heal = 35 s; the 3 survivors lose 2 s each; every step costs 10 % more.
    Useful group-seconds (4000 − 2 × 35 − 2 × 3 × 2) / 1.1 = 3918 / 1.1, over 4000."""
    el = Elastic(overhead=0.1, stall_s=2.0, replacement_s=10.0, restart_s=20.0, heal_s=5.0, spares=0)
    p = Projection(job=trace_job(), failures=Failures(trace=[(100.0, 0), (500.0, 1)]), elastic=el)
    r = p.run(strategies=("elastic",))["elastic"]
    assert r["goodput"] == pytest.approx(3918 / 1.1 / 4000, abs=1e-12)
    assert r["badput"]["missing"] == pytest.approx(60 / 4000, abs=1e-12)  # 2 × 30 group-s of 4 groups' 4000
    assert r["badput"]["heal"] == pytest.approx(10 / 4000, abs=1e-12)
    assert r["badput"]["stall"] == pytest.approx(12 / 4000, abs=1e-12)
    # Steps go on while a quorum exists: 1,000 s less 2 × 2 s of stall, at 1.1 s a step.
    assert r["steps_per_s"] == pytest.approx(996 / 1.1 / 1000, abs=1e-12)


def test_a_spare_shortens_the_first_replacement_and_a_quorum_loss_stops_everyone():
    """3 groups, min 2. One spare, taken at 100 s (group 0 back after 5 + 20 = 25 s); the repaired node
    returns at 100 + 600 s, so group 1's failure at 110 s waits the full 600 s: out [110, 730).
    Overlap [110, 125): one live group, below the quorum: no one trains. Live group-seconds:
    3 × 1000 − 25 − 620 (group 1 out) − 15 (the lone survivor idles) = 2340."""
    el = Elastic(
        overhead=0.0, stall_s=0.0, replacement_s=600.0, spares=1, spare_s=5.0, restart_s=20.0, heal_s=0.0, min_groups=2
    )
    job = Job(gpus=3, groups=3, step_s=1.0, horizon_s=1000.0)
    r = Projection(job=job, failures=Failures(trace=[(100.0, 0), (110.0, 1)]), elastic=el).run(strategies=("elastic",))[
        "elastic"
    ]
    assert r["goodput"] == pytest.approx(2340 / 3000, abs=1e-12)
    assert r["badput"]["no_quorum"] == pytest.approx(15 / 3000, abs=1e-12)


def test_diloco_discards_the_interval_of_a_failure_in_every_group():
    """2 groups, outer step every 10 × 1-s steps + 0 s (overlapped). A failure at 25 s in group 0: the
    outer step at 30 s fails, both groups discard [20, 30); group 0 is out from 20 s until the first
    outer step after 25 + 7 = 32 s, i.e. 40 s: 20 group-s; group 1 discards its 10 s.
    Useful (2 × 100 − 20 − 10) / 200."""
    d = DiLoCo(sync_steps=10, overlap=True, stall_s=0.0, replacement_s=2.0, restart_s=5.0, heal_s=0.0)
    job = Job(gpus=2, groups=2, step_s=1.0, horizon_s=100.0)
    r = Projection(job=job, failures=Failures(trace=[(25.0, 0)]), diloco=d).run(strategies=("diloco",))["diloco"]
    assert r["goodput"] == pytest.approx(170 / 200, abs=1e-12)


def test_the_per_step_overhead_is_the_cross_group_all_reduce_of_a_gradient_shard():
    """70B bf16 gradients over 1,024 accelerators in 8 groups: each accelerator holds 70e9 × 2 / 128
    = 1.09375 GB and a ring across 8 groups moves 2 × 7/8 of it, 1.9140625 GB, at 0.65 GB/s: 2.9447 s
    on a 10-s step. Without failures the elastic job runs at 1 / (1 + 0.29447) of the ideal."""
    job = Job(gpus=1024, groups=8, step_s=10.0, params=70e9, horizon_s=1000.0)
    el = Elastic(cross_gbps=0.65)
    assert el.step_overhead(job) == pytest.approx(1.9140625 / 0.65 / 10, rel=1e-12)
    r = Projection(job=job, failures=Failures(trace=[]), elastic=el).run(strategies=("elastic",))["elastic"]
    assert r["goodput"] == pytest.approx(1 / (1 + 1.9140625 / 0.65 / 10), rel=1e-12)


def test_young_and_daly_periods_and_the_optimum_they_promise():
    # Young: √(2 · 60 · 36000) = √4320000 ≈ 2078.46; Daly adds (1 + ⅓√(60/72000) + 60/648000) and − 60.
    assert young_period(60.0, 36000.0) == pytest.approx(math.sqrt(4_320_000), rel=1e-12)
    assert daly_period(60.0, 36000.0) == pytest.approx(
        math.sqrt(4_320_000) * (1 + math.sqrt(60 / 72000) / 3 + 60 / 648000) - 60, rel=1e-12
    )
    assert daly_period(100.0, 40.0) == 40.0  # C ≥ 2M: the MTBF itself
    # The simulated goodput at Daly's period beats half and twice that period (same failure draws).
    base = Projection(
        job=Job(gpus=1000, horizon_s=200 * 36000.0, params=1.0),
        failures=Failures(device_mtbf_h=1000 * 10.0),
        restart=CheckpointRestart(write_s=60.0, restore_s=0.0, detect_s=0.0, restart_s=300.0),
    )
    tau = daly_period(60.0, 36000.0)
    good = {
        f: base.replace(period_s=f * tau).run(replicates=8, seed=1, strategies=("checkpoint-restart",))[
            "checkpoint-restart"
        ]["goodput"]
        for f in (0.5, 1.0, 2.0)
    }
    assert good[1.0] > good[0.5] and good[1.0] > good[2.0], good


def test_the_monte_carlo_agrees_with_first_order_theory_where_it_holds():
    """M = 100 h ≫ τ, D: goodput → 1 − C/(τ+C) − (τ/2 + D)/M. With C = 30 s, τ = 1800 s, D = 600 s:
    1 − 30/1830 − 1500/360000 ≈ 0.97944; the model's estimate within 3 standard errors and 0.2 points."""
    p = Projection(
        job=Job(gpus=100, horizon_s=400 * 360000.0, params=1.0),
        failures=Failures(device_mtbf_h=100 * 100.0),
        restart=CheckpointRestart(period_s=1800.0, write_s=30.0, restore_s=0.0, detect_s=0.0, restart_s=600.0),
    )
    r = p.run(replicates=16, seed=2, strategies=("checkpoint-restart",))["checkpoint-restart"]
    expect = 1 - 30 / 1830 - 1500 / 360000
    assert abs(r["goodput"] - expect) < max(3 * r["stderr"], 1e-4) and abs(r["goodput"] - expect) < 0.002


def test_a_bad_input_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"^gpu: not an input of the projection; allowed: .*gpus"):
        Projection().replace(gpu=4)
    with pytest.raises(ValueError, match=r"strategies: \['restart'\]; allowed: checkpoint-restart, elastic, diloco"):
        Projection().run(strategies=("restart",))


def test_crossings_are_where_the_curves_change_order():
    """Elastic pays a fixed per-step overhead, checkpoint-restart a per-failure cost: at few accelerators
    checkpoint-restart is ahead, at many elastic is; the marked crossing lies between the two sampled
    sizes where the order flips, at the interpolated goodput of both."""
    curves = vs_scale(
        Projection().replace(params=70e9),
        [512, 2048, 8192, 32768],
        device_mtbf_h=sources.meta_device_mtbf_h,
        replicates=8,
    )
    wide = curves.pivot(index="gpus", columns="strategy", values="goodput")
    assert wide.loc[512, "checkpoint-restart"] > wide.loc[512, "elastic"]
    assert wide.loc[32768, "checkpoint-restart"] < wide.loc[32768, "elastic"]
    x = crossings(curves)
    cr_el = x[(x["a"] == "checkpoint-restart") & (x["b"] == "elastic")]
    assert len(cr_el) == 1
    flip = [
        g
        for g, h in zip(wide.index[:-1], wide.index[1:])
        if (wide.loc[g, "checkpoint-restart"] - wide.loc[g, "elastic"])
        * (wide.loc[h, "checkpoint-restart"] - wide.loc[h, "elastic"])
        < 0
    ]
    assert len(flip) == 1 and flip[0] < cr_el["gpus"].iloc[0] < 4 * flip[0]
    fig = scale_figure(curves, measured={"gpus": 3, "goodput": 0.8, "label": "here"})
    assert {t.name for t in fig.data} >= {"crossing", "measured here"}


# --- published anchors ----------------------------------------------------------------------------


def test_clockwork_64_h200_ordering_checkpoint_restart_finishes_first():
    """818 min (checkpoint-restart) < 930 min (torchft) for 3,000 steps: the per-step overhead costs
    torchft more than the failures cost checkpoint-restart."""
    t = sources.clockwork_projection().time_to_steps(sources.CLOCKWORK_STEPS)
    assert t["checkpoint-restart"] < t["elastic"]


@pytest.mark.xfail(
    strict=True,
    reason="missing input: the benchmark's restart + restore time per failure is not "
    "published; Clockwork's 15-min assumption predicts ~635 min for "
    "checkpoint-restart, where 818 min implies ~24 min per failure",
)
def test_clockwork_64_h200_ratio_within_15_percent():
    t = sources.clockwork_projection().time_to_steps(sources.CLOCKWORK_STEPS)
    published = sources.CLOCKWORK_MINUTES["elastic"] / sources.CLOCKWORK_MINUTES["checkpoint-restart"]
    assert abs(t["elastic"] / t["checkpoint-restart"] / published - 1) <= 0.15


@pytest.mark.xfail(
    strict=True,
    reason="missing input: Llama 3's restart time is not published; with Clockwork's "
    "15-min assumption and TorchTitan's 100-s detection the model gives ~89 %, "
    "just under the published > 90 % (it needs a restart under ~13 min)",
)
def test_llama3_effective_training_time_above_90_percent():
    r = sources.llama3_projection().run(replicates=16, strategies=("checkpoint-restart",))["checkpoint-restart"]
    assert r["goodput"] > sources.LLAMA3_EFFECTIVE_MIN


# --- this machine's own runs ----------------------------------------------------------------------

# Three fault rates on torchft-lite (1, 2 and 4 kills in a ~35-s window, spaced wider than a recovery
# so that each fault is the model's case, not two tangled ones) and one on ddp-restart. A 50-ms sleep
# in each step keeps the step time from depending on how many processes share the 2 cores.
ELASTIC_SCHEDULES = {
    "1 fault": [(10.0, 1)],
    "2 faults": [(6.0, 1), (18.0, 2)],
    "4 faults": [(4.0, 1), (11.0, 2), (18.0, 0), (25.0, 1)],
}
# ddp-restart checkpoints every 80 steps: the first kill lands 40 steps past its checkpoint at step 80, the
# second 60 steps past the one at 160, in the attempt restored from 80. Placed by step, not by seconds: a
# kill placed in seconds drifted onto a write under load (0.07 s after step 160's), which changes the redone
# work by a whole period and tests the load, not the model.
RESTART_FAULTS = [{"action": "kill", "target": 1, "at_step": 120}, {"action": "kill", "target": 2, "at_step": 220}]
# 400 steps of at least 0.07 s last 28 s however fast the steps go: past the last kill placed in seconds (25 s).
QUIET_STEPS = {"model.step_delay_s": 0.07}


def _faults(schedule):
    return [{"action": "kill", "target": g, "at_s": t} for t, g in schedule]


def _by_hand(events):
    """What calibration must find, read off the events directly: each kill (time after the first
    committed step, target) and its replacement time (fault → its group's next `start`)."""
    t0 = min(e["t"] for e in events if e["kind"] == "step" and e.get("committed"))
    kills = sorted((e for e in events if e["kind"] == "fault" and e["action"] == "kill"), key=lambda e: e["t"])
    starts = [e for e in events if e["kind"] == "start" and e.get("role") == "replica"]
    repl = [
        min((s["t"] for s in starts if s["replica"] == f["target"] and s["t"] > f["t"]), default=np.nan) - f["t"]
        for f in kills
    ]
    return [(f["t"] - t0, f["target"]) for f in kills], repl


@pytest.mark.slow
def test_projecting_this_machines_runs_reproduces_their_goodput(start_run):
    """Each run's projection onto itself — its own step time, recovery costs and fault trace, through
    the model — lands within 3 points of the goodput `analysis.goodput` measures on its events; the
    three elastic runs' goodput falls with their fault rate, so a model that ignored the faults could
    not pass. Also the CLI's answer on one of them, and its one-line error on a bad flag."""
    results = {}
    for name, schedule in ELASTIC_SCHEDULES.items():
        run = start_run("demo", {"steps": 400, **QUIET_STEPS, "faults": _faults(schedule)})
        assert run.wait(timeout=240)["state"] == "completed"
        results[name] = run
    restart = start_run(
        "demo",
        {"trainer": "ddp-restart", "steps": 400, **QUIET_STEPS, "checkpoint.every_steps": 80, "faults": RESTART_FAULTS},
    )
    assert restart.wait(timeout=300)["state"] == "completed"
    results["ddp-restart"] = restart

    table = {}
    for name, run in results.items():
        events = run.event_records()
        cal = calibrate(run)
        trace, repl = _by_hand(events)
        assert len(cal["trace"]) == len(trace) and all(
            a == pytest.approx(b, abs=1e-9) for pa, pb in zip(cal["trace"], trace) for a, b in zip(pa, pb)
        )
        if cal["elastic"]:
            assert cal["replacement_s"] == pytest.approx(float(np.median(repl)), abs=1e-9)
        else:
            ckpts = [e for e in events if e["kind"] == "checkpoint" and e.get("durable")]
            assert cal["write_s"] == pytest.approx(float(np.median([e["seconds"] for e in ckpts])), abs=1e-12)
        r = reproduce(run)
        table[name] = (r["predicted"], r["measured"])
    print("\npredicted vs measured goodput:", {k: (round(p, 4), round(m, 4)) for k, (p, m) in table.items()})
    for name, (pred, meas) in table.items():
        assert abs(pred - meas) <= 0.03, (name, pred, meas)
    measured_elastic = [table[k][1] for k in ELASTIC_SCHEDULES]
    assert measured_elastic[0] > measured_elastic[1] > measured_elastic[2], measured_elastic

    out = workbench_cli("project", str(results["4 faults"].run_dir), "--gpus", "4096", "--groups", "8", "--json")
    assert out.returncode == 0, out.stderr
    import json

    shown = json.loads(out.stdout)
    assert shown["reproduced"]["predicted"] == pytest.approx(table["4 faults"][0], abs=1e-12)
    assert shown["inputs"]["job"]["gpus"] == 4096 and set(shown["projection"]) >= {"elastic", "diloco"}
    bad = workbench_cli("project", str(results["4 faults"].run_dir), "--gpus", "0")
    assert (
        bad.returncode == 2
        and bad.stderr.strip() == "workbench project: --gpus: must be > 0 (>= 0 for --overhead, --spares)"
    )


def test_calibration_reads_a_hand_built_log(tmp_path):
    """test_breakeven's logs (a real EventWriter, times by construction): group 1 killed at 50.06 s,
    its next attempt starts at 52.0 s and steps again from 55.0 s, no heal event: replacement 1.94 s,
    restart 55.0 − 52.0 = 3.0 s; group 0 never slows down: stall 0. Per accelerator the elastic run
    makes 128 / 2 = 64 samples/s, the checkpoint-restart baseline 256 / 2 = 128: overhead 1.0."""
    from .test_breakeven import elastic_log, restart_log

    cal = calibrate(elastic_log(tmp_path, True), baseline=restart_log(tmp_path, False))
    assert cal["trace"] == [(pytest.approx(400 * 0.125 + 0.06 - 0.125, abs=1e-6), 1)]
    assert cal["replacement_s"] == pytest.approx(1.94, abs=1e-6)
    assert cal["restart_s"] == pytest.approx(3.0, abs=1e-6) and cal["heal_s"] == 0.0
    assert cal["stall_s"] == pytest.approx(0.0, abs=1e-9)
    assert cal["overhead"] == pytest.approx(1.0, rel=1e-12)
    cr = calibrate(restart_log(tmp_path / "b", True))
    assert cr["restart_s"] == pytest.approx(30.0, abs=1e-9) and cr["period_s"] == pytest.approx(160 * 0.0625, rel=1e-9)
