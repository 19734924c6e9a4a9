"""Total loss (issue #41, item 5): every replica group of an elastic run killed at once.

No live peer holds the model state then; torchft's relaunched groups would meet at step 0 and train from
their initial weights. The run must resume from its newest durable state and say so (torchft-lite's
snapshots, ``torchft.snapshot_every``; TorchTitan's checkpoints), or name the loss and its step in its
status, summary and end (``on_state_loss``): ``workbench/controller/total_loss.py``.

Heavy: run under the shared lock, one at a time. Each group's process is SIGKILLed by the PID the fold
names, one right after the other, so neither relaunch finds the other alive.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.conftest import workbench_cli

LITE = {"replicas": 2, "min_replicas": 1, "faults": [], "steps": 160}


def kill_every_group(run) -> dict[int, int]:
    """SIGKILL each group's current process, by the PID the fold names; {replica: the last step its attempt 0
    committed, read back from its events once both jobs are seen ended (a step can commit between the fold's
    last read and the signal)}."""
    run.refresh()
    pids = {r: v.proc.pid for r, v in run.run_state.replicas.items()}
    for pid in pids.values():
        os.kill(pid, signal.SIGKILL)
    ended = lambda r: {(e["replica"], e["attempt"]) for e in r.events_read if e["kind"] == "job"} >= {(0, 0), (1, 0)}  # noqa: E731
    run.wait_for(ended, timeout=60)
    steps = [e for e in run.events_read if e["kind"] == "step" and e.get("attempt") == 0 and e.get("committed", True)]
    return {r: max((e["step"] for e in steps if e["replica"] == r), default=0) for r in pids}


def wait_until_both_committed(run, step: int, timeout: float = 180) -> None:
    for r in (0, 1):
        run.wait_for_step(step, replica=r, timeout=timeout)
    assert run.state() == "running", run.status()


def committed_steps(run, attempt_from: int = 0):
    df = run.events("step")
    df = df[df["committed"].fillna(True).astype(bool) & (df["attempt"] >= attempt_from)]
    return df.sort_values("t")


def joined_in_step(run, replica: int) -> bool:
    """Whether the relaunched group's DiLoCo join sync committed: then its window counts, and its first inner
    step is one window past the snapshot. Torchft can vote it down (a collective past the process group's
    timeout, 1 s here: seen once in a full ``make test`` under load), and then the window is not counted and
    DiLoCo restores the global weights it started the sync with, the snapshot's."""
    (join,) = [
        e
        for e in run.events_read
        if e["kind"] == "sync" and e.get("join") and e["replica"] == replica and e["attempt"] >= 1
    ]
    return bool(join["committed"])


def the_loss(run) -> dict:
    run.wait_for(lambda r: any(e["kind"] == "state_lost" for e in r.events_read), timeout=60)
    (lost,) = [e for e in run.events_read if e["kind"] == "state_lost"]
    return lost


@pytest.mark.parametrize("config", ["demo", "algorithms"])
def test_lite_snapshots_resume_every_group_killed_at_once(start_run, config):
    """With snapshots on, the relaunched groups load the newest one: the steps go on from it, the loss near
    its value before the kill (not the untrained loss), and the run says it resumed, from which step.
    ``algorithms``: DiLoCo, syncing every 10 inner steps; a snapshot is taken at a committed sync, and the
    relaunched groups' join sync (``trainers/lite/semi_sync.py``) is one more window of the schedule when it
    commits."""
    run = start_run(config, {**LITE, "torchft.snapshot_every": 10 if config == "demo" else 20})
    wait_until_both_committed(run, 45 if config == "demo" else 55)
    reached = kill_every_group(run)
    lost = the_loss(run)
    before = committed_steps(run)
    end = run.wait(timeout=240)
    assert end["state"] == "completed", run.status()
    durable = [e["step"] for e in run.events_read if e["kind"] == "checkpoint" and e["durable"] and e["t"] < lost["t"]]
    assert lost["action"] == "resume" and lost["source"] == "snapshot", lost
    assert lost["resumed_from"] == max(durable) and lost["resumed_from"] % 10 == 0, (lost, durable)
    assert lost["step"] == max(reached.values()), (lost, reached)
    every = 10 if config == "demo" else 20
    restored = {
        e["replica"]: e["from_step"] for e in run.events_read if e["kind"] == "phase" and e["phase"] == "restored"
    }
    (resumed_from,) = set(restored.values())
    # the newest snapshot the log recorded, or the next, renamed into place before its event could be written
    assert resumed_from in (lost["resumed_from"], lost["resumed_from"] + every), (resumed_from, lost)
    assert resumed_from <= lost["step"] + 1, (resumed_from, lost)

    after = committed_steps(run, attempt_from=1)
    healed = {e["replica"] for e in run.events_read if e["kind"] == "heal" and e["attempt"] >= 1}
    assert set(restored) | healed == {0, 1}, (
        restored,
        healed,
    )  # each resumed from the snapshot, or healed from one that did
    for replica in restored:
        steps = after[after["replica"] == replica]
        window = 0 if config == "demo" else 10 * joined_in_step(run, replica)
        assert steps["step"].iloc[0] == resumed_from + window + 1, steps[["replica", "attempt", "step"]].head()
    first = before[before["attempt"] == 0]
    untrained = first["loss"].iloc[0]
    pre_kill = first[first["step"] <= resumed_from]["loss"].tail(5).mean()
    resumed = after["loss"].head(5).mean()
    print(f"\nloss: untrained {untrained:.2f}, before the kill {pre_kill:.2f}, after resuming {resumed:.2f}")
    assert abs(resumed - pre_kill) < abs(resumed - untrained) / 3, (untrained, pre_kill, resumed)

    st = run.status()
    assert st["reason"].startswith("state_lost") and f"at step {lost['step']}" in st["reason"], st["reason"]
    assert f"snapshot of step {resumed_from}" in st["reason"], st["reason"]
    summary = run.summary()["state_lost"]
    assert (summary["action"], summary["step"], summary["resumed_from"]) == ("resume", lost["step"], resumed_from)


