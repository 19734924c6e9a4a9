"""Break-even math on made-up event logs (written by a real EventWriter), checked by hand."""

import numpy as np
import pytest

from workbench.analysis import breakeven as be
from workbench.events.reader import EventReader
from workbench.events.writer import EventWriter
from workbench.spec.load import load_spec

BASE = 1_000_000.0
BATCH = 8
# Step periods are exact binary fractions, so the steady-state bins hold whole steps.
DT_ELASTIC = 0.125  # 2 groups × 8 samples / 0.125 s = 128 samples/s
DT_RESTART = 0.0625  # 2 ranks × 8 samples / 0.0625 s = 256 samples/s


def _writer(run_dir, replica, attempt):
    return EventWriter(run_dir, f"replica-{replica}.attempt-{attempt}", run="r", replica=replica, attempt=attempt)


def _step(w, t, step):
    w.emit("step", t=t, step=step, loss=1.0, committed=True, participating=True, participants=2)


def _read(run_dir):
    return sorted(EventReader(run_dir).poll(), key=lambda e: e["t"])


def elastic_log(tmp_path, kill: bool):
    """2 groups step every 0.125 s for 100 s; with ``kill``, group 1 dies at 50.06 s and
    participates again at 55.0 s (healed: step numbers carry on from its peer's)."""
    run_dir = tmp_path / ("elastic-kill" if kill else "elastic")
    w0, w1 = _writer(run_dir, 0, 0), _writer(run_dir, 1, 0)
    w0.emit("start", t=BASE, trainer="torchft-lite", role="replica")
    w1.emit("start", t=BASE, trainer="torchft-lite", role="replica")
    w1b = _writer(run_dir, 1, 1)
    for k in range(1, 801):
        t = BASE + k * DT_ELASTIC
        _step(w0, t, k)
        if not kill or k <= 400:
            _step(w1, t, k)
        elif k >= 440:
            _step(w1b, t, k)
        if kill and k == 400:
            EventWriter(run_dir, "control", run="r").emit("fault", t=t + 0.06, action="kill", target=1, origin="api")
            w1b.emit("start", t=BASE + 52.0, trainer="torchft-lite", role="replica")
    return _read(run_dir), load_spec(trainer="torchft-lite", replicas=2, **{"model.batch_size": BATCH})


def restart_log(tmp_path, kill: bool):
    """2 ranks step every 0.0625 s, checkpoint every 160 steps (10 s). With ``kill``: rank 1 dies
    at step 1000 (62.5 s; last checkpoint at step 960), the job's next attempt restores step 960
    and commits its first step 30 s after the fault."""
    run_dir = tmp_path / ("restart-kill" if kill else "restart")
    spec = load_spec(trainer="ddp-restart", replicas=2, **{"model.batch_size": BATCH, "checkpoint.every_s": 10})
    t, attempt, step, end = BASE, 0, 0, 1600
    writers = [_writer(run_dir, r, 0) for r in range(2)]
    for w in writers:
        w.emit("start", t=t, trainer="ddp-restart", role="replica")
    while step < end:
        step += 1
        t += DT_RESTART
        for w in writers:
            _step(w, t, step)
        if step % 160 == 0:
            writers[0].emit("checkpoint", t=t + 0.001, step=step, seconds=0.001, bytes=1, durable=True)
        if kill and attempt == 0 and step == 1000:
            fault_t = t + 0.03
            EventWriter(run_dir, "control", run="r").emit("fault", t=fault_t, action="kill", target=1, origin="api")
            attempt, step, t = 1, 960, fault_t + 30.0 - DT_RESTART
            writers = [_writer(run_dir, r, 1) for r in range(2)]
            for w in writers:
                w.emit("start", t=fault_t + 10.0, trainer="ddp-restart", role="replica")
                w.emit("phase", t=fault_t + 25.0, phase="restored", from_step=960)
    return _read(run_dir), spec


