"""ft.algorithm: the spec's rules for the semi-synchronous algorithms, and one real kill-and-heal run each.

The runs are real: torchft's lighthouse, Manager, ``LocalSGD`` / ``DiLoCo`` on gloo, submitit's local
executor. Two groups sync every few inner steps; group 1 is SIGKILLed once both have committed a sync
together; the controller relaunches it, the new attempt joins the survivor at the survivor's next sync
(heals from it) and syncs with it again. Everything is asserted from the event log.
"""

from __future__ import annotations

import time

import pytest

import workbench as wb
from workbench.spec_load import load_spec


@pytest.mark.parametrize(
    "overrides, field, allowed",
    [
        (["ft.algorithm=gossip"], "ft.algorithm", "'ddp', 'localsgd', 'diloco' or 'streaming_diloco'"),
        (["ft.algorithm=ddp", "ft.sync_every=5"], "sync_every", "only for a semi-synchronous ft.algorithm"),
        (["ft.algorithm=streaming_diloco", "ft.fragments=3", "ft.sync_every=10"], "sync_every (10)",
         "must be a multiple of ft.fragments (3)"),
        (["ft.algorithm=streaming_diloco", "ft.fragments=1"], "fragments (1)", "at least 2 fragments"),
        (["ft.algorithm=diloco", "ft.fragments=2"], "fragments (2)", "only for ft.algorithm streaming_diloco"),
        (["ft.algorithm=localsgd", "ft.outer_lr=0.5"], "outer_lr", "only for ft.algorithm diloco or streaming_diloco"),
        (["ft.algorithm=localsgd", "ft.fragment_sync_delay=1"], "fragment_sync_delay",
         "only for ft.algorithm diloco or streaming_diloco"),
        (["ft.algorithm=streaming_diloco", "ft.fragments=2", "ft.sync_every=10", "ft.fragment_sync_delay=5"],
         "fragment_sync_delay (5)", "must be < sync_every / fragments (5)"),
        (["ft.algorithm=diloco", "ft.fragment_update_alpha=1.5"], "ft.fragment_update_alpha", "less than or equal to 1"),
        (["ft.algorithm=diloco", "torchft.use_async_quorum=true"], "torchft.use_async_quorum", "needs false"),
        (["trainer=ddp-restart", "ft.algorithm=diloco"], "ft.algorithm",
         "not implemented by trainer ddp-restart (allowed: ddp)"),
        (["ft.algorithm=streaming_diloco", "ft.fragments=5", "ft.sync_every=10"], "ft.fragments (5)",
         "<= model.layers + 2 (4)"),
        (["trainer=titan", "ft.algorithm=diloco", "ft.outer_momentum=0.5"], "ft.outer_momentum (0.5)",
         "trainer titan cannot set it"),
    ],
)
def test_bad_ft_section_is_refused_in_one_line_naming_the_field(overrides, field, allowed):
    with pytest.raises(wb.SpecError) as err:
        load_spec("algorithms", overrides)
    msg = str(err.value)
    assert field in msg and allowed in msg, msg
    assert "\n" not in msg.strip(), msg


def test_quantize_is_refused_where_torchft_cannot_quantize():
    """torchft quantizes with Triton on CUDA and silently falls back to a plain all-reduce elsewhere."""
    import importlib.util

    import torch

    overrides = ["ft.algorithm=diloco", "ft.quantize=true"]
    if torch.cuda.is_available() and importlib.util.find_spec("triton"):
        assert load_spec("algorithms", overrides).ft.quantize is True
    else:
        with pytest.raises(wb.SpecError, match=r"ft\.quantize: true needs CUDA and Triton .* allowed here: false"):
            load_spec("algorithms", overrides)


def test_semi_sync_defaults_follow_the_algorithm():
    """DiLoCo needs torchft's synchronous quorum, and a group at a sync must wait for a replacement that
    is starting (join_timeout_ms raised) unless the spec says otherwise."""
    d = load_spec("algorithms", ["ft.algorithm=diloco"])
    assert d.torchft.use_async_quorum is False and d.lighthouse.join_timeout_ms == 30_000
    s = load_spec("algorithms", ["ft.algorithm=localsgd", "lighthouse.join_timeout_ms=5000"])
    assert s.torchft.use_async_quorum is True and s.lighthouse.join_timeout_ms == 5000
    ok = load_spec("algorithms", ["ft.algorithm=streaming_diloco", "ft.fragments=2", "ft.sync_every=8",
                                  "ft.fragment_sync_delay=3", "ft.fragment_update_alpha=0.5"])
    assert (ok.ft.fragments, ok.ft.sync_every, ok.ft.fragment_sync_delay) == (2, 8, 3)


