"""torchft-lite: the smallest honest torchft training loop.

One replica group = one process, on any backend (``nproc_per_replica`` is
``titan``'s; Slurm validation refuses more than one task for this trainer).
Each step:

1. ``optimizer.zero_grad()`` starts a quorum with the lighthouse (async: it
   overlaps the forward pass). A group that is behind is told to heal and
   receives a live peer's weights and optimizer state: by default over the
   group's gloo process group, in place into its own model and AdamW tensors
   (torchft's ``PGTransport``; ``torchft.checkpoint_transport: http`` for
   torchft's HTTP transport). A new process waits for its first quorum before
   its first forward pass, so that heal has the CPU (bench/heal.py).
2. forward/backward; torchft's DDP all-reduces gradients over the current
   quorum's gloo process group (a healing group contributes zeros), waited on in
   the gradient hook as torchft does, without its future chain (:mod:`.ddp_hook`).
3. ``should_commit()``: the step counts only if the group's all-reduce
   succeeded. If a peer died mid-step the survivors' all-reduce fails, they
   discard the step (it is recorded with ``committed=False``) and go on. The
   group has one rank, so its vote is answered in process (:mod:`.commit_vote`).

The model and the data are :mod:`.model`'s, shared with ddp-restart.
"""

from __future__ import annotations

import os
import time
import urllib.request
from datetime import timedelta

from workbench.trainers import loopback
from workbench.trainers.base import JobContext
from workbench.trainers.compat import torchft_compat
from workbench.trainers.exits import error_exit
from workbench.trainers.kit import Heartbeat, StepPhases, StopRequest, state_bytes, weights_checksum
from workbench.trainers.lite import semi_sync, snapshot
from workbench.trainers.lite.model import build_model, init_adamw_state, make_batch, warm_up_adamw
from workbench.trainers.placement import placement
from workbench.trainers.raise_hook import maybe_raise
from workbench.trainers.torchft import collective_failure, commit_vote, quorum_epochs
from workbench.trainers.torchft.logs import TorchftLogHandler
from workbench.trainers.torchft.pg_timeout import in_effect_ms


