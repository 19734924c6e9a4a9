"""The run state's checkpoint ledger: the last durable checkpoint, and the saves that never committed.

Folded from ``checkpoint`` events (part of :class:`~workbench.state.fold.RunState`): a writer
that announces each save (``state="started"``, ddp-restart) and reports its
commit (``durable=True``, with ``path``) lets the fold say, per save:

========== ==============================================================
durable    committed: its ``durable`` event came (and, for the last one,
           its commit marker, the committed file name, is on disk)
writing    started; its attempt is still alive and has not stepped since
skipped    started, and the same attempt stepped on without committing it
incomplete started, and its attempt ended (killed mid-save) without the commit
========== ==============================================================

A writer that only reports commits (MaxText, TorchTitan) has durable saves only.
"""

from __future__ import annotations

import os
from typing import Optional


class CheckpointLedger:
    def __init__(self) -> None:
        self.saves: dict[tuple, dict] = {}  # (replica, attempt, step) -> {"t", "path", "durable", "stepped_past"}
        self.last_durable: Optional[dict] = None
        self.open = 0  # saves started and not committed: only then do steps need looking at

    def apply(self, e: dict, t: float) -> None:
        key = (e.get("replica"), e.get("attempt") or 0, e.get("step"))
        save = self.saves.get(key)
        if e.get("state") == "started":
            if save is None:
                self.saves[key] = {"t": t, "path": None, "durable": False, "stepped_past": False}
                self.open += 1
        elif e.get("durable", True):
            if save is None:
                save = self.saves[key] = {"t": t, "path": None, "durable": False, "stepped_past": False}
            elif not save["durable"]:
                self.open -= 1
            save.update(durable=True, path=e.get("path"))
            if self.last_durable is None or (e.get("step") or 0) >= (self.last_durable.get("step") or 0):
                self.last_durable = {
                    "step": e.get("step"),
                    "path": e.get("path"),
                    "t": t,
                    "replica": e.get("replica"),
                    "attempt": e.get("attempt") or 0,
                }

    def stepped(self, e: dict) -> None:
        step = e.get("step")
        if not isinstance(step, int):
            return
        for (replica, attempt, s), save in self.saves.items():
            if (
                not save["durable"]
                and replica == e.get("replica")
                and attempt == (e.get("attempt") or 0)
                and isinstance(s, int)
                and step > s
            ):
                save["stepped_past"] = True

    def status(self, replicas: dict) -> dict:
        """``last_durable`` (step, path, ``marker_present``), ``incomplete``/``skipped``/``writing``: lists of steps.

        ``replicas``: the fold's ``ReplicaView`` by index, which says whether a save's attempt has ended.
        """
        out: dict = {"last_durable": None, "incomplete": [], "skipped": [], "writing": []}
        if self.last_durable is not None:
            path = self.last_durable.get("path")
            out["last_durable"] = {**self.last_durable, "marker_present": bool(path and os.path.exists(path))}
        for (replica, attempt, step), save in sorted(self.saves.items(), key=lambda kv: kv[1]["t"]):
            if save["durable"]:
                continue
            v = replicas.get(replica)
            ended = v is None or attempt in v.exited or attempt <= v.dead_attempt or attempt < v.attempt
            out["skipped" if save["stepped_past"] else "incomplete" if ended else "writing"].append(step)
        return out
