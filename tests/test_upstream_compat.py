"""The upstream versions the trainers are pinned to, and every private name they reach there.

The trainers reach private names of torch, torchft and torchtitan only through
``workbench/trainers/compat/`` (one module per library). This test (a) names
the pinned versions, checks that ``pyproject.toml`` and
``requirements-titan.txt`` still pin them and that they are the ones
installed, and (b) checks, for each compat function, that the private it
relies on exists on the installed version with the shape it uses: the
attribute on a real object, the signature where the call depends on it, the
upstream code path that reads it (so a rename upstream is caught even where
the workbench's patch would silently stop taking effect), and where cheap the
function itself on real objects. After an upgrade, a failure here names the
private; the compat function's docstring says what the workbench needs from it.

torchft's and torchtitan's checks run in a fresh interpreter each: they build a
real Manager (whose threads stay) and patch upstream modules.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

TORCH_PIN = "torch>=2.13,<2.15"  # pyproject.toml: loose on purpose (the build for the hardware is installed first)
TORCH_RANGE = ((2, 13), (2, 15))
TORCHFT_PIN = "torchft-nightly==2026.10.26"  # pyproject.toml
TORCHTITAN_PIN = "torchtitan==0.3.0"  # requirements-titan.txt


def pinned_version(pin: str) -> str:
    return pin.split("==", 1)[1]


def test_the_pins_are_the_ones_named_here():
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert TORCH_PIN in dependencies, dependencies
    assert TORCHFT_PIN in dependencies, dependencies
    requirements = [line.split("#")[0].strip() for line in (REPO / "requirements-titan.txt").read_text().splitlines()]
    assert TORCHTITAN_PIN in requirements, requirements


def test_the_installed_versions_are_the_pinned_ones():
    torch_version = importlib.metadata.version("torch")
    major_minor = tuple(int(p) for p in torch_version.split("+")[0].split(".")[:2])
    low, high = TORCH_RANGE
    assert low <= major_minor < high, f"torch {torch_version} is outside {TORCH_PIN}"
    assert importlib.metadata.version("torchft-nightly") == pinned_version(TORCHFT_PIN)


@pytest.mark.titan
def test_the_installed_torchtitan_is_the_pinned_one():
    pytest.importorskip("torchtitan")
    assert importlib.metadata.version("torchtitan") == pinned_version(TORCHTITAN_PIN)


def test_torch_privates():
    import inspect

    import torch
    from torch.distributed import distributed_c10d

    from workbench.trainers.compat import torch_compat

    # set_pg_timeout (its effect on a gloo group: tests/test_titan.py, test_barrier_device_ids_and_set_timeout)
    assert list(inspect.signature(distributed_c10d._set_pg_timeout).parameters) == ["timeout", "group"]
    # non_persistent_buffers
    module = torch.nn.Module()
    module.register_buffer("kept", torch.zeros(1))
    module.register_buffer("dropped", torch.zeros(1), persistent=False)
    assert torch_compat.non_persistent_buffers(module) == {"dropped"}
    assert set(module.state_dict()) == {"kept"}


CHECKS_PRELUDE = r"""
import inspect, json, os, sys

failures = {}


def check(name):
    def run(fn):
        try:
            fn()
        except Exception as e:
            failures[name] = f"{type(e).__name__}: {e}"
    return run


def params(fn):
    return list(inspect.signature(fn).parameters)


def uses(fn, text):
    assert text in inspect.getsource(fn), f"{fn.__qualname__} no longer contains {text!r}"


def done():
    print("FAILURES " + json.dumps(failures), flush=True)
    os._exit(0)  # torchft's threads would hold the interpreter open
"""

TORCHFT_CHECKS = r"""
import io
from datetime import timedelta
from http.server import ThreadingHTTPServer

import torch
import torchft._torchft
import torchft.manager
from torchft import DistributedDataParallel, Manager
from torchft._torchft import LighthouseServer, ManagerClient
from torchft.checkpointing import _serialization, http_transport
from torchft.checkpointing.http_transport import HTTPTransport
from torchft.checkpointing.pg_transport import PGTransport
from torchft.local_sgd import DiLoCo, LocalSGD
from torchft.process_group import ProcessGroup, ProcessGroupWrapper