def run(ctx: JobContext) -> None:
    t_start = time.time()
    spec = ctx.spec
    writer = ctx.writer()
    spare_id = ctx.spare_id
    role = "replica" if spare_id is None else "spare"
    host = ctx.listen_host()
    writer.emit("start", trainer="torchft-lite", role=role, world_size=1, address=host, **placement())
    stop = StopRequest()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback.interface_of(host))
    # torch and torchft (ddp_hook imports torch) after the ``start`` event, so that ``imports_done`` times them.
    import torch

    torch.set_num_threads(1)
    from torchft import DistributedDataParallel, Manager, Optimizer

    from workbench.trainers.torchft import ddp_hook

    loopback.install(host)
    tf = spec["torchft"]
    log_handler = TorchftLogHandler(writer).install() if tf.get("structured_logs", True) else None
    writer.emit("phase", phase="imports_done", seconds=time.time() - t_start)

    m = spec["model"]
    torch.manual_seed(spec["seed"])
    model = build_model(m)
    inner_opt = torch.optim.AdamW(model.parameters(), lr=m["lr"])
    warm_up_adamw(m)  # before joining a quorum

    heal_stats: dict = {}
    waits: list = []

    def fetch(address, timeout):
        t0 = time.perf_counter()
        with urllib.request.urlopen(address, timeout=timeout.total_seconds()) as f:
            t1 = time.perf_counter()  # headers: the serving side has staged its state (allow_checkpoint)
            out = torchft_compat.streaming_load(f, weights_only=False)
        t2 = time.perf_counter()
        waits.append((t0, t1, t2))
        return out

    class InstrumentedTransport(torchft_compat.http_transport_with_fetch(fetch)):
        """torchft's HTTPTransport that measures what a heal fetched, for the ``heal`` event."""

        def address(self) -> str:
            return loopback.loopback_address(self)

        def recv_checkpoint(self, src_rank, metadata, step, timeout):
            waits.clear()
            t0 = time.perf_counter()
            sd = super().recv_checkpoint(src_rank, metadata, step, timeout)
            seconds, nbytes = time.perf_counter() - t0, state_bytes(sd)
            served = max(w[1] for w in waits) - t0 if waits else None
            heal_stats.update(
                seconds=seconds,
                bytes=nbytes,
                from_address=metadata,
                src_rank=src_rank,
                step=step,
                wait_s=served,
                transfer_s=seconds - served if served is not None else None,
                transport="http",
                **loopback.heal_fields(metadata, seconds, nbytes),
            )
            return sd

    def load_state_dict(sd) -> None:
        model.load_state_dict(sd["model"])
        inner_opt.load_state_dict(sd["optim"])
        writer.emit("heal", **heal_stats, weights=weights_checksum(model.state_dict()))

    def state_dict():
        return {"model": model.state_dict(), "optim": inner_opt.state_dict()}

    timeout = timedelta(seconds=tf["timeout_s"])
    store = loopback.loopback_store()
    pg_timeout = timedelta(milliseconds=in_effect_ms(spec))
    pg = loopback.loopback_process_group_gloo()(timeout=pg_timeout)
    if tf.get("checkpoint_transport", "pg") == "pg":
        init_adamw_state(inner_opt)  # the heal receives into it in place; AdamW would create the same zeros lazily
        transport = _pg_transport(
            pg,
            timeout,
            heal_stats,
            f"pg://{host}/replica_{ctx.replica}",
            lambda: torchft_compat.manager_state_dict(manager),
        )
    else:
        transport = InstrumentedTransport(timeout=timeout, num_chunks=int(tf.get("http_chunks", 0)))
    allreduce_bytes = semi_sync.AllreduceBytes(pg)
    algorithm = (spec.get("ft") or {}).get("algorithm", "ddp")
    writer.emit("phase", phase="model_ready", seconds=time.time() - t_start, checkpoint_address=transport.metadata())
    if spare_id is not None:
        # A hot spare: everything up to here is done ahead of time. It must not create its
        # Manager yet: an idle Manager heartbeats, and the lighthouse would hold every quorum
        # for up to join_timeout_ms waiting for it.
        writer.emit("phase", phase="spare_ready", seconds=time.time() - t_start)
        if not ctx.wait_for_assignment(stop=lambda: stop.reason is not None):
            writer.emit("exit", reason="stopped", step=0)
            os._exit(0)
        writer.close()
        writer = ctx.writer()
        if log_handler is not None:
            log_handler.writer = writer
        t_assigned = time.time()
        writer.emit(
            "start",
            trainer="torchft-lite",
            role="replica",
            world_size=1,
            from_spare=spare_id,
            address=host,
            **placement(),
        )
        writer.emit("phase", phase="imports_done", seconds=0.0, from_spare=spare_id)
        writer.emit(
            "phase", phase="model_ready", seconds=time.time() - t_assigned, checkpoint_address=transport.metadata()
        )
    if tf.get("tokio_worker_threads"):  # read by the tokio runtimes the Manager starts (spec.TorchftSpec)
        os.environ["TOKIO_WORKER_THREADS"] = str(tf["tokio_worker_threads"])
    manager = Manager(
        pg=pg,
        min_replica_size=spec["min_replicas"],
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"replica_{ctx.replica}",
        store_addr=host,
        store_port=store.port,
        hostname=host,
        rank=0,
        world_size=1,
        lighthouse_addr=ctx.lighthouse_addr,
        timeout=timeout,
        quorum_timeout=timedelta(seconds=tf["quorum_timeout_s"]),
        connect_timeout=timeout,
        heartbeat_interval=timedelta(milliseconds=tf["heartbeat_interval_ms"]),
        checkpoint_transport=transport,
        quorum_retries=tf["quorum_retries"],
        use_async_quorum=tf["use_async_quorum"] and algorithm not in ("diloco", "streaming_diloco"),
    )
    quorum_epochs.install(manager, ctx.run_dir)
    if tf.get("drop_failed_pg", True):
        collective_failure.drop_on_error(manager)
    if tf.get("pg_timeout_only", True):
        collective_failure.pg_timeout_only(pg_timeout)
    collective_failure.hold_when_armed(pg, ctx.run_dir, ctx.replica, writer, manager.current_step)
    if tf.get("local_commit_vote", True):
        commit_vote.install(manager, world_size=1)
    phases = _install_timing(manager, inner_opt) if tf.get("step_timing") and algorithm == "ddp" else None
    if algorithm == "ddp":
        ddp_class = (
            ddp_hook.lean_ddp(DistributedDataParallel, pg) if tf.get("lean_ddp_hook", True) else DistributedDataParallel
        )
        comm = phases or StepPhases()  # the allreduce's seconds, always: the straggler score's (analysis.straggler)
        ddp = _timed_ddp(ddp_class, comm)(manager, model)
        optimizer = Optimizer(manager, inner_opt)
    writer.emit("phase", phase="manager_ready", seconds=time.time() - t_start)

    beat = Heartbeat(writer, spec["heartbeat_s"])
    beat.start()
    if algorithm != "ddp":
        loop_t0 = time.perf_counter()
        try:
            reason, iterations, step = semi_sync.train(
                ctx, spec, writer, manager, model, inner_opt, allreduce_bytes, log_handler, stop, beat
            )
        except Exception as e:
            error_exit(writer, e, step=manager.current_step())
            raise
        finally:
            beat.stop()
        _finish(writer, manager, model, reason, step, loop_t0, iterations)
        return
    snapshot.Snapshots(ctx, writer, model, inner_opt, manager)  # loads the newest; saves from AdamW's step hook
    steps = spec["steps"]
    checksum_every = max(1, int(spec.get("checksum_every", 10)))
    tokens = m["batch_size"] * m["seq_len"]
    emit_steps = spec.get("write_events", True)
    reason = "completed"
    loop_t0, iterations = time.perf_counter(), 0
    try:
        while manager.current_step() < steps:
            if stop.reason:
                reason = stop.reason
                break
            maybe_raise(manager.current_step(), ctx.replica, ctx.attempt)
            t0 = time.perf_counter()
            iterations += 1
            optimizer.zero_grad()
            if iterations == 1:
                # A new process heals in its first quorum: let the heal have the CPU instead of a forward
                # pass whose gradients torchft zeroes anyway (a healing group does not participate).
                manager.wait_quorum()
            step_before = manager.current_step()
            x, y = make_batch(spec["seed"], step_before, ctx.replica, m["batch_size"], m["seq_len"], m["vocab_size"])
            if phases:
                t1 = time.perf_counter()
                phases.add("zero_grad", t1 - t0)
            loss = torch.nn.functional.cross_entropy(ddp(x).flatten(0, 1), y.flatten())
            if phases:
                t2 = time.perf_counter()
                phases.add("forward", t2 - t1)
            loss.backward()
            if phases:
                t3 = time.perf_counter()
                phases.add("backward", t3 - t2)
            optimizer.step()
            if phases:
                phases.add("optimizer_step", time.perf_counter() - t3)
            if m["step_delay_s"]:
                time.sleep(m["step_delay_s"])
            step = manager.current_step()
            dt = time.perf_counter() - t0
            beat.step = step
            if emit_steps:
                t_wb = time.perf_counter()
                # The vote and its quorum as torchft logged them; by hand only with the route off.
                commit = log_handler.take_commit() if log_handler is not None else None
                committed, quorum_id = (
                    (commit["commit_result"], commit["quorum_id"])
                    if commit is not None
                    else (step > step_before, torchft_compat.quorum_id(manager))
                )
                fields = dict(
                    step=step,
                    loss=float(loss.item()),
                    committed=bool(committed),
                    participating=bool(manager.is_participating()),
                    participants=manager.num_participants(),
                    quorum_id=quorum_id,
                    step_time_s=dt,
                    tokens_per_s=tokens / dt if dt else None,
                    batch_seed=[spec["seed"], step_before, ctx.replica],
                    bytes=allreduce_bytes.take(),
                )
                if step % checksum_every == 0 or step >= steps:
                    fields["weights"] = weights_checksum(model.state_dict())
                if not phases:
                    fields["comm_s"] = comm.take().get("t_allreduce_s", 0.0)
                if phases:
                    t_emit = time.perf_counter()
                    phases.add("workbench", t_emit - t_wb)  # + the previous step's emit
                    fields.update(phases.take())
                writer.emit("step", **fields)
                if phases:
                    phases.add("workbench", time.perf_counter() - t_emit)
    except Exception as e:  # recorded, then re-raised so the job is seen to fail
        error_exit(writer, e, step=manager.current_step())
        raise
    finally:
        beat.stop()
    _finish(writer, manager, model, reason, manager.current_step(), loop_t0, iterations)


