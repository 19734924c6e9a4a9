"""The short chaos soak (``make soak`` runs the long one): random kills, hangs and lighthouse
kills against one run, then every invariant checked from the run directory alone."""

import pytest

from workbench.soak import check_invariants, soak_spec

pytestmark = pytest.mark.slow


def test_short_soak_holds_every_invariant(start_run):
    run = start_run("demo", soak_spec(faults=12, mtbf_s=3.0, seed=6, cluster="local", steps=1100))
    actions = {f.action for f in run.spec.faults}
    assert {"kill", "hang", "lighthouse_kill"} <= actions, actions
    run.wait(timeout=900)
    result = check_invariants(run)
    assert result["faults"] == 12
    assert result["invariants_hold"], result
