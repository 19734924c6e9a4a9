"""torchft's structured logs routed into the event log, from a real torchft-lite run.

Two groups, a kill of group 1 at step 50 and its relaunch: torchft's
``torchft_commits`` records are ``commit`` events, one per ``should_commit``
vote, and every committed ``step`` event has the vote it came from (none
lost); the quorums each step names are ``quorum`` records of that process.
"""

from collections import Counter

import pytest

from workbench.events.reader import read_all
from workbench.events.writer import EventWriter
from workbench.trainers.torchft.logs import TorchftLogHandler

pytestmark = pytest.mark.slow


def test_commit_and_quorum_records_cover_every_step(start_run):
    run = start_run(
        "demo", ["steps=500", "replicas=2", "min_replicas=1", "faults=[{action: kill, target: 1, at_step: 50}]"]
    )
    assert run.wait(timeout=240)["state"] == "completed"
    events = run.event_records()
    steps = [e for e in events if e["kind"] == "step"]
    commits = [e for e in events if e["kind"] == "commit"]
    quorums = [e for e in events if e["kind"] == "quorum"]
    assert any(e["kind"] == "fault" for e in events) and {e["attempt"] for e in steps if e["replica"] == 1} == {0, 1}
    for c in commits + quorums:
        assert c["replica_id"].startswith(f"replica_{c['replica']}") and c["rank"] == 0 and "torchft_job_id" in c
    by_proc = lambda evs: Counter((e["replica"], e["attempt"]) for e in evs)
    killed = (1, 0)
    for proc, n in by_proc(steps).items():
        extra = by_proc(commits)[proc] - n
        # One vote per iteration; the killed attempt may have voted on the step it died in.
        assert extra == 0 or (proc == killed and extra == 1), (proc, n, extra)
    voted = {(e["replica"], e["attempt"], e["step"] + 1, e["quorum_id"]) for e in commits if e["commit_result"]}
    committed = [e for e in steps if e["committed"]]
    assert len(committed) >= 500 + 50
    lost = [e for e in committed if (e["replica"], e["attempt"], e["step"], e["quorum_id"]) not in voted]
    assert not lost, lost[:3]
    # A vote with no step event: only the killed attempt's, on the step it died in.
    orphans = voted - {(e["replica"], e["attempt"], e["step"], e["quorum_id"]) for e in committed}
    assert len(orphans) <= 1 and all(o[:2] == killed for o in orphans), orphans
    named = {(e["replica"], e["attempt"], e["quorum_id"]) for e in quorums}
    assert {(e["replica"], e["attempt"], e["quorum_id"]) for e in steps} <= named
    # The replacement's heal step: its vote carries the healed step, its step event the one after.
    heal = next(e for e in events if e["kind"] == "heal" and (e["replica"], e["attempt"]) == (1, 1))
    first = min((e for e in committed if (e["replica"], e["attempt"]) == (1, 1)), key=lambda e: e["t"])
    assert first["step"] == heal["step"] + 1


def test_an_aborted_process_group_is_a_torchft_error_event(tmp_path):
    from torchft.process_group import ProcessGroupGloo

    writer = EventWriter(tmp_path, "replica-0.attempt-0", run="r", replica=0)
    handler = TorchftLogHandler(writer).install()
    try:
        ProcessGroupGloo().abort()  # errored=True: torchft logs it on torchft_errors
    finally:
        handler.uninstall()
    (event,) = read_all(tmp_path)
    assert event["kind"] == "torchft_error" and event["error"] == "process_group_abort" and event["replica"] == 0