def test_rates_losses_and_crossing_match_a_hand_computation(tmp_path):
    """Every expectation below is arithmetic on the logs' construction, written out; none calls
    the implementation. Goodput's steady-state bins are 20 median steps wide (elastic 2.5 s,
    restart 1.25 s) and half-open, so every bin away from the fault holds exactly 20 steps per
    writer: 2 × 20 × 8 / 2.5 = 128 samples/s elastic, 2 × 20 × 8 / 1.25 = 256 samples/s restart,
    in the fault-free and the faulted runs alike (a restart's redone steps are steps taken at the
    steady rate)."""
    e_clean, e_kill = elastic_log(tmp_path, False), elastic_log(tmp_path, True)
    r_clean, r_kill = restart_log(tmp_path, False), restart_log(tmp_path, True)
    result = be.breakeven(e_kill, r_kill, e_clean, r_clean)
    e, r = result["elastic"], result["restart"]

    assert (e["rate_samples_per_s"], e["faulted_rate_samples_per_s"]) == (128.0, 128.0)
    assert (r["rate_samples_per_s"], r["faulted_rate_samples_per_s"]) == (256.0, 256.0)
    # Elastic: window T = first to last step = 799 × 0.125 = 99.875 s; useful = 800 + 761 group-steps
    # (group 1 missed steps 401..439) = 1561 × 8 = 12488 samples; lost = T − 12488 / 128
    # = 99.875 − 97.5625 = 2.3125 s, all of it the one fault's.
    assert e["faults"] == 1 and e["rolled_back_steps"] == 0
    assert e["lost_per_fault_s"] == pytest.approx(2.3125, rel=1e-12)
    assert e["measured_lost_per_fault_s"] == e["lost_per_fault_s"]
    # Restart: fault → the next attempt's first step is 30 s; checkpoints every 160 × 0.0625 = 10 s;
    # the model's loss per fault is restart + half a period = 30 + 5 = 35 s.
    assert r["faults"] == 1 and r["restart_s"] == pytest.approx(30.0, rel=1e-12)
    assert r["checkpoint_period_s"] == pytest.approx(10.0, rel=1e-12)
    assert r["lost_per_fault_s"] == pytest.approx(35.0, rel=1e-12)
    # What the run really lost: steps 961..1000 were run, rolled back by the restore from 960 and
    # redone (2 ranks × 40 steps); window T = 999 × 0.0625 (to the kill) + 30.03 (the gap: the last
    # step before the kill is 0.03 s before it) + 639 × 0.0625 (steps 961..1600) = 132.405 s; useful
    # = 2 ranks × 1600 distinct steps × 8 = 25600 samples = 100 s at 256/s: lost 32.405 s.
    assert r["rolled_back_steps"] == 80
    assert r["measured_lost_per_fault_s"] == pytest.approx(32.405, rel=1e-9)
    # Crossing: M* = (R_r L_r − R_e L_e) / (R_r − R_e) = (256 × 35 − 128 × 2.3125) / (256 − 128)
    # = (8960 − 296) / 128 = 67.6875 s; elastic (the slower one fault-free) wins below it.
    assert result["crossing_mtbf_s"] == pytest.approx(67.6875, rel=1e-12)
    assert result["elastic_wins"] == "below"
    assert result["fault_free_overhead"] == pytest.approx(0.5, rel=1e-12)  # 1 − 128 / 256


def test_the_crossing_is_where_the_two_curves_meet(tmp_path):
    """The figure's curves and marker against R (1 − L/M), floored at 0, with the hand values of
    the test above (R_e = 128, L_e = 2.3125, R_r = 256, L_r = 35, M* = 67.6875 = 1083/16):
    at M*, 128 − 128 × 2.3125 × 16/1083 = 133888/1083 ≈ 123.63 samples/s for both."""
    result = be.breakeven(
        elastic_log(tmp_path, True),
        restart_log(tmp_path, True),
        elastic_log(tmp_path, False),
        restart_log(tmp_path, False),
    )
    fig = be.breakeven_figure(result)
    marker = next(tr for tr in fig.data if tr.name == "break-even")
    assert marker.x[0] == pytest.approx(67.6875, rel=1e-12)
    assert marker.y[0] == pytest.approx(133888 / 1083, rel=1e-12)
    elastic = next(tr for tr in fig.data if tr.name.startswith("elastic"))
    restart = next(tr for tr in fig.data if tr.name.startswith("checkpoint-restart"))
    assert "R=128/s, L=2.3 s/fault" in elastic.name and "R=256/s, L=35.0 s/fault" in restart.name
    m = np.asarray(elastic.x)
    assert np.array_equal(m, np.asarray(restart.x))
    assert np.asarray(elastic.y) == pytest.approx(np.maximum(0.0, 128 * (1 - 2.3125 / m)), rel=1e-12)
    assert np.asarray(restart.y) == pytest.approx(np.maximum(0.0, 256 * (1 - 35 / m)), rel=1e-12)
    # Below M* elastic is above checkpoint-restart, beyond it below: at M*/2 (33.84 s) restart loses
    # more than M per fault (35 > 33.84) and is floored at 0 while elastic makes 128 × (1 − 4.625/67.6875)
    # ≈ 119.25; at 2 M* (135.375 s) elastic ≈ 125.81, restart 256 × (1 − 35/135.375) ≈ 189.81.
    # (Below L_e = 2.3125 s both are floored at 0.)
    below, above = (m > 2.3125) & (m < 67.6875), m > 67.6875
    assert below.any() and above.any()
    assert (np.asarray(elastic.y)[below] > np.asarray(restart.y)[below]).all()
    assert (np.asarray(elastic.y)[above] < np.asarray(restart.y)[above]).all()


def test_no_crossing_when_elastic_is_faster_and_loses_less():
    # 200 (1 − 1/M) = 100 (1 − 30/M) gives M = (3000 − 200) / (100 − 200) < 0: no crossing at M > 0.
    assert be.crossing_mtbf(200.0, 1.0, 100.0, 30.0) is None
    # Equal rates: parallel lines.
    assert be.crossing_mtbf(100.0, 2.0, 100.0, 30.0) is None
    # A crossing for contrast, by hand: (200 × 30 − 100 × 2) / (200 − 100) = 58.
    assert be.crossing_mtbf(100.0, 2.0, 200.0, 30.0) == pytest.approx(58.0, rel=1e-12)