from workbench.trainers import loopback
from workbench.trainers.compat import torchft_compat as c

torch.set_num_threads(1)

# -- upstream as installed, before loopback patches it -------------------------


@check("torchft.manager.ManagerServer (manager_server_factory, set_manager_server_factory)")
def _():
    assert c.manager_server_factory() is torchft._torchft.ManagerServer
    uses(Manager.__init__, "ManagerServer(")
    uses(Manager.__init__, 'f"[::]:{port}"')  # the bind address loopback.py rewrites


@check("torchft.manager.future_timeout (replace_future_timeout)")
def _():
    assert params(torchft.manager.future_timeout) == ["fut", "timeout"]
    uses(Manager.wrap_future, "future_timeout(")


@check("Manager._async_quorum (wrap_async_quorum)")
def _():
    assert params(Manager._async_quorum) == ["self", "allow_heal", "shrink_only", "quorum_timeout", "curr_device"]
    uses(Manager.start_quorum, "self._async_quorum")


@check("Manager._apply_pending_state_dict, Manager._healing (apply_pending_heal, is_healing)")
def _():
    assert params(Manager._apply_pending_state_dict) == ["self"]
    uses(Manager.start_quorum, "self._apply_pending_state_dict()")
    uses(Manager.start_quorum, "self._healing = False")


@check("Manager._manager_state_dict (manager_state_dict)")
def _():
    assert params(Manager._manager_state_dict) == ["self"]


@check("ManagerClient._quorum, ManagerClient.should_commit (replace_client, map_quorum_results)")
def _():
    assert callable(ManagerClient._quorum) and callable(ManagerClient.should_commit)
    uses(Manager._async_quorum, "self._client._quorum(")
    uses(Manager.should_commit, "self._client.should_commit(")


@check("http_transport._IPv6HTTPServer (replace_checkpoint_http_server)")
def _():
    assert issubclass(http_transport._IPv6HTTPServer, ThreadingHTTPServer)
    uses(HTTPTransport.__init__, "self._server = _IPv6HTTPServer(")


@check("HTTPTransport._load_from_address (http_transport_with_fetch)")
def _():
    assert isinstance(inspect.getattr_static(HTTPTransport, "_load_from_address"), classmethod)
    assert params(HTTPTransport._load_from_address) == ["address", "timeout"]
    uses(HTTPTransport.recv_checkpoint, "self._load_from_address")


@check("checkpointing._serialization._streaming_load (streaming_load)")
def _():
    # torch's streaming loader, not torchft's slow fallback
    assert _serialization._streaming_load.__module__ == "torch.distributed._serialization"
    buf = io.BytesIO()
    _serialization._streaming_save({"w": torch.arange(3), "lr": 0.5}, buf)
    buf.seek(0)
    out = c.streaming_load(buf, weights_only=False)
    assert torch.equal(out["w"], torch.arange(3)) and out["lr"] == 0.5


@check("PGTransport._pg (pg_transport_process_group)")
def _():
    uses(PGTransport.recv_checkpoint, "self._pg.recv(")


@check("DistributedDataParallel._comm_hook (comm_hook, ddp_with_comm_hook)")
def _():
    assert isinstance(inspect.getattr_static(DistributedDataParallel, "_comm_hook"), staticmethod)
    assert params(c.comm_hook(DistributedDataParallel)) == ["state", "bucket"]
    uses(DistributedDataParallel.__init__, "self._comm_hook")


@check("ProcessGroup._rendezvous_store, _handle_id, _global_rank (reconfigure_handle)")
def _():
    uses(ProcessGroup.get_reconfigure_handle, "self._rendezvous_store")
    uses(ProcessGroup.get_reconfigure_handle, "self._handle_id()")
    uses(ProcessGroup.get_reconfigure_handle, "self._global_rank")


@check("ProcessGroupWrapper._pg (wrapped_process_group)")
def _():
    uses(ProcessGroupWrapper.abort, "self._pg = None")


@check("DiLoCo._current_fragment (diloco_current_fragment)")
def _():
    assert params(DiLoCo._current_fragment) == ["self"]


