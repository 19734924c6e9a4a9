"""TorchTitan + TorchFT (``trainer: titan``) on CPU.

The patch tests each run one fresh interpreter that first reproduces an upstream
failure of torchtitan 0.3.0 on CPU-only torch, then applies the workbench patch
and shows it gone. When a torchtitan upgrade fixes one, its reproduction stops
failing, the test says so, and the patch can go.

The main test runs 2 replica groups of the llama3 debug model through
``workbench.submit`` (real controller, lighthouse, submitit jobs), SIGKILLs one
mid-run, and checks that the relaunched group heals from its live peer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# A skip of the whole module where they are missing; under CI=true a failure (tests/conftest.py's
# ``pytest_make_collect_report``, tested by tests/test_ci_no_skip.py).
torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan")
from workbench.trainers.titan import cpu_patches as titan_cpu  # noqa: E402

pytestmark = pytest.mark.titan
cpu_only = pytest.mark.skipif(not titan_cpu.needed(), reason="the CPU patches apply only without an accelerator")


def run_python(code: str, timeout: float = 240) -> str:
    """Run ``code`` as a script in a fresh interpreter; return its stdout, failing on a non-zero exit."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "repro.py"
        script.write_text(textwrap.dedent(code))
        proc = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
            env={
                **os.environ,
                "HF_HUB_OFFLINE": "1",
                "HF_DATASETS_OFFLINE": "1",
                "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            },
        )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@cpu_only
def test_no_module_named_triton():
    out = run_python("""
        import sys
        from workbench.trainers.titan import cpu_patches as titan_cpu
        try:
            import torchtitan.trainer
            print("upstream import works")
        except ModuleNotFoundError as e:
            assert e.name == "triton", e
            print("reproduced")
        titan_cpu.no_module_named_triton()
        import torchtitan.trainer
        print("fixed")
    """)
    assert "reproduced" in out, "torchtitan.trainer imports without triton now: drop no_module_named_triton"
    assert "fixed" in out


@cpu_only
def test_device_forced_to_cuda():
    out = run_python("""
        import torch
        from workbench.trainers.titan import cpu_patches as titan_cpu
        from torchtitan.tools import utils
        assert utils.device_type == "cuda", utils.device_type
        try:
            torch.empty(1, device=utils.device_type)
        except (AssertionError, RuntimeError) as e:
            print("reproduced:", e)
        titan_cpu.device_forced_to_cuda()
        titan_cpu.no_module_named_triton()
        from torchtitan.distributed import utils as dist_utils
        from torchtitan.components import metrics
        assert dist_utils.device_type == metrics.device_type == "cpu"
        torch.empty(1, device=dist_utils.device_type)
        print("fixed")
    """)
    assert "reproduced" in out, "torchtitan picks the CPU itself now: drop device_forced_to_cuda"
    assert "fixed" in out


@cpu_only
def test_torch_cpu_has_no_get_device_name():
    out = run_python("""
        from workbench.trainers.titan import cpu_patches as titan_cpu
        titan_cpu.no_module_named_triton()
        titan_cpu.device_forced_to_cuda()
        from torchtitan.components import metrics
        try:
            metrics.build_device_memory_monitor()
            print("upstream monitor works")
        except AttributeError as e:
            assert "get_device_name" in str(e), e
            print("reproduced")
        titan_cpu.torch_cpu_has_no_get_device_name()
        stats = metrics.build_device_memory_monitor().get_peak_stats()
        assert 0 < stats.max_reserved_gib < 1024, stats
        print("fixed")
    """)
    assert "reproduced" in out, "torchtitan's memory monitor works on CPU now: drop torch_cpu_has_no_get_device_name"
    assert "fixed" in out


@cpu_only
def test_flex_attention_no_backward_on_cpu():
    out = run_python("""
        import torch
        import torch.nn.functional as F
        from torch.nn.attention.flex_attention import create_block_mask
        from workbench.trainers.titan import cpu_patches as titan_cpu
        titan_cpu.no_module_named_triton()
        titan_cpu.device_forced_to_cuda()
        from torchtitan.models.common.attention import FlexAttention, get_causal_mask_mod

        torch.manual_seed(0)
        B, L, N, H = 2, 64, 4, 16
        q, k, v = (torch.randn(B, L, N, H, requires_grad=True) for _ in range(3))
        mask = create_block_mask(get_causal_mask_mod(), B, None, L, L, device="cpu")
        attn = FlexAttention(FlexAttention.Config())
        try:
            attn(q, k, v, attention_masks=mask).sum().backward()
            print("upstream backward works")
        except Exception as e:
            assert "does not support backward on CPU" in str(e), e
            print("reproduced")
        titan_cpu.flex_attention_no_backward_on_cpu()
        out = attn(q, k, v, attention_masks=mask)
        out.sum().backward()
        ref = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True)
        torch.testing.assert_close(out, ref.transpose(1, 2))
        assert q.grad is not None and torch.isfinite(q.grad).all()
        print("fixed")
    """)
    assert "reproduced" in out, "FlexAttention has a CPU backward now: drop flex_attention_no_backward_on_cpu"
    assert "fixed" in out