# --- one real kill-and-heal run per semi-synchronous algorithm --------------------------------------

ALGORITHM_RUNS = {
    "localsgd": ["ft.algorithm=localsgd", "ft.sync_every=5"],
    "diloco": ["ft.algorithm=diloco", "ft.sync_every=5"],
    "streaming_diloco": ["ft.algorithm=streaming_diloco", "ft.fragments=2", "ft.sync_every=6",
                         "ft.fragment_sync_delay=1"],
}


def _syncs(events, replica=None, attempt=None, after=None):
    return [e for e in events if e["kind"] == "sync" and (replica is None or e.get("replica") == replica)
            and (attempt is None or e.get("attempt") == attempt) and (after is None or e["t"] > after)]


def _shared_commit(run, replica, attempt, after):
    return any(s.get("committed") and s.get("participants") == 2 and s.get("bytes", 0) > 0
               for s in _syncs(run._events, replica, attempt, after))


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(ALGORITHM_RUNS))
def test_killed_group_comes_back_heals_and_syncs_again(start_run, algorithm):
    run = start_run("algorithms", [*ALGORITHM_RUNS[algorithm], "steps=100000", "faults=[]"])
    # Both groups have committed a sync together (the joins done, the schedule running).
    run.wait_for(lambda r: _shared_commit(r, 0, 0, None) and _shared_commit(r, 1, 0, None), timeout=120)
    kill = run.kill(replica=1)
    run.wait_for(lambda r: any(e["kind"] == "fault" and e.get("pid") == kill["pid"] for e in r._events), timeout=10)
    t_kill = next(e["t"] for e in run._events if e["kind"] == "fault" and e.get("pid") == kill["pid"])
    # The replacement (attempt 1) takes part in a committed sync of both groups after the kill.
    run.wait_for(lambda r: _shared_commit(r, 1, 1, t_kill) and _shared_commit(r, 0, 0, t_kill), timeout=120)
    t_stop = time.time()
    run.stop(timeout=20)
    events = run.event_records()

    # Syncs moved measured bytes, and sync events say which algorithm did them.
    shared = [s for s in _syncs(events) if s.get("participants") == 2 and s.get("committed")]
    assert shared and all(s["bytes"] > 0 for s in shared)
    assert {s["algorithm"] for s in _syncs(events)} == {algorithm}
    # The victim's new attempt joined at a sync and healed from the survivor.
    heals = [e for e in events if e["kind"] == "heal" and e.get("replica") == 1 and e.get("attempt") == 1]
    assert len(heals) == 1 and heals[0]["bytes"] > 0
    joins = [s for s in _syncs(events, 1, 1) if s.get("join")]
    assert len(joins) == 1 and joins[0]["t"] >= heals[0]["t"]
    # After the join both groups hold the same weights at each sync they commit together (the sync
    # decides the weights; DiLoCo's merge with fragment_update_alpha 0 keeps the global ones).
    victim = {s["sync_index"] - joins[0]["sync_index"]: s for s in _syncs(events, 1, 1)}
    survivor_after = [s for s in _syncs(events, 0, 0, t_kill) if s.get("committed")]
    by_step = {s["step"]: s for s in survivor_after if s.get("participants") == 2}
    matched = [(by_step[s["step"]], s) for s in victim.values()
               if s.get("committed") and s["step"] in by_step and s.get("fragment") == by_step[s["step"]].get("fragment")]
    assert matched, (victim, by_step)
    if algorithm != "streaming_diloco":  # a fragment sync leaves the other fragments local
        assert all(a["weights"] == b["weights"] for a, b in matched), matched
    # The survivor: one attempt, never exited, kept committing syncs after the kill, alone or not.
    assert not [e for e in events if e["kind"] == "exit" and e.get("replica") == 0 and e["t"] < t_stop]
    assert {e.get("attempt") for e in events if e["kind"] == "step" and e.get("replica") == 0} == {0}
    assert len(survivor_after) >= 2
    # Each committed sync after the kill advanced the survivor's sync count (nothing redone).
    counted = [s["step"] for s in survivor_after]
    assert all(b > a for a, b in zip(counted, counted[1:])), counted
