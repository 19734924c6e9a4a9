"""The trainer table and the kit every trainer shares: the parts whose meaning other modules rely on."""

from __future__ import annotations

import importlib
import signal
import subprocess
import sys

import pytest

from workbench.trainers import REGISTRY, load, trainer_kind, trainer_names
from workbench.trainers.kit import CheckpointLayout, StopRequest, weights_checksum


def test_trainers_package_imports_without_torch():
    """The spec imports the table; validating a spec must not pay for (or need) torch."""
    out = subprocess.run(
        [sys.executable, "-c", "import sys, workbench.trainers; print('torch' in sys.modules)"],
        capture_output=True, text=True, check=True,
    )
    assert out.stdout.strip() == "False"


def test_every_trainer_names_a_module_with_run():
    for name in trainer_names():
        assert callable(importlib.import_module(REGISTRY[name]).run)
        assert load(name) is importlib.import_module(trainer_kind(name).module).run


@pytest.mark.parametrize("name", trainer_names())
def test_a_spec_with_spares_is_refused_for_a_trainer_without_them(name):
    """Hot spares exist for torchft-lite only; any other trainer's spec asking for one is refused
    with the trainer that has them named (the table's answer, as a user meets it)."""
    from workbench.spec import SpecError
    from workbench.spec_load import load_spec

    if name == "torchft-lite":
        assert load_spec("demo", {"trainer": name, "spares": 1}).spares == 1
    else:
        with pytest.raises(SpecError, match=r"spares \(1\): hot spares are implemented for trainer torchft-lite only"):
            load_spec("demo", {"trainer": name, "spares": 1})


def test_unknown_trainer_names_the_allowed_ones():
    with pytest.raises(KeyError) as err:
        trainer_kind("pytorch-lightning")
    assert str(err.value) == "trainer: 'pytorch-lightning'; allowed: torchft-lite, titan, maxtext, ddp-restart"


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

    from workbench.trainers.tiny_decoder import build_model

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
