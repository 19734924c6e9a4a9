"""The workbench's DDP gradient hook gives the gradients torchft's own hook gives.

``trainers/ddp_hook.py`` replaces the future chain of torchft's hook for torchft-lite. Three replica
groups (three real torchft Managers with their real lighthouse and gloo process groups, one thread
each, in a fresh interpreter) train two copies of the decoder on the same batches, one copy through
torchft's ``DistributedDataParallel`` and one through the workbench's, in the same steps and
quorums. torchft's ``FIXED_WITH_SPARES`` with ``min_replicas`` 2 makes one group a non-participant
that must contribute zeros. After every step the two copies' gradients must be the same in every
group, and differ from what the group computed alone (they are the average over the participants'
batches). A failed all-reduce (a group alone whose process group is aborted) must be logged as
torchft logs it, voted down, and leave the bucket as it was; with peers, the kill tests
(``test_e2e_local``) run it where this hook is the default.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

PRELUDE = r"""
import json, os
from datetime import timedelta
import torch
from torchft import Manager
from torchft._torchft import LighthouseServer
from workbench.trainers import loopback

loopback.install("127.0.0.1")


def group_manager(replica, min_replicas, lighthouse, **kwargs):
    # a one-rank replica group's real Manager and its gloo process group, on loopback
    store = loopback.loopback_store()
    pg = loopback.loopback_process_group_gloo()(timeout=timedelta(seconds=10))
    manager = Manager(
        pg=pg, min_replica_size=min_replicas, load_state_dict=lambda sd: None, state_dict=lambda: {},
        replica_id=f"replica_{replica}", store_addr="127.0.0.1", store_port=store.port, hostname="127.0.0.1",
        rank=0, world_size=1, lighthouse_addr=lighthouse.address(), timeout=timedelta(seconds=20),
        use_async_quorum=False, **kwargs,
    )
    return manager, pg
"""

SCRIPT = (
    PRELUDE
    + r"""
import threading
from torchft import DistributedDataParallel, Optimizer
from torchft.manager import WorldSizeMode
from workbench.trainers.torchft.ddp_hook import lean_ddp
from workbench.trainers.lite.model import build_model, make_batch

torch.set_num_threads(1)
M = dict(vocab_size=64, dim=32, layers=1, heads=2, seq_len=8, batch_size=4, lr=1e-2)
STEPS = 4
lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=30_000)
out, errors = {}, []

def group(i):
    try:
        torch.manual_seed(0)
        theirs, ours = build_model(M), build_model(M)
        ours.load_state_dict(theirs.state_dict())
        alone = build_model(M)
        alone.load_state_dict(theirs.state_dict())
        manager, pg = group_manager(i, 2, lighthouse, world_size_mode=WorldSizeMode.FIXED_WITH_SPARES)
        ddp_theirs = DistributedDataParallel(manager, theirs)
        ddp_ours = lean_ddp(DistributedDataParallel, pg)(manager, ours)
        opt = Optimizer(manager, torch.optim.SGD(list(theirs.parameters()) + list(ours.parameters()), lr=M["lr"]))
        rows = []
        for step in range(STEPS):
            opt.zero_grad()
            alone.zero_grad()
            x, y = make_batch(1, step, i, M["batch_size"], M["seq_len"], M["vocab_size"])
            for model in (ddp_theirs, ddp_ours, alone):
                torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
            diff = max((a.grad - b.grad).abs().max().item() for a, b in zip(theirs.parameters(), ours.parameters()))
            from_alone = max((a.grad - b.grad).abs().max().item() for a, b in zip(theirs.parameters(), alone.parameters()))
            participants, participating = manager.num_participants(), manager.is_participating()
            opt.step()
            committed = manager.current_step() == step + 1
            with torch.no_grad():
                for a, b in zip(theirs.parameters(), alone.parameters()):
                    b.copy_(a)
            rows.append(dict(diff=diff, from_alone=from_alone, participants=participants, participating=participating,
                             committed=committed))
        out[i] = rows
        manager.shutdown(wait=False)
    except Exception as e:
        errors.append(f"group {i}: {type(e).__name__}: {e}")

threads = [threading.Thread(target=group, args=(i,)) for i in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join(120)
print(json.dumps({"out": out, "errors": errors, "alive": [t.is_alive() for t in threads]}))
lighthouse.shutdown()
os._exit(0)
"""
)


FAILING = (
    PRELUDE
    + r"""
import logging
from workbench.trainers.torchft.ddp_hook import allreduce_and_wait, sum_options

records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logging.getLogger("torchft.manager").addHandler(Keep())
lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1)
manager, pg = group_manager(0, 1, lighthouse)
opts = sum_options()
manager.start_quorum()
ok = torch.full((4,), 3.0)
allreduce_and_wait(manager, pg, ok, opts).wait()
before = dict(errored=manager.errored() is not None, value=ok.tolist())
pg.abort()
bad = torch.full((4,), 3.0)
got = allreduce_and_wait(manager, pg, bad, opts).wait()
again = torch.full((4,), 5.0)
allreduce_and_wait(manager, pg, again, opts).wait()
print(json.dumps(dict(before=before, errored=manager.errored() is not None, value=got.tolist(), again=again.tolist(),
                      logged=[r for r in records if "got exception in all reduce" in r],
                      commit=manager.should_commit())))
manager.shutdown(wait=False)
lighthouse.shutdown()
os._exit(0)
"""
)


def test_workbench_hook_gives_torchfts_gradients_with_a_non_participant():
    env = {**os.environ, "RUST_LOG": "warn"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["errors"] == [] and result["alive"] == [False, False, False], result
    rows = [result["out"][str(i)] for i in range(3)]
    assert [len(r) for r in rows] == [4, 4, 4]
    for step in zip(*rows):
        # two groups take part, the third is a spare that contributes zeros; every group commits
        assert sorted(r["participating"] for r in step) == [False, True, True], step
        for r in step:
            assert r["participants"] == 2 and r["committed"], r
            # float32 sums of the same buckets in the same order: equal to the last bit
            assert r["diff"] == 0.0, r
            # and averaged over the participants' batches, not this group's gradients alone
            assert r["from_alone"] > 1e-4, r


def test_a_failed_allreduce_is_logged_reported_and_leaves_the_bucket():
    """A group alone (real Manager, lighthouse, gloo): one all-reduce, then its process group aborted."""
    env = {**os.environ, "RUST_LOG": "warn"}
    proc = subprocess.run([sys.executable, "-c", FAILING], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["before"] == {"errored": False, "value": [3.0] * 4}  # one participant: the sum divided by 1
    # the failure is the Manager's error (the step is voted down), the bucket is left as it was
    assert r["errored"] and r["commit"] is False
    assert r["value"] == [3.0] * 4 and r["again"] == [5.0] * 4
    # logged once on torchft's Manager logger, as torchft's hook logs it; the next bucket is skipped
    assert len(r["logged"]) == 1 and "process group not initialized" in r["logged"][0], r["logged"]
