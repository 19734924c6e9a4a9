"""Break-even math on made-up event logs (written by a real EventWriter), checked by hand."""

import pytest

from workbench import breakeven as be
from workbench.events import EventReader, EventWriter
from workbench.spec_load import load_spec

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
    e_clean, e_kill = elastic_log(tmp_path, False), elastic_log(tmp_path, True)
    r_clean, r_kill = restart_log(tmp_path, False), restart_log(tmp_path, True)
    result = be.breakeven(e_kill, r_kill, e_clean, r_clean)
    e, r = result["elastic"], result["restart"]

    r_e, r_r = 2 * BATCH / DT_ELASTIC, 2 * BATCH / DT_RESTART
    assert e["rate_samples_per_s"] == pytest.approx(r_e, rel=0.01)
    assert r["rate_samples_per_s"] == pytest.approx(r_r, rel=0.01)
    # Elastic: window T = 799 steps; useful = 1600 group-steps less the 39 group 1 missed, at the
    # faulted run's own steady rate (goodput's estimate from whole bins, checked to 1 % above).
    assert e["faulted_rate_samples_per_s"] == pytest.approx(r_e, rel=0.01)
    l_e = 799 * DT_ELASTIC - (1600 - 39) * BATCH / e["faulted_rate_samples_per_s"]
    assert e["faults"] == 1 and e["lost_per_fault_s"] == pytest.approx(l_e, rel=1e-9)
    # Restart: 30 s from fault to first step, plus half of the 10 s checkpoint period.
    assert r["restart_s"] == pytest.approx(30.0, abs=1e-6)
    assert r["checkpoint_period_s"] == pytest.approx(10.0, abs=1e-6)
    l_r = 30.0 + 10.0 / 2
    assert r["lost_per_fault_s"] == pytest.approx(l_r, rel=1e-6)
    # What the run really lost: the 30.03 s gap (its last step is the first new one), the 40
    # rolled-back steps (2.5 s), less goodput's fencepost step.
    assert r["rolled_back_steps"] == 2 * 40
    t_window = 999 * DT_RESTART + 30.03 + 639 * DT_RESTART
    assert r["measured_lost_per_fault_s"] == pytest.approx(
        t_window - 2 * 1600 * BATCH / r["faulted_rate_samples_per_s"], rel=1e-9)
    assert r["measured_lost_per_fault_s"] == pytest.approx(30.03 + 2.5 - 2 * DT_RESTART, abs=2 * DT_RESTART)

    r_e, r_r = e["rate_samples_per_s"], r["rate_samples_per_s"]
    m = (r_r * l_r - r_e * l_e) / (r_r - r_e)
    assert result["crossing_mtbf_s"] == pytest.approx(m, rel=1e-9)
    assert result["elastic_wins"] == "below"
    assert result["fault_free_overhead"] == pytest.approx(0.5, rel=0.01)


def test_the_crossing_is_where_the_two_curves_meet(tmp_path):
    result = be.breakeven(elastic_log(tmp_path, True), restart_log(tmp_path, True),
                          elastic_log(tmp_path, False), restart_log(tmp_path, False))
    e, r, m = result["elastic"], result["restart"], result["crossing_mtbf_s"]
    at = lambda k, x: float(be.useful_rate(k["rate_samples_per_s"], k["lost_per_fault_s"], x))  # noqa: E731
    assert at(e, m) == pytest.approx(at(r, m), rel=1e-9)
    assert at(e, 0.5 * m) > at(r, 0.5 * m) and at(e, 2 * m) < at(r, 2 * m)
    fig = be.breakeven_figure(result)
    marker = next(tr for tr in fig.data if tr.name == "break-even")
    assert marker.x[0] == pytest.approx(m) and marker.y[0] == pytest.approx(at(r, m), rel=1e-9)


def test_no_crossing_when_elastic_is_faster_and_loses_less():
    assert be.crossing_mtbf(200.0, 1.0, 100.0, 30.0) is None
    assert be.crossing_mtbf(100.0, 2.0, 100.0, 30.0) is None
