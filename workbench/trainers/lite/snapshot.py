"""torchft-lite's snapshots (``torchft.snapshot_every``): a group's whole torchft state, on disk.

torchft keeps the model only in the live groups: a group that starts heals from
a peer ahead of it. When every group dies at once no peer holds the state, and
a group that starts with none ahead of it (the quorum's ``max_step`` is its own
0) trains from its initial weights. A snapshot is the state a heal would send
(torchft's Manager state dict: every registered user state, the model and
AdamW's, DiLoCo's global weights and outer optimizers, and the Manager's own
step), written every ``snapshot_every`` committed steps by each group to its own
file, ``snapshots/replica-<r>.pt`` (one writer per file; written to a temporary
name and renamed, so a reader finds the old snapshot or the new one, never half
of one). A semi-synchronous group writes at a committed sync, where its weights
are the global ones.

Every group that starts loads the newest snapshot of any group before its first
quorum, as TorchTitan loads its newest checkpoint: torchft then heals it from a
live peer ahead of it, as without a snapshot; with no peer ahead it trains on
from the snapshot, and says so with ``phase restored`` (``from_step``) at its
first step. Deciding this in the trainer, not in the controller, needs no race
between a relaunch and the controller's view of the other groups' deaths: the
quorum's ``max_step`` decides, as it does for a heal. Each save is a durable
``checkpoint`` event, which the controller reads to name what the run resumes
from (``workbench/controller/total_loss.py``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Optional

from workbench.trainers.base import JobContext
from workbench.trainers.compat import torchft_compat

DIR = "snapshots"
DEFAULT_KEY = "default"  # the trainer's own pair (model, AdamW): its load function also reports a heal


def snapshot_dir(run_dir) -> Path:
    return Path(run_dir) / DIR


class Snapshots:
    """One group's snapshots. Built after every state is registered with the Manager (DiLoCo's too) and
    before the first quorum: it loads the newest snapshot, then saves from the inner optimizer's step hook,
    which runs after torchft's own (a DiLoCo or LocalSGD sync) and only for a committed step under DDP.

    ``step_of``: the training step (the ``step`` events') at a Manager step whose sync just committed; the
    identity under DDP.
    """

    def __init__(self, ctx: JobContext, writer, model, inner_opt, manager, step_of=None) -> None:
        self.every = int(ctx.spec["torchft"].get("snapshot_every") or 0)
        self.dir = snapshot_dir(ctx.run_dir)
        self.path = self.dir / f"replica-{ctx.replica}.pt"
        self.writer, self.model, self.inner_opt, self.manager = writer, model, inner_opt, manager
        self.step_of = step_of or (lambda s: s)
        self.loaded: Optional[dict] = None
        self.healed = self.reported = False
        self.last_saved = 0
        if not self.every:
            return
        load = manager.load_state_dict  # torchft calls it with the received Manager state on every heal

        def healed_load(state_dict) -> None:
            self.healed = True
            load(state_dict)

        manager.load_state_dict = healed_load
        self._load_manager_state = load
        self.restore()
        self._manager_step = manager.current_step()
        inner_opt.register_step_post_hook(lambda *_: self._after_inner_step())

    def newest(self) -> Optional[tuple[dict, Path]]:
        """The snapshot with the highest step among every group's, or None."""
        import torch  # late: see trainer.run

        best: Optional[tuple[dict, Path]] = None
        for path in sorted(self.dir.glob("replica-*.pt")):
            try:
                snap = torch.load(path, weights_only=True)
            except Exception as e:  # a foreign file: the others may do
                self.writer.emit("warning", message=f"snapshot {path.name} not read: {type(e).__name__}: {e}")
                continue
            if best is None or snap["step"] > best[0]["step"]:
                best = (snap, path)
        return best

    def restore(self) -> None:
        """Load the newest snapshot into the model, AdamW, every registered state and the Manager's step."""
        found = self.newest() if self.dir.is_dir() else None
        if found is None:
            return
        snap, path = found
        t0 = time.perf_counter()
        user = snap["state"]["user"]
        for key in torchft_compat.state_dict_keys(self.manager):
            if key == DEFAULT_KEY:  # not through its load function, which reports a heal
                self.model.load_state_dict(user[key]["model"])
                self.inner_opt.load_state_dict(user[key]["optim"])
            else:
                torchft_compat.load_fn(self.manager, key)(user[key])
        self._load_manager_state(snap["state"]["torchft"])
        self.loaded = {"from_step": snap["step"], "path": str(path), "load_s": time.perf_counter() - t0}
        self.last_saved = snap["step"]

    def _after_inner_step(self) -> None:
        """After a step of the inner optimizer: a committed Manager step (DDP's step, or a sync) reports a
        restore that no heal replaced, and writes a snapshot when one is due."""
        manager_step = self.manager.current_step()
        if manager_step == self._manager_step:
            return
        self._manager_step = manager_step
        if self.loaded is not None and not self.reported:
            self.reported = True
            if not self.healed:
                self.writer.emit("phase", phase="restored", **self.loaded)
        step = self.step_of(manager_step)
        if step // self.every > self.last_saved // self.every:
            self.save(step)

    def save(self, step: int) -> None:
        import torch  # see newest

        t0 = time.perf_counter()
        state = {
            "user": {
                key: torchft_compat.state_dict_fn(self.manager, key)()
                for key in torchft_compat.state_dict_keys(self.manager)
            },
            "torchft": self.manager.state_dict(),
        }
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.tmp-{os.getpid()}")
        torch.save({"step": step, "state": state}, tmp)
        os.replace(tmp, self.path)
        self.last_saved = step
        self.writer.emit(
            "checkpoint",
            step=step,
            durable=True,
            path=str(self.path),
            seconds=time.perf_counter() - t0,
            bytes=self.path.stat().st_size,
        )