# -- on a real one-rank Manager, its process group and transports ----------------

loopback.install("127.0.0.1")
lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=100)
store = loopback.loopback_store()
pg = loopback.loopback_process_group_gloo()(timeout=timedelta(seconds=10))
manager = Manager(
    pg=pg, min_replica_size=1, load_state_dict=lambda sd: None, state_dict=lambda: {"upstream": True},
    replica_id="replica_0", store_addr="127.0.0.1", store_port=store.port, hostname="127.0.0.1",
    rank=0, world_size=1, lighthouse_addr=lighthouse.address(), timeout=timedelta(seconds=20),
    use_async_quorum=False,
)


@check("Manager._client (replace_client)")
def _():
    seen = []
    c.replace_client(manager, lambda client: seen.append(client) or client)
    assert isinstance(seen[0], ManagerClient), seen


@check("Manager._quorum_id, Manager._healing (quorum_id, is_healing)")
def _():
    assert c.quorum_id(manager) == -1
    assert c.is_healing(manager) is False


@check("Manager._checkpoint_transport, HTTPTransport._server (checkpoint_transport, http_transport_port)")
def _():
    transport = c.checkpoint_transport(manager)
    assert isinstance(transport, HTTPTransport), transport
    assert c.http_transport_port(transport) > 0


@check("Manager._user_state_dicts, Manager._load_state_dict_fns (state_dict_keys, replace_state_dict_fn)")
def _():
    keys = c.state_dict_keys(manager)
    assert keys == ["default"], keys
    load = lambda sd: None  # noqa: E731
    c.replace_state_dict_fn(manager, "default", load, lambda: {"replaced": True})
    assert manager._load_state_dict_fns["default"] is load
    assert c.manager_state_dict(manager)["user"] == {"default": {"replaced": True}}


@check("Manager._pg, Manager._logger (manager_process_group, manager_logger)")
def _():
    assert c.manager_process_group(manager) is pg
    assert callable(c.manager_logger(manager).exception)


@check("ProcessGroupWrapper._pg instance attribute (wrapped_process_group)")
def _():
    assert "_pg" in vars(pg)  # the accessor's default would hide a rename
    assert c.wrapped_process_group(pg) is None  # not configured yet


@check("a quorum through the wrapped client and quorum thread (map_quorum_results, wrap_async_quorum)")
def _():
    calls = []

    def counted(quorum):
        def run(*args, **kwargs):
            calls.append(1)
            return quorum(*args, **kwargs)

        return run

    def renumber(result):
        result.quorum_id = 1_000_000 + result.quorum_id
        return result

    c.wrap_async_quorum(manager, counted)
    c.map_quorum_results(manager, renumber)
    manager.start_quorum()
    manager.wait_quorum()
    assert calls == [1], calls
    assert c.quorum_id(manager) > 1_000_000, c.quorum_id(manager)
    assert c.is_healing(manager) is False
    assert c.wrapped_process_group(pg) is not None  # configured for the quorum


@check("ProcessGroup.get_reconfigure_handle's format (reconfigure_handle)")
def _():
    upstream = json.loads(ProcessGroupWrapper.get_reconfigure_handle(pg))  # reuses the store made on loopback
    ours = json.loads(c.reconfigure_handle(pg, "127.0.0.1", loopback.loopback_store))
    assert ours.keys() == upstream.keys(), (ours, upstream)
    assert (ours["id"], ours["global_rank"]) == (upstream["id"], upstream["global_rank"])
    assert ours["store"].rsplit(":", 1)[1] == upstream["store"].rsplit(":", 1)[1]


@check("PGTransport._pg instance attribute (pg_transport_process_group)")
def _():
    transport = PGTransport(pg, timedelta(seconds=5), torch.device("cpu"))
    stand_in = object()
    with c.pg_transport_process_group(transport, stand_in):
        assert transport._pg is stand_in
    assert transport._pg is pg