@cpu_only
def test_barrier_device_ids_and_set_timeout():
    out = run_python("""
        from datetime import timedelta
        import torch
        import torch.distributed as dist
        from workbench.trainers.titan import cpu_patches as titan_cpu
        titan_cpu.no_module_named_triton()
        titan_cpu.device_forced_to_cuda()
        from torchtitan.distributed import utils as dist_utils
        from torchtitan.distributed.parallel_dims import ParallelDims
        import torch.testing._internal.distributed.fake_pg  # noqa: F401  the "fake" backend of size-1 mesh dims

        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, world_size=1)
        try:
            dist_utils.set_pg_timeouts(timedelta(seconds=7), dims)
            print("upstream set_pg_timeouts works")
        except (TypeError, AttributeError) as e:
            print("reproduced:", type(e).__name__, e)
        titan_cpu.barrier_device_ids_and_set_timeout()
        dist_utils.set_pg_timeouts(timedelta(seconds=7), dims)
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        assert backend.options._timeout == timedelta(seconds=7), backend.options._timeout
        dist.destroy_process_group()
        print("fixed")
    """)
    assert "reproduced" in out, "set_pg_timeouts works on CPU now: drop barrier_device_ids_and_set_timeout"
    assert "fixed" in out


@cpu_only
def test_cannot_use_premul_sum_with_gloo():
    """Two ranks in one group: FSDP2's gradient reduce-scatter, as torchtitan configures it."""
    out = run_python("""
        import os
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp
        import torch.nn as nn

        def rank_main(rank, port, patched, results):
            from torch.distributed.fsdp import fully_shard
            from workbench.trainers.titan import cpu_patches as titan_cpu
            titan_cpu.no_module_named_triton()
            titan_cpu.device_forced_to_cuda()
            if patched:
                titan_cpu.cannot_use_premul_sum_with_gloo()
            from torchtitan.distributed import fsdp

            store = dist.TCPStore("127.0.0.1", port, world_size=2, is_master=rank == 0)
            dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
            torch.manual_seed(0)
            model = fully_shard(nn.Linear(8, 8))
            fsdp.disable_fsdp_gradient_division(model)
            try:
                model(torch.randn(2, 8)).sum().backward()
                results[rank] = "ok"
            except RuntimeError as e:
                results[rank] = str(e)
            dist.destroy_process_group()

        if __name__ == "__main__":
            for patched in (False, True):
                with mp.Manager() as manager:
                    results = manager.dict()
                    probe = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
                    port = probe.port
                    del probe
                    mp.spawn(rank_main, args=(port, patched, results), nprocs=2)
                    outcome = set(results.values())
                print(patched, outcome)
                if not patched and any("PREMUL_SUM" in r for r in outcome):
                    print("reproduced")
                if patched and outcome == {"ok"}:
                    print("fixed")
    """)
    assert "reproduced" in out, "FSDP2 reduce-scatter works on gloo now: drop cannot_use_premul_sum_with_gloo"
    assert "fixed" in out, out


def test_state_dict_during_forward_mixes_tensor_and_dtensor():
    """Why ``TitanEvents`` waits for the quorum before each forward.

    torchft serves a recovering peer from its quorum thread, which calls the
    model's ``state_dict()``; FSDP2's state-dict pre-hook reshards parameters a
    forward in flight is using. Here the call lands mid-forward via a hook, the
    way the thread's did when a peer healed at step 0.
    """
    out = run_python("""
        import torch, torch.distributed as dist, torch.nn as nn
        from torch.distributed.fsdp import fully_shard

        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        def serve_peer(module, args):
            model.state_dict()

        model[1].register_forward_pre_hook(serve_peer)
        try:
            model(torch.randn(2, 8)).sum().backward()
            print("no error")
        except RuntimeError as e:
            assert "got mixed torch.Tensor and DTensor" in str(e), e
            print("reproduced")
        dist.destroy_process_group()
    """)
    assert "reproduced" in out, "state_dict() no longer reshards under a running forward: the quorum wait may go"