def _pg_transport(pg, timeout, heal_stats: dict, address: str, state_dict):
    """torchft's PGTransport over the group's own gloo process group, measured for the ``heal`` event.

    ``state_dict`` (the Manager's full state dict: the model's and AdamW's own tensors) makes the receive in
    place: the bytes land in memory the process already holds, with no serialisation on either side and no
    fresh allocation. ``metadata()`` is what the lighthouse hands the healing peer: this group's address.
    ``wait_s`` is the time until the serving side's first message (it sends from its quorum thread after
    its own reconfiguration), ``transfer_s`` the rest.
    """
    import torch  # torch and torchft: see run()
    from torchft.checkpointing.pg_transport import PGTransport

    class _FirstRecv:
        def __init__(self, inner, t0: float) -> None:
            self.inner, self.t0, self.served = inner, t0, None

        def recv(self, tensors, src, tag):
            work = self.inner.recv(tensors, src, tag)
            if self.served is not None:
                return work
            outer = self

            class _Timed:
                def wait(self, *a, **k):
                    r = work.wait(*a, **k)
                    outer.served = time.perf_counter() - outer.t0
                    return r

            return _Timed()

        def __getattr__(self, name):
            return getattr(self.inner, name)

    class InstrumentedPGTransport(PGTransport):
        def metadata(self) -> str:
            return address

        def recv_checkpoint(self, src_rank, metadata, step, timeout):
            t0 = time.perf_counter()
            first = _FirstRecv(pg, t0)
            with torchft_compat.pg_transport_process_group(self, first):
                sd = super().recv_checkpoint(src_rank, metadata, step, timeout)
            seconds, nbytes = time.perf_counter() - t0, state_bytes(sd)
            heal_stats.update(
                seconds=seconds,
                bytes=nbytes,
                from_address=metadata,
                src_rank=src_rank,
                step=step,
                transport="pg",
                wait_s=first.served,
                transfer_s=seconds - first.served if first.served is not None else None,
                **loopback.heal_fields(metadata, seconds, nbytes),
            )
            return sd

    return InstrumentedPGTransport(pg, timeout, torch.device("cpu"), state_dict=state_dict)


