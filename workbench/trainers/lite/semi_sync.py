"""torchft-lite's semi-synchronous loop: torchft's ``LocalSGD`` and ``DiLoCo`` (``ft.algorithm``).

The groups train alone for ``sync_every`` inner steps and meet at an outer
sync (torchft's classes do the sync, from the inner optimizer's step hooks):

- ``localsgd``: ``LocalSGD`` averages the parameters; a sync that is voted
  down keeps each group's own weights.
- ``diloco``: ``DiLoCo`` all-reduces the pseudo-gradient (global weights − local
  weights) and an outer SGD (Nesterov) applies it; a sync voted down restores
  the weights of the last sync: those inner steps are gone, for every group.
- ``streaming_diloco``: ``DiLoCo`` over model fragments, one fragment every
  ``sync_every / fragments`` inner steps, its all-reduce issued
  ``fragment_sync_delay`` inner steps before the step that waits for it.

Joining
-------
torchft's Manager steps (``current_step``) count syncs, and a quorum forms
only at a sync. A process that starts (the run's first, or a replacement)
asks for a quorum at once, with one sync of its own before its first inner
step (a "join", ``sync`` with ``join=true``): the lighthouse holds it until
the live peers reach their next sync (``lighthouse.join_timeout_ms``), where
it heals from them (``heal``) and from then on syncs in step with them. A
replacement that waited for its next scheduled sync instead would ask alone,
form a quorum of one after the join timeout, and never meet its peers.

What a joiner contributes to its first sync is torchft's: under ``LocalSGD``
(async quorum) it is not participating yet, its tensors are zeroed and the
average is over the others; under ``DiLoCo`` (synchronous quorum) it heals
inside ``start_quorum`` and then computes its pseudo-gradient from its
source's weights, so that sync counts the source's pseudo-gradient twice
(exact with 2 groups, weighted towards the source with more).

Steps
-----
A ``step`` event's ``step`` is the group's training step:
``(manager_step − 1) · inner_per_sync + inner steps since the sync`` (the
join is manager step 1), the same number on every group at the same point of
the schedule, and what ``steps`` and ``at_step`` faults count. ``inner``:
false on the step whose hook ran the sync. An inner step's ``committed`` is
provisional: the next ``sync`` of the same process decides it
(:mod:`workbench.analysis.useful`).

Catching up (``ft.catch_up``)
----------------------------
A group frozen mid-window (SIGSTOP, a stalled host) comes back as far behind
its peers as it was frozen. They reach the sync first and wait for it there:
it heartbeats again, so the lighthouse holds their quorum for it (the join
timeout) until it has finished its window. Measured (three groups, a 2 s
freeze five steps into a 4 s window): both peers blocked 2.04–2.06 s in the
sync after it, where a sync takes 0.05–0.35 s.

With ``catch_up``, a group whose inner step took longer than the lighthouse's
heartbeat timeout ends its window at its next inner step: it reaches the sync
first and waits there alone, and the peers find all of the last quorum's
members waiting (torchft's fast quorum). Had a quorum formed without it while
it was frozen, it would heal at that sync anyway, and the window it cut short
is the one it would lose. The sync says ``early: true``. Measured the same
way: the peers blocked 0.08–0.11 s, and the sync came 1.9 s sooner. torchft
has no call for an early sync: the window's step counter (``_local_step``) is
advanced to the step before the sync (:func:`workbench.trainers.compat.torchft_compat.set_local_step`).

Bytes
-----
:class:`AllreduceBytes` counts what goes through the process group's
``allreduce`` (every torchft collective of these algorithms and of DDP):
each call's tensor bytes twice (contributed, and the reduced result received
back), only while the process group spans more than one group. That is at
the collective's interface, not on the wire (a ring all-reduce over n groups
moves 2(n−1)/n of it each way; n = 2: the same).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Optional

from workbench.trainers.compat import torchft_compat
from workbench.trainers.kit import StepPhases, weights_checksum
from workbench.trainers.lite.model import make_batch
from workbench.trainers.lite.snapshot import Snapshots
from workbench.trainers.raise_hook import maybe_raise

SYNC_PARTS = ("quorum", "prepare", "perform")
"""The blocking parts of a sync, in order; DiLoCo's ``seconds`` is their sum (``vote`` is inside ``perform``)."""


class AllreduceBytes:
    """Counts the bytes this process passes through ``pg.allreduce`` (see the module docstring), and the calls."""

    def __init__(self, pg) -> None:
        self.total = 0
        self.calls = 0
        self._taken = 0
        allreduce = pg.allreduce

        def counted(tensors, *args, **kwargs):
            if pg.size() > 1:
                self.total += 2 * sum(t.numel() * t.element_size() for t in tensors)
                self.calls += 1
            return allreduce(tensors, *args, **kwargs)

        pg.allreduce = counted

    def take(self) -> int:
        """Bytes since the last ``take``."""
        n, self._taken = self.total - self._taken, self.total
        return n