def test_toml_configs_parse_as_torchtitan_flags():
    out = run_python("""
        import tomllib
        from workbench.trainers.titan import cpu_patches as titan_cpu; from workbench.trainers.titan import job as titan
        if titan_cpu.needed():
            titan_cpu.apply()
        from torchtitan.config import ConfigManager
        for name, flavor, pg in (("titan-cpu-debug", "debugmodel", "gloo"), ("titan-llama3-8b", "8B", "nccl")):
            toml = tomllib.loads(titan.resolve_toml(name).read_text())
            c = ConfigManager().parse_args(titan.titan_flags(toml, {"training.steps": 3, "fault_tolerance.enable": True}))
            assert c.model_spec.flavor == flavor and c.fault_tolerance.process_group == pg, (name, c.fault_tolerance)
            assert c.fault_tolerance.semi_sync_method is None and c.fault_tolerance.enable and c.training.steps == 3
        print("parsed")
    """)
    assert "parsed" in out


def test_offline_assets(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_ASSETS", str(tmp_path))
    from tokenizers import Tokenizer

    from workbench.trainers.titan import assets as titan_assets

    root = titan_assets.ensure_assets()
    assert titan_assets.ensure_assets() == root
    tok = Tokenizer.from_file(str(root / "tokenizer" / "tokenizer.json"))
    assert tok.get_vocab_size() == titan_assets.VOCAB_SIZE
    text = "def main():\n    return 42\n"
    assert tok.decode(tok.encode(text).ids) == text
    assert (root / "corpus" / "train.jsonl").stat().st_size > 1_000_000


def test_a_titan_spare_on_two_nodes_is_ready_at_task_0_and_every_task_writes_as_the_spare(tmp_path, monkeypatch):
    """A spare spanning two nodes says ``spare_ready`` from each task (``titan/spare.wait_as_spare``, here
    stopped before an assignment). The controller knows a spare's events by ``spare`` and counts it ready at
    task 0's; after the assignment a task writes as the group's ``replica`` and ``attempt``."""
    import json
    import time

    from workbench.controller.spares import SparePool
    from workbench.events.reader import EventReader
    from workbench.trainers.base import JobContext
    from workbench.trainers.titan.spare import job_writer, wait_as_spare

    monkeypatch.setenv("WORKBENCH_TITAN_WARM_RANKS", "0")
    ctx = JobContext(str(tmp_path), "run", {}, replica=-1, attempt=-1, spare_id=3)  # as the controller makes one
    pool, reader = SparePool(tmp_path, limit=1), EventReader(tmp_path)
    pool.add(3, "job of spare 3")
    ready_after = {}
    for task in (1, 0):
        assert wait_as_spare(ctx, job_writer(ctx, task), task, lambda: True, {}, time.time()) is None
        for e in reader.poll():
            pool.observe(e)
        ready_after[task] = set(pool.ready)
    assert ready_after == {1: set(), 0: {3}}
    ctx.replica, ctx.attempt, ctx.spare_id = 1, 2, None  # what wait_for_assignment sets
    job_writer(ctx, 1).emit("start", role="task", from_spare=3)

    events = [
        json.loads(line) for f in sorted((tmp_path / "events").glob("*.jsonl")) for line in f.read_text().splitlines()
    ]
    who = sorted((e["kind"], e.get("spare"), e["replica"], e["attempt"]) for e in events)
    assert who == [("exit", 3, None, 0)] * 2 + [("phase", 3, None, 0)] * 2 + [("start", None, 1, 2)], events


def _steps(run, replica, attempt=None):
    df = run.events("step")
    df = df[df["replica"] == replica]
    return df if attempt is None else df[df["attempt"] == attempt]


def assert_one_writer_per_file(run) -> None:
    """The event log's rule: every replica file has one writing process (the job and its rank 0 write apart).

    (A replica's events carry its writer's ``pid``; the controller's and a fault's name other processes.)
    """
    import json

    files = sorted((run.run_dir / "events").glob("replica-*.jsonl"))
    writers = {f.name: {json.loads(line)["pid"] for line in f.read_text().splitlines() if line.strip()} for f in files}
    shared = {name: pids for name, pids in writers.items() if len(pids) > 1}
    assert shared == {}, f"files with more than one writer: {shared}"
    assert any(name.endswith(".rank-0.jsonl") for name in writers), sorted(writers)


def test_two_groups_kill_one_it_heals_from_live_peer(start_run):
    """SIGKILL replica group 1 mid-run; the controller relaunches it, it heals, both finish.

    The survivor commits every step exactly once; the healed group's first
    forward runs on exactly the weights it received; after healing both groups
    hold identical weights; loss goes down.
    """
    steps, kill_after = 30, 5
    run = start_run("titan-cpu", {"steps": steps, "faults": [], "titan.overrides": {"training.seq_len": 128}})
    run.wait_for_step(kill_after, replica=1, timeout=300)
    assert run.state() not in ("completed", "failed", "stopped"), run.status()
    fault = run.kill(1)
    run.wait(timeout=420)
    assert run.state() == "completed", run.status()

    ev = run.events()
    starts = ev[(ev["kind"] == "start") & (ev["replica"] == 1)]
    assert sorted(starts["attempt"]) == [0, 1], starts
    heals = ev[(ev["kind"] == "heal") & (ev["replica"] == 1) & (ev["attempt"] == 1)]
    assert len(heals) == 1, ev[ev["kind"] == "heal"]
    heal = heals.iloc[0]
    assert heal["step"] >= kill_after and heal["bytes"] > 1_000_000 and heal["seconds"] > 0
    assert heal["weights"] == heal["forward_weights"], "the healed step's forward did not use the received weights"

    survivor = _steps(run, 0)
    committed = survivor[survivor["committed"]]["step"].tolist()
    assert committed == list(range(committed[0], steps + 1)), survivor[["step", "committed", "participants"]]
    # torchft's own commit records (routed from torchft_commits) vouch for each: the vote on s - 1, same quorum.
    votes = ev[(ev["kind"] == "commit") & (ev["replica"] == 0) & ev["commit_result"].eq(True)]
    voted = {(int(s) + 1, int(q)) for s, q in zip(votes["step"], votes["quorum_id"])}
    rows = survivor[survivor["committed"]]
    assert {(int(s), int(q)) for s, q in zip(rows["step"], rows["quorum_id"])} <= voted

    healed = _steps(run, 1, attempt=1)
    assert healed.iloc[0]["healed"] and not healed.iloc[0]["participating"], healed.head()
    checked = healed.dropna(subset=["weights"])
    assert len(checked), "no weights checksum after the heal"
    for _, row in checked.iterrows():
        peer = survivor[(survivor["step"] == row["step"]) & survivor["weights"].notna()]
        assert peer["weights"].tolist() == [row["weights"]], (row["step"], row["weights"], peer["weights"].tolist())
    exits = ev[(ev["kind"] == "exit") & (ev["replica"].notna())]
    assert set(exits[exits["reason"] == "completed"]["replica"]) == {0, 1}, exits

    losses = survivor["loss"].tolist()
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3, losses
    assert_one_writer_per_file(run)
    assert_replacement_forked_warm(run, fault)

    rejoin = healed["t"].min() - fault["t"]
    one_group = survivor[survivor["participants"] == 1]["step_time_s"].median()
    two_groups = survivor[(survivor["participants"] == 2) & survivor["committed"]]["step_time_s"].median()
    print(
        f"\ntitan cpu: s/step 1 group {one_group:.2f}, 2 groups {two_groups:.2f}; kill->first healed step "
        f"{rejoin:.1f} s; heal transfer {heal['seconds']:.2f} s, {heal['bytes'] / 1e6:.1f} MB"
    )


def assert_replacement_forked_warm(run, fault) -> None:
    """The local fork server forked the job warm, and the job forked its rank from itself: the replacement
    imported nothing (its ``imports_done`` says ``warm``), then reached
    every phase of a TorchTitan start in order, healed and took part (``workbench.analysis.phases``)."""
    from workbench import analysis
    from workbench.analysis.phases import replacement_phases

    events = run.event_records()
    phases = replacement_phases(events, analysis.recovery_timeline(events))
    row = phases[phases["t"] == fault["t"]].iloc[0]
    assert row["warm"] is not None and bool(row["warm"]), phases
    order = ["replacement_started", "imports_done", "config_parsed", "distributed_ready", "model_built"]
    order += ["manager_ready", "quorum_done", "heal_done", "participating"]
    reached = [row[name] for name in order]
    assert all(x == x for x in reached) and reached == sorted(reached), dict(zip(order, reached))


def preempt_group_0(start_run, steps: int, preempt_after: int, **spec):
    """A titan-cpu run whose group 0 is preempted after ``preempt_after`` steps, waited to its end:
    the run, the ``fault`` event, and attempt 0's only ``exit`` (which must say preempted)."""
    run = start_run("titan-cpu", {"steps": steps, "faults": [], "titan.overrides": {"training.seq_len": 128}, **spec})
    run.wait_for_step(preempt_after, replica=0, timeout=300)
    assert run.state() not in ("completed", "failed", "stopped"), run.status()
    fault = run.kill(0, how="preempt")
    run.wait(timeout=420)
    assert run.state() == "completed", run.status()
    ev = run.events()
    exits = ev[(ev["kind"] == "exit") & (ev["replica"] == 0) & (ev["attempt"] == 0)]
    assert exits["reason"].tolist() == ["preempted"], exits
    return run, fault, exits.iloc[0]


def test_preempt_one_group_it_checkpoints_exits_preempted_and_heals(start_run):
    """The ``preempt`` fault (SIGTERM to the group's job) reaches the rank: it ends its step, saves, exits.

    Group 0 (torchft's participating rank 0, the group that writes full
    checkpoints) is preempted: its attempt 0 reports ``exit`` with
    ``reason="preempted"`` at a step boundary, after a checkpoint of the step
    reached; the controller relaunches it (reason preempted), it heals from
    group 1 (or, back before group 1 stepped on, resumes from that checkpoint
    at the step both were at), and the run completes with group 1 committing
    every step once.
    """
    steps, preempt_after = 30, 5
    run, fault, end = preempt_group_0(start_run, steps, preempt_after)
    ev = run.events()
    first = ev[(ev["replica"] == 0) & (ev["attempt"] == 0)]
    assert end["t"] > fault["t"] and end["step"] >= preempt_after
    last_step = first[first["kind"] == "step"].iloc[-1]
    assert last_step["committed"] and last_step["step"] == end["step"], "it did not stop at a step boundary"
    saved = first[first["kind"] == "checkpoint"]
    assert end["titan_step"] in saved["step"].tolist(), saved
    restarts = ev[(ev["kind"] == "restart") & (ev["replica"] == 0)]
    assert restarts[["attempt", "reason"]].values.tolist() == [[1, "preempted"]], restarts
    # Relaunched warm, it can be back before group 1 stepped on without it: then it resumes from its own
    # checkpoint at the step both were at, and there is nothing to heal.
    heals = ev[(ev["kind"] == "heal") & (ev["replica"] == 0) & (ev["attempt"] == 1)]
    restored = ev[(ev["kind"] == "phase") & (ev["phase"] == "restored") & (ev["replica"] == 0) & (ev["attempt"] == 1)]
    assert len(heals) == 1 or restored["from_step"].tolist() == [end["titan_step"]], (heals, restored)

    survivor = _steps(run, 1)
    committed = survivor[survivor["committed"]]["step"].tolist()
    assert committed == list(range(committed[0], steps + 1)), survivor[["step", "committed", "participants"]]
    completed = ev[(ev["kind"] == "exit") & (ev["reason"] == "completed")]
    assert set(completed["replica"]) == {0, 1}, completed
    assert_one_writer_per_file(run)


def test_preempt_a_two_rank_group_every_rank_stops_at_one_step_and_it_resumes_from_the_checkpoint(start_run):
    """One group of two ranks: the preemption reaches both (forwarded by the job), they stop at the
    same step boundary (a rank that went on alone would wait in a collective, and the job would report
    the rank that failed), save a checkpoint there, and the relaunch resumes from it. Past step 10 it
    also shows every rank computing the weights checksum (each of its own shards, no collective)."""
    steps = 20
    run, _, end = preempt_group_0(start_run, steps, 5, replicas=1, min_replicas=1, nproc_per_replica=2)
    ev = run.events()
    first = ev[(ev["replica"] == 0) & (ev["attempt"] == 0)]
    assert end["titan_step"] in first[first["kind"] == "checkpoint"]["step"].tolist()
    resumed = _steps(run, 0, attempt=1)  # torchtitan's step resumes from the checkpoint (and torchft's Manager's)
    assert resumed["titan_step"].tolist() == list(range(int(end["titan_step"]) + 1, steps + 1)), resumed
    assert_one_writer_per_file(run)
