"""torchft-lite's timing mode: per-phase seconds in each step event that add up to the step, off by default."""

from __future__ import annotations


def test_step_timing_phases_partition_the_step_and_are_absent_by_default(start_run, run_root):
    # min_replicas 2: both groups take every step together (with 1, a group that joined late healed
    # to its peer's step and skipped the ones before: 37 step events, not 38, in one CI run)
    common = {"faults": [], "replicas": 2, "min_replicas": 2, "steps": 20, "run_root": str(run_root)}
    timed = start_run("demo", {**common, "torchft.step_timing": True})
    plain = start_run("demo", common)
    assert timed.wait(timeout=300)["state"] == "completed"
    assert plain.wait(timeout=300)["state"] == "completed"
    steps = [e for e in timed.event_records() if e["kind"] == "step" and e["committed"]]
    assert len(steps) >= 2 * 19
    for e in steps[2:]:
        inside = e["t_zero_grad_s"] + e["t_forward_s"] + e["t_backward_s"] + e["t_optimizer_step_s"]
        # four consecutive slices of the span step_time_s measures (zero_grad includes making the batch)
        assert 0 < inside <= e["step_time_s"] + 1e-6
        assert e["t_allreduce_s"] <= e["t_backward_s"] + 1e-6
        assert e["t_commit_vote_s"] + e["t_inner_step_s"] <= e["t_optimizer_step_s"] + 1e-6
        assert e["t_workbench_s"] > 0
    assert not any(k.startswith("t_") and k != "t" for e in plain.event_records() if e["kind"] == "step" for k in e)