def fragments_of(model, n: int) -> list:
    """The decoder as ``n`` contiguous fragments: embeddings, blocks, head, split as evenly as they go."""
    from torch import nn  # see SemiSync

    units: list[nn.Module] = [
        nn.ModuleList([model.tok, model.pos]),
        *model.blocks.layers,
        nn.ModuleList([model.norm, model.head]),
    ]
    bounds = [round(i * len(units) / n) for i in range(n + 1)]
    return [nn.ModuleList(units[a:b]) for a, b in zip(bounds, bounds[1:])]


class SemiSync:
    """torchft's ``LocalSGD`` or ``DiLoCo`` around the inner optimizer, and what each sync did.

    Each sync's time, bytes and vote are recorded by wrapping the torchft
    methods that do it (``LocalSGD.sync``; a fragment's ``prepare_sync`` and
    ``perform_sync``; ``Manager.start_quorum``), so torchft's own hooks decide
    when to sync. Inside them the heartbeat says the group is waiting for its
    peers (``Heartbeat.waiting``), which the hang detector reads.
    """

    def __init__(
        self, ft: dict, manager, model, inner_opt, counter: AllreduceBytes, log_handler=None, beat=None
    ) -> None:
        import torch  # late: the trainer imports this module before torch and torchft (see trainer.run)
        from torchft.local_sgd import DiLoCo, LocalSGD

        self.algorithm, self.manager, self.counter, self.log_handler = ft["algorithm"], manager, counter, log_handler
        self._waiting = beat.waiting if beat is not None else (lambda what: contextlib.nullcontext())
        self.done: Optional[dict] = None
        self.syncs = 0
        self._early = False
        self._t = 0.0
        self._parts = StepPhases()  # this sync's seconds per blocking part (SYNC_PARTS), and the vote inside perform
        self._bytes0 = self._step0 = self._calls0 = 0
        self._wrap_start_quorum()
        manager.should_commit = self._parts.timed("vote", manager.should_commit)
        if self.algorithm == "localsgd":
            self.impl = LocalSGD(manager, model, inner_opt, sync_every=ft["sync_every"])
            self.inner_per_sync = ft["sync_every"]
            self.fragments: list = []
            sync = self.impl.sync

            def timed_sync() -> None:
                self._begin(None)
                with self._waiting("sync"):
                    sync()
                self._end(None)

            self.impl.sync = timed_sync
        else:
            n = ft["fragments"] if self.algorithm == "streaming_diloco" else 1
            parts = fragments_of(model, n) if n > 1 else [model]
            outer = [
                torch.optim.SGD(
                    p.parameters(), lr=ft["outer_lr"], momentum=ft["outer_momentum"], nesterov=ft["outer_nesterov"]
                )
                for p in parts
            ]
            self.impl = DiLoCo(
                manager,
                parts,
                inner_opt,
                outer,
                sync_every=ft["sync_every"],
                should_quantize=ft["quantize"],
                fragment_sync_delay=ft["fragment_sync_delay"],
                fragment_update_alpha=ft["fragment_update_alpha"],
                use_bucketization=ft.get("bucket_cap_mb") is not None,
                bucket_cap_mb=ft.get("bucket_cap_mb"),
            )
            self.inner_per_sync = ft["sync_every"] // n
            self.fragments = torchft_compat.diloco_fragments(self.impl)
            for i, frag in enumerate(self.fragments):
                self._wrap_fragment(i, frag)
        self.impl.__enter__()

    def _wrap_fragment(self, i: int, frag) -> None:
        prepare, perform = frag.prepare_sync, frag.perform_sync

        def timed_prepare() -> None:
            with self._in_sync("prepare"):
                prepare()

        def timed_perform() -> bool:
            with self._in_sync("perform"):
                committed = perform()
            self._end(i)
            return committed

        frag.prepare_sync, frag.perform_sync = timed_prepare, timed_perform

    def _wrap_start_quorum(self) -> None:
        """A sync starts with its quorum: its bytes are counted from there, and DiLoCo's wait for it is sync time."""
        start_quorum = self.manager.start_quorum

        def timed(*args, **kwargs):
            self._bytes0, self._step0, self._calls0 = (
                self.counter.total,
                self.manager.current_step(),
                self.counter.calls,
            )
            with self._in_sync("quorum"):
                start_quorum(*args, **kwargs)

        self.manager.start_quorum = timed

    @contextlib.contextmanager
    def _in_sync(self, part: str):
        """A blocking part of a sync (one of ``SYNC_PARTS``): its time counts as blocked (``t_<part>_s`` in
        the sync event), and the heartbeat says the group waits for peers."""
        t0 = time.perf_counter()
        with self._waiting("sync"):
            yield
        self._parts.add(part, time.perf_counter() - t0)

    def _begin(self, fragment: Optional[int]) -> None:
        self._t = time.perf_counter()
        self._bytes0, self._calls0 = self.counter.total, self.counter.calls

    def _end(self, fragment: Optional[int]) -> None:
        """Record the sync just done. DiLoCo's seconds: the time the step was blocked in it (quorum,
        issuing the all-reduce, waiting for it and the vote), not the inner steps it overlapped."""
        m = self.manager
        commit = self.log_handler.take_commit() if self.log_handler is not None else None
        parts = self._parts.take()
        blocked = sum(parts.get(f"t_{p}_s", 0.0) for p in SYNC_PARTS)
        seconds = time.perf_counter() - self._t if self.algorithm == "localsgd" else blocked
        self.done = dict(
            step=m.current_step(),
            sync_index=self.syncs,
            algorithm=self.algorithm,
            fragment=fragment if self.algorithm != "localsgd" else None,
            bytes=self.counter.total - self._bytes0,
            allreduces=self.counter.calls - self._calls0,
            seconds=seconds,
            participants=m.num_participants(),
            quorum_id=commit["quorum_id"] if commit else torchft_compat.quorum_id(m),
            committed=bool(commit["commit_result"]) if commit else m.current_step() > self._step0,
            **parts,
        )
        self.syncs += 1

    def join(self) -> dict:
        """One sync before the first inner step (see the module docstring): heal from the peers at their next sync."""
        if self.algorithm == "localsgd":
            self.impl.sync()
        else:
            self.manager.start_quorum()
            frag = self.fragments[torchft_compat.diloco_current_fragment(self.impl)]
            frag.prepare_sync()
            frag.perform_sync()
        done, self.done = self.done, None
        return {**done, "join": True}

    def take(self) -> Optional[dict]:
        """The sync the last inner step's hook ran, if it ran one."""
        done, self.done = self.done, None
        if done is not None and self._early:
            done["early"], self._early = True, False
        return done

    def sync_next_step(self) -> None:
        """End the window at the next inner step ("Catching up" in the module docstring)."""
        impl = self.impl
        window = torchft_compat.sync_every(impl)
        last = window - 1 if self.algorithm == "localsgd" else window - torchft_compat.fragment_sync_delay(impl) - 1
        if torchft_compat.local_step(impl) < last:
            torchft_compat.set_local_step(impl, last)
            self._early = True


