"""The lighthouse is a single point of failure; the workbench supervises it.

Killed mid-run, it is restarted on the same address; the replicas' Managers
retry (``TORCHFT_QUORUM_RETRIES``) and reconnect; quorum ids stay unique
across the restart (trainers/quorum_epochs.py). A replica killed during the
outage comes back and heals, and the run ends with identical weights.
"""

import pytest

from workbench import analysis

pytestmark = pytest.mark.slow


def test_lighthouse_killed_mid_run_and_a_replica_killed_while_it_is_down(start_run):
    run = start_run("demo", {"faults": [], "replicas": 2, "min_replicas": 1, "steps": 900,
                             "lighthouse.restart_delay_s": 4.0})
    run.wait_for_step(150, timeout=240)
    run.fault("lighthouse_kill")
    run.wait_for(lambda r: any(e["kind"] == "lighthouse" and e["state"] == "down" for e in r._events), 10)
    run.kill(replica=1)
    status = run.wait(timeout=400)
    assert status["state"] == "completed", status
    events = run.event_records()
    ups = [e for e in events if e["kind"] == "lighthouse" and e["state"] == "up"]
    assert len(ups) == 2 and ups[0]["address"] == ups[1]["address"]
    # The survivor never crashed: one attempt, completed.
    exits0 = [e for e in events if e["kind"] == "exit" and e["replica"] == 0]
    assert [(e["attempt"], e["reason"]) for e in exits0] == [(0, "completed")]
    # The victim's replacement healed after the lighthouse came back, and the weights agree.
    heals = [e for e in events if e["kind"] == "heal" and e["replica"] == 1 and e["attempt"] >= 1]
    assert heals and heals[0]["t"] > ups[1]["t"]
    final = [e for e in events if e["kind"] == "exit" and e.get("reason") == "completed"]
    assert {e["replica"] for e in final} == {0, 1} and len({e["weights"] for e in final}) == 1
    # Quorum ids after the restart do not reuse the first lighthouse's ids.
    before = {e["quorum_id"] for e in events if e["kind"] == "quorum" and e["t"] < ups[1]["t"]}
    after = {e["quorum_id"] for e in events if e["kind"] == "quorum" and e["t"] > ups[1]["t"]}
    assert after and not (before & after)
    assert analysis.max_committed_step(events) == 900