@check("DistributedDataParallel registers the hook named _comm_hook (ddp_with_comm_hook)")
def _():
    seen = []

    def hook(state, bucket):
        seen.append(state)
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    ddp = c.ddp_with_comm_hook(DistributedDataParallel, hook, "ProbeDDP")(manager, torch.nn.Linear(4, 4))
    ddp(torch.randn(2, 4)).sum().backward()
    assert seen and seen[0] is manager, seen


@check("LocalSGD._local_step, _sync_every (local_step, set_local_step, sync_every)")
def _():
    model = torch.nn.Linear(4, 4)
    local_sgd = LocalSGD(manager, model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=4)
    assert (c.local_step(local_sgd), c.sync_every(local_sgd)) == (0, 4)
    c.set_local_step(local_sgd, 3)
    assert local_sgd._local_step == 3


@check("DiLoCo._fragments, _sync_every, _fragment_sync_delay, _local_step (diloco_fragments, ...)")
def _():
    parts = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)]
    inner = torch.optim.SGD([p for m in parts for p in m.parameters()], lr=0.1)
    outer = [torch.optim.SGD(m.parameters(), lr=0.7) for m in parts]
    diloco = DiLoCo(manager, parts, inner, outer, sync_every=4, fragment_sync_delay=1)
    assert len(c.diloco_fragments(diloco)) == 2
    assert (c.sync_every(diloco), c.fragment_sync_delay(diloco), c.local_step(diloco)) == (2, 1, 0)
    assert c.diloco_current_fragment(diloco) in (0, 1)


manager.shutdown(wait=False)
lighthouse.shutdown()
done()
"""

TORCHTITAN_CHECKS = r"""
from workbench.trainers.titan import cpu_patches as titan_cpu

if titan_cpu.needed():  # what importing torchtitan needs on CPU, and no more
    titan_cpu.no_module_named_triton()
    titan_cpu.device_forced_to_cuda()

from torchtitan.components.checkpointer.base import BaseCheckpointManager
from torchtitan.components.checkpointer.dcp import CheckpointManager
from torchtitan.models.common import attention

from workbench.trainers.compat import torchtitan_compat as c


@check("attention._compiled_create_block_mask (set_block_mask_builder)")
def _():
    assert callable(attention._compiled_create_block_mask)
    uses(attention.create_attention_mask, "_compiled_create_block_mask(")
    c.set_block_mask_builder(lambda *args, **kwargs: ("built", args, kwargs))
    assert attention.create_attention_mask(1, x=2) == ("built", (1,), {"x": 2})


@check("CheckpointManager._create_checkpoint_id (checkpoint_path)")
def _():
    assert params(CheckpointManager._create_checkpoint_id) == ["self", "step", "folder"]
    checkpointer = CheckpointManager.__new__(CheckpointManager)
    checkpointer.folder = "ckpt"
    assert c.checkpoint_path(checkpointer, 5) == "ckpt/step-5", c.checkpoint_path(checkpointer, 5)


@check("CheckpointManager._should_save (save_off_interval)")
def _():
    assert inspect.isfunction(inspect.getattr_static(CheckpointManager, "_should_save"))
    assert params(CheckpointManager._should_save) == ["self", "curr_step", "last_step"]
    uses(BaseCheckpointManager.save, "self._save(")
    uses(CheckpointManager._save, "self._should_save(curr_step, last_step)")
    seen = []

    class Probe(CheckpointManager):
        def _save(self, curr_step, last_step=False):
            seen.append(self._should_save(curr_step, last_step))
            return True

    probe = Probe.__new__(Probe)
    probe.enable, probe.load_only, probe.interval, probe.enable_first_step_checkpoint = True, False, 10, False
    c.save_off_interval(probe, 3)
    assert seen == [True], seen
    assert probe._should_save(3) is False  # the class's own again


done()
"""


def run_checks(script: str) -> dict:
    """Run the checks in a fresh interpreter; the failed ones, by name."""
    proc = subprocess.run(
        [sys.executable, "-c", CHECKS_PRELUDE + script],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")},
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("FAILURES ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("FAILURES "))


def test_torchft_privates():
    assert run_checks(TORCHFT_CHECKS) == {}


@pytest.mark.titan
def test_torchtitan_privates():
    pytest.importorskip("torchtitan")
    assert run_checks(TORCHTITAN_CHECKS) == {}