def _install_timing(manager, inner_opt):
    """Timing mode: torchft's own calls of a step, timed where torchft makes them (instance attributes).

    quorum_rtt: the async quorum on torchft's quorum thread (overlaps the forward pass); quorum_wait:
    what the step blocked on it; commit_vote: ``should_commit``; inner_step: AdamW itself; allreduce
    (``_timed_ddp``): the gradient hook, torchft's ``Manager.allreduce`` through its process-group
    wrapper and the hook's wait, including any quorum wait inside it.
    """
    phases = StepPhases()
    torchft_compat.wrap_async_quorum(manager, lambda quorum: phases.timed("quorum_rtt", quorum))
    manager.wait_quorum = phases.timed("quorum_wait", manager.wait_quorum)
    manager.should_commit = phases.timed("commit_vote", manager.should_commit)
    inner_opt.step = phases.timed("inner_step", inner_opt.step)
    return phases


def _timed_ddp(base, phases):
    timed = phases.timed("allreduce", torchft_compat.comm_hook(base))

    def comm_hook(state, bucket):  # torch's register_comm_hook checks for these parameter names
        return timed(state, bucket)

    return torchft_compat.ddp_with_comm_hook(base, comm_hook, "TimedDDP")


def _finish(writer, manager, model, reason: str, step: int, loop_t0: float, iterations: int) -> None:
    writer.emit(
        "exit",
        reason=reason,
        step=step,
        weights=weights_checksum(model.state_dict()),
        loop_seconds=time.perf_counter() - loop_t0,
        iterations=iterations,
    )
    manager.shutdown(wait=False)
    writer.close()
    if reason != "completed":
        os._exit(0)  # the controller relaunches on a non-completed exit; skip slow teardown