@pytest.mark.parametrize("on_state_loss", ["fail", "restart"])
def test_lite_without_snapshots_names_the_loss(start_run, on_state_loss):
    """No durable state: ``fail`` ends the run failed at once; ``restart`` goes on from scratch. Either way the
    end, ``workbench status`` and the summary name the loss of the model state and its step."""
    overrides = {**LITE, "steps": 80} if on_state_loss == "restart" else LITE
    run = start_run("demo", {**overrides, "on_state_loss": on_state_loss} if on_state_loss != "fail" else overrides)
    wait_until_both_committed(run, 20)
    reached = kill_every_group(run)
    lost = the_loss(run)
    end = run.wait(timeout=240)
    assert lost["action"] == on_state_loss and lost["step"] == max(reached.values()), (lost, reached)
    assert run.run_state.run_end["reason"] == "state_lost", run.run_state.run_end
    assert end["reason"].startswith(f"state_lost: model state lost at step {lost['step']}"), end["reason"]
    after = committed_steps(run, attempt_from=1)
    if on_state_loss == "fail":
        assert end["state"] == "failed", end
        assert after.empty, after[["replica", "attempt", "step"]]
    else:
        assert end["state"] == "completed", end
        assert after["step"].iloc[0] == 1, after[["replica", "attempt", "step"]].head()
    words = f"model state lost at step {lost['step']}"
    cli = workbench_cli("status", str(run.run_dir))
    assert cli.returncode == 0 and words in cli.stdout, cli.stdout + cli.stderr
    summary = run.summary()
    assert summary["state_lost"]["step"] == lost["step"] and summary["state_lost"]["action"] == on_state_loss
    cli = workbench_cli("summary", str(run.run_dir))
    assert words in cli.stdout, cli.stdout + cli.stderr


def test_titan_every_group_killed_at_once_resumes_from_its_checkpoint(start_run):
    """TorchTitan + torchft: each group loads torchtitan's newest checkpoint as it starts, and its Manager
    starts at that step: with no live peer the run goes on from the checkpoint, and says so."""
    pytest.importorskip("torchtitan")
    overrides = {"training.seq_len": 128, "checkpoint.interval": 4}
    run = start_run("titan-cpu", {"steps": 16, "faults": [], "titan.overrides": overrides})
    wait_until_both_committed(run, 6, timeout=400)
    reached = kill_every_group(run)
    lost = the_loss(run)
    end = run.wait(timeout=480)
    assert end["state"] == "completed", run.status()
    durable = [e["step"] for e in run.events_read if e["kind"] == "checkpoint" and e["durable"] and e["t"] < lost["t"]]
    assert lost["action"] == "resume" and lost["source"] == "checkpoint", lost
    assert lost["resumed_from"] == max(durable) and lost["step"] == max(reached.values()), (lost, durable, reached)
    (resumed_from,) = {e["from_step"] for e in run.events_read if e["kind"] == "phase" and e["phase"] == "restored"}
    # the newest checkpoint the log recorded, or the next, committed before its event could be written
    assert resumed_from in (lost["resumed_from"], lost["resumed_from"] + 4), (resumed_from, lost)
    after = committed_steps(run, attempt_from=1)
    assert after["step"].iloc[0] == resumed_from + 1, after[["replica", "attempt", "step"]].head()
    st = run.status()
    assert f"at step {lost['step']}" in st["reason"] and f"checkpoint of step {resumed_from}" in st["reason"]


def _watch(tmp_path):
    from workbench.controller.total_loss import TotalLossWatch
    from workbench.events.writer import EventWriter
    from workbench.spec.load import load_spec
    from workbench.state.fold import RunState

    spec = load_spec("demo", {"replicas": 2, "faults": []})
    watch = TotalLossWatch(spec, [0, 1], RunState(2), EventWriter(tmp_path, "controller", run="x"))
    for r in (0, 1):
        watch.launched(r, 0)
        for step in range(1, 31):
            watch.observe({"kind": "step", "replica": r, "attempt": 0, "step": step, "participants": 2})
    return watch


def test_a_relaunch_that_trained_alone_holds_nothing_one_that_healed_holds_the_state(tmp_path):
    """The holder rules of ``controller/total_loss.py``, on the events the controller folds: group 0's
    relaunch commits a step alone before group 1's death is seen (it trained from scratch: no heal, no
    holder beside it), so group 1's end is the loss; a relaunch that healed keeps the state alive."""
    watch = _watch(tmp_path)
    assert watch.ended(0, None, [], stopping=False) is False and not watch.lost  # group 1 holds it
    watch.launched(0, 1)
    watch.observe({"kind": "step", "replica": 0, "attempt": 1, "step": 1, "participants": 1})
    assert watch.ended(1, None, [], stopping=False) is True  # on_state_loss: fail
    assert [(e["step"], e["action"]) for e in watch.lost] == [(30, "fail")]

    watch = _watch(tmp_path / "healed")
    watch.ended(0, None, [], stopping=False)
    watch.launched(0, 1)
    watch.observe({"kind": "heal", "replica": 0, "attempt": 1, "step": 30})
    assert watch.ended(1, None, [], stopping=False) is False and not watch.lost