def train(
    ctx, spec: dict, writer, manager, model, inner_opt, counter: AllreduceBytes, log_handler, stop, beat
) -> tuple[str, int, int]:
    """The semi-synchronous training loop; returns (exit reason, iterations, training step)."""
    import torch  # see SemiSync

    ft, m = spec["ft"], spec["model"]
    algo = SemiSync(ft, manager, model, inner_opt, counter, log_handler, beat=beat)
    Snapshots(ctx, writer, model, inner_opt, manager, step_of=lambda s: (s - 1) * algo.inner_per_sync)
    steps, tokens = spec["steps"], m["batch_size"] * m["seq_len"]
    per_sync = algo.inner_per_sync
    stall_s = spec["lighthouse"]["heartbeat_timeout_ms"] / 1000 if ft.get("catch_up") else None

    def train_step() -> int:
        return max(0, manager.current_step() - 1) * per_sync + local

    local = 0
    sync = algo.join()
    writer.emit("sync", **sync, train_step=train_step(), weights=weights_checksum(model.state_dict()))
    counter.take()
    beat.step = train_step()
    iterations = 0
    t_end = time.perf_counter()
    while train_step() < steps:
        if stop.reason:
            return stop.reason, iterations, train_step()
        maybe_raise(train_step(), ctx.replica, ctx.attempt)
        t0 = time.perf_counter()
        iterations += 1
        before = train_step()
        inner_opt.zero_grad()
        x, y = make_batch(spec["seed"], before, ctx.replica, m["batch_size"], m["seq_len"], m["vocab_size"])
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        inner_opt.step()  # LocalSGD's / DiLoCo's hook syncs when the schedule says
        if m["step_delay_s"]:
            time.sleep(m["step_delay_s"])
        sync = algo.take()
        local = 0 if sync is not None else local + 1
        step = train_step()
        dt = time.perf_counter() - t0
        beat.step = step
        fields: dict[str, Any] = dict(
            step=step,
            loss=float(loss.item()),
            inner=sync is None,
            algorithm=ft["algorithm"],
            committed=True if sync is None else bool(sync["committed"]),
            participating=bool(manager.is_participating()),
            participants=manager.num_participants(),
            quorum_id=torchft_compat.quorum_id(manager) if sync is None else sync["quorum_id"],
            step_time_s=dt,
            tokens_per_s=tokens / dt if dt else None,
            batch_seed=[spec["seed"], before, ctx.replica],
            manager_step=manager.current_step(),
            bytes=counter.take(),
        )
        if sync is not None:
            fields["weights"] = weights_checksum(model.state_dict())
            writer.emit("sync", **sync, train_step=step, weights=fields["weights"])
        writer.emit("step", **fields)
        t_prev, t_end = t_end, time.perf_counter()
        if stall_s is not None and sync is None and t_end - t_prev > stall_s:
            algo.sync_next_step()
    return "completed", iterations, train_step()
