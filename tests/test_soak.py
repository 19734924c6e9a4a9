"""The short chaos soak (``make soak`` runs the long one): random kills, hangs and lighthouse
kills against one run, then every invariant checked from the run directory alone."""

import pytest

from workbench.soak import check_invariants, soak_spec

pytestmark = pytest.mark.slow


def test_short_soak_holds_every_invariant(start_run):
    run = start_run("demo", soak_spec(faults=12, mtbf_s=5.0, seed=6, cluster="local", steps=1500))
    actions = {f.action for f in run.spec.faults}
    assert {"kill", "hang", "lighthouse_kill"} <= actions, actions
    run.wait(timeout=900)
    result = check_invariants(run)
    assert result["faults"] == 12
    broken = {k: v for k, v in result.items() if k in (
        "state", "survivor_crashes", "duplicate_committed_steps", "steps_going_back", "final_weights_distinct",
        "restores_of_non_durable_checkpoints", "timeline_incomplete")}
    assert result["invariants_hold"], broken
