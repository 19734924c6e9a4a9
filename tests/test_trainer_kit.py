"""The trainer table and the kit every trainer shares: the parts whose meaning other modules rely on."""

from __future__ import annotations

import importlib
import signal
import subprocess
import sys

import pytest

from workbench.trainers import REGISTRY, load, trainer_kind, trainer_names
from workbench.trainers.kit import CheckpointLayout, StopRequest, hold_stop_signals, weights_checksum


def test_trainers_package_imports_without_torch():
    """The spec imports the table; validating a spec must not pay for (or need) torch."""
    out = subprocess.run(
        [sys.executable, "-c", "import sys, workbench.trainers; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"


def test_every_trainer_names_a_module_with_run():
    for name in trainer_names():
        assert callable(importlib.import_module(REGISTRY[name]).run)
        assert load(name) is importlib.import_module(trainer_kind(name).module).run


@pytest.mark.parametrize("name", trainer_names())
def test_a_spec_with_spares_is_refused_for_a_trainer_without_them(name):
    """Hot spares exist for torchft-lite, titan and maxtext only; any other trainer's spec asking for one is
    refused with the trainers that have them named (the table's answer, as a user meets it)."""
    from workbench.errors import SpecError
    from workbench.spec.load import load_spec

    if name in ("torchft-lite", "titan", "maxtext"):
        assert load_spec("demo", {"trainer": name, "spares": 1}).spares == 1
    else:
        with pytest.raises(
            SpecError, match=r"spares \(1\): hot spares are implemented for trainer torchft-lite, titan, maxtext only"
        ):
            load_spec("demo", {"trainer": name, "spares": 1})


def test_unknown_trainer_names_the_allowed_ones():
    with pytest.raises(KeyError) as err:
        trainer_kind("pytorch-lightning")
    assert (
        str(err.value)
        == "trainer: 'pytorch-lightning'; allowed: torchft-lite, titan, maxtext, ddp-restart, titan-restart"
    )


def test_only_committed_checkpoint_names_are_durable(tmp_path):
    import torch

    from workbench.trainers.ddp_restart import CHECKPOINTS, save_checkpoint

    for step in (10, 20, 30):
        save_checkpoint(tmp_path, step, {"w": torch.ones(2) * step}, keep=2)
    (tmp_path / ".step-00000040.pt.tmp").write_bytes(b"half")
    durable = CHECKPOINTS.durable(tmp_path)
    assert sorted(durable) == [20, 30]
    assert torch.load(durable[30], weights_only=True)["w"].tolist() == [30.0, 30.0]
    assert CHECKPOINTS.leftovers(tmp_path) == [".step-00000040.pt.tmp"]
    assert CheckpointLayout(CHECKPOINTS.committed, CHECKPOINTS.in_progress).durable(tmp_path / "absent") == {}


def test_weights_checksum_tells_weights_apart_not_copies():
    import torch

    from workbench.trainers.lite.model import build_model

    m = {"vocab_size": 16, "dim": 8, "seq_len": 4, "heads": 2, "layers": 1}
    torch.manual_seed(0)
    a = build_model(m)
    torch.manual_seed(0)
    b = build_model(m)
    assert weights_checksum(a.state_dict()) == weights_checksum(b.state_dict())
    with torch.no_grad():
        b.head.bias[0] += 1e-6
    assert weights_checksum(a.state_dict()) != weights_checksum(b.state_dict())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR2])
def test_a_stop_signal_is_a_preemption_the_loop_sees(sig):
    before = signal.getsignal(sig)
    stop = StopRequest()
    try:
        assert stop.reason is None
        signal.raise_signal(sig)
        assert stop.reason == "preempted"
    finally:
        stop.restore()
    assert signal.getsignal(sig) is before


def test_a_stop_signal_sent_while_a_child_starts_reaches_its_handler():
    """A child started with the stop signals held (how titan starts its ranks) is not killed by a
    SIGTERM that comes before its interpreter has a handler: it sees it once it has one."""
    code = (
        "from workbench.trainers.kit import StopRequest, release_stop_signals\n"
        "stop = StopRequest()\nrelease_stop_signals()\nprint(stop.reason)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, preexec_fn=hold_stop_signals
    )
    child.send_signal(signal.SIGTERM)  # the child has exec'd, its handler is far off
    out, _ = child.communicate(timeout=60)
    assert (child.returncode, out.strip()) == (0, "preempted")


@pytest.mark.parametrize("signalled", [(1, 2), (1,)], ids=["ranks 1 and 2", "rank 1 alone"])
def test_a_group_stops_at_one_step_boundary_whichever_rank_saw_the_signal_first(signalled):
    """Three ranks, a barrier at each step's end (torchft's should_commit), a real TCPStore: ranks
    ``signalled`` get the signal at step 2, rank 0 only at step 5 (or never) and after the others have
    passed that boundary. Every rank stops at the same boundary (none is left waiting in the barrier),
    the one after rank 0 saw the ask: 3 or 4, never 6."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import torch.distributed as dist

    from workbench.trainers.torchft.group_stop import GroupStop

    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    world = 3
    requests = [StopRequest() for _ in range(world)]
    step_end = threading.Barrier(world)

    def rank(r: int):
        group = GroupStop(
            requests[r],
            r,
            world,
            store=lambda: dist.TCPStore("127.0.0.1", master.port, is_master=False, wait_for_workers=False),
        )
        for boundary in range(50):
            if r == 0 and boundary == 5 and len(signalled) == 2:
                requests[0].reason = "preempted"
            if r in signalled and boundary == 2:
                requests[r].reason = "preempted"
            stop = group.at_boundary()
            if stop:
                return boundary, group.reason
            step_end.wait(timeout=30)
        return None

    try:
        with ThreadPoolExecutor(world) as pool:
            stopped = [f.result() for f in [pool.submit(rank, r) for r in range(world)]]
    finally:
        for request in reversed(requests):
            request.restore()
    assert len(set(stopped)) == 1 and stopped[0] in [(3, "preempted"), (4, "preempted")], stopped

    alone = StopRequest()
    try:
        group = GroupStop(alone, 0, 1)
        assert not group.at_boundary()
        alone.reason = "preempted"
        assert group.at_boundary(), "a group of one stops at the first boundary after its signal"
    finally:
        alone.restore()


class OneWaySetStore:
    """Test double of TCPStore's ordering, made deterministic: ``set`` is one-way (no reply), so the
    server may apply it as late as just before it answers that client's next request. This double
    takes that latest schedule every time: a client's sets stay pending until the same client asks
    something (``check``/``get``). The real TCPStore took it once in CI, under load."""

    def __init__(self, shared: dict) -> None:
        self.shared, self.pending = shared, []

    def set(self, key, value):
        self.pending.append((key, value))

    def _served(self):
        self.shared.update(self.pending)
        self.pending.clear()

    def check(self, keys):
        self._served()
        return all(k in self.shared for k in keys)

    def get(self, key):
        self._served()
        return self.shared[key].encode()


@pytest.mark.parametrize("signalled", [0, 1], ids=["rank 0", "rank 1"])
def test_a_group_stops_together_even_when_the_store_applies_a_set_as_late_as_it_may(signalled):
    """Three ranks in lockstep (each boundary a barrier), one of them signalled at boundary 2, over a store
    that applies each set as late as TCPStore's one-way ``set`` allows: all three stop at one boundary,
    the one after rank 0 decided."""
    from workbench.trainers.torchft.group_stop import GroupStop

    shared: dict = {}
    requests = [StopRequest() for _ in range(3)]
    try:
        groups = [GroupStop(requests[r], r, 3, store=lambda: OneWaySetStore(shared)) for r in range(3)]
        stopped: dict = {}
        for boundary in range(10):
            if boundary == 2:
                requests[signalled].reason = "preempted"
            for r, group in enumerate(groups):
                if r not in stopped and group.at_boundary():
                    stopped[r] = boundary
            if stopped:
                break
    finally:
        for request in reversed(requests):
            request.restore()
    # Rank 0 decides at boundary 2 for itself (stop at 3); rank 1's ask reaches it at boundary 3 (stop at 4).
    boundary = 3 if signalled == 0 else 4
    assert stopped == {0: boundary, 1: boundary, 2: boundary}, stopped
