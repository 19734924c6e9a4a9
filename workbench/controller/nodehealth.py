"""Per-node health from the machine: CPU, memory, the node's link, its GPU.

Who samples, and why: the run controller, every :data:`PERIOD_S`, into its own
event file (one ``node_health`` event per node). It already folds the run
state, so it knows which processes of which attempt run on which node (the
``start`` events' ``node`` and ``pid``: ``state.nodes``); it runs on the head,
where the head-side end of each node's veth counts that node's bytes
(``/sys/class/net/wbn-<node>/statistics``); and a trainer sampling itself
would spend its own step time on it and would write a second kind of line
into a file it owns for its steps. One writer per file stays true: the
controller writes only its own file. The cost lands on a core the trainers
share (this machine has two), which is what the bench measures
(``bench/nodehealth_cost.py``: the sampler's CPU seconds per second against
the trainers' step time).

Per node (``node_health`` fields):

- ``cpu_percent``: the node's processes (each part's process and its
  descendants), percent of one core (psutil's ``cpu_percent`` since the last
  sample, so the first sample of a process reads 0);
- ``rss_bytes`` and ``mem_share``: their resident memory, and its share of the
  machine's memory (a dev-cluster node has no memory of its own: the share of
  the host's is what a node's share would be on a real one);
- ``groups``: the same resident memory per replica group on the node (its
  current attempt's processes there and their descendants), what the
  dashboard's group tile shows where the trainer reports no accelerator
  memory (on CPU);
- ``net_sent_bytes``/``net_received_bytes`` and their rates: the node's link
  counters, where the node has one (a dev-cluster node); absent otherwise;
- ``gpu_util_percent``, ``gpu_mem_bytes``: NVIDIA through ``nvidia-ml-py``
  (``pynvml``), AMD through ``amdsmi``, where one imports and sees a device;
  absent otherwise (this machine has none).
"""

from __future__ import annotations

import time
from typing import Iterable, Optional

import psutil

PERIOD_S = 2.0
PREFIX = "wbn-"


def _link(node: str) -> Optional[tuple[int, int]]:
    path = f"/sys/class/net/{PREFIX}{node}/statistics"
    try:
        with open(f"{path}/rx_bytes") as rx, open(f"{path}/tx_bytes") as tx:
            return int(rx.read()), int(tx.read())
    except OSError:
        return None


class _Gpu:
    """The first GPU library that imports and sees a device; ``read()`` -> {util %, memory used}."""

    def __init__(self) -> None:
        self.read = None
        try:
            import pynvml  # optional (nvidia-ml-py): where it is not installed, no GPU fields

            pynvml.nvmlInit()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            if handles:

                def read() -> dict:
                    util = [pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in handles]
                    mem = [pynvml.nvmlDeviceGetMemoryInfo(h).used for h in handles]
                    return {"gpu_util_percent": float(max(util)), "gpu_mem_bytes": int(sum(mem))}

                self.read = read
                return
        except Exception:
            pass
        try:
            import amdsmi  # optional (AMD's SMI library): likewise

            amdsmi.amdsmi_init()
            handles = amdsmi.amdsmi_get_processor_handles()
            if handles:

                def read() -> dict:
                    util = [amdsmi.amdsmi_get_gpu_activity(h)["gfx_activity"] for h in handles]
                    mem = [amdsmi.amdsmi_get_gpu_memory_usage(h, amdsmi.AmdSmiMemoryType.VRAM) for h in handles]
                    return {"gpu_util_percent": float(max(util)), "gpu_mem_bytes": int(sum(mem))}

                self.read = read
        except Exception:
            pass


class Sampler:
    """Keeps each process's psutil handle between samples (``cpu_percent`` is a delta)."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}
        self._links: dict[str, tuple[float, tuple[int, int]]] = {}
        self._gpu: Optional[_Gpu] = None
        self.total_mem = psutil.virtual_memory().total

    def _proc(self, pid: int) -> Optional[psutil.Process]:
        p = self._procs.get(pid)
        if p is None or not p.is_running():
            try:
                p = self._procs[pid] = psutil.Process(pid)
                p.cpu_percent(None)
            except psutil.Error:
                return None
        return p

    def sample(self, nodes: Iterable[tuple], now: Optional[float] = None) -> list[dict]:
        """One record per node: ``nodes`` is (name, PIDs of its parts) each, optionally with a third
        item, {PID: (replica, attempt)}, for the per-group ``groups`` field."""
        now = time.time() if now is None else now
        if self._gpu is None:
            self._gpu = _Gpu()
        gpu = self._gpu.read() if self._gpu.read else {}
        out, seen = [], set()
        for name, pids, *owners in nodes:
            cpu = rss = 0.0
            groups: dict[tuple[int, int], float] = {}
            for pid in pids:
                top = self._proc(pid)
                if top is None:
                    continue
                try:
                    family = [top, *(self._proc(c.pid) for c in top.children(recursive=True))]
                except psutil.Error:
                    family = [top]
                for p in family:
                    if p is None or p.pid in seen:
                        continue
                    seen.add(p.pid)
                    try:
                        cpu += p.cpu_percent(None)
                        mine = p.memory_info().rss
                    except psutil.Error:
                        continue
                    rss += mine
                    owner = owners[0].get(pid) if owners else None
                    if owner is not None:
                        groups[owner] = groups.get(owner, 0.0) + mine
            row = {
                "node": name,
                "cpu_percent": round(cpu, 1),
                "rss_bytes": int(rss),
                "mem_share": round(rss / self.total_mem, 5),
                **gpu,
            }
            if groups:
                row["groups"] = [
                    {"replica": r, "attempt": a, "rss_bytes": int(b)} for (r, a), b in sorted(groups.items())
                ]
            link = _link(name)
            if link is not None:
                row["net_sent_bytes"], row["net_received_bytes"] = link
                last = self._links.get(name)
                if last is not None and now > last[0]:
                    dt = now - last[0]
                    row["net_sent_bps"] = round((link[0] - last[1][0]) / dt, 1)
                    row["net_received_bps"] = round((link[1] - last[1][1]) / dt, 1)
                self._links[name] = (now, link)
            out.append(row)
        self._procs = {pid: p for pid, p in self._procs.items() if pid in seen}
        return out


def nodes_of(state) -> list[tuple[str, list[int], dict[int, tuple[int, int]]]]:
    """(node, PIDs of the current attempts' parts on it, {PID: (replica, attempt)}) from a run-state fold."""
    attempts = state.attempts()
    out = []
    for r in state.nodes.table(attempts):
        parts = [p for p in r["parts"] if p.get("pid")]
        out.append(
            (r["node"], [p["pid"] for p in parts], {p["pid"]: (p["replica"], attempts[p["replica"]]) for p in parts})
        )
    return out


def tile_line(health: Optional[dict]) -> str:
    """The node tile's health line: ``cpu 85% · mem 312 MB (0.4 %) · net ↑12 kB/s ↓3 kB/s · gpu 40% 2.1 GB``."""
    if not health:
        return "cpu — · mem —"
    parts = [
        f"cpu {health.get('cpu_percent', 0):.0f}%",
        f"mem {health.get('rss_bytes', 0) / 1e6:.0f} MB ({100 * health.get('mem_share', 0):.1f} %)",
    ]
    if "net_sent_bps" in health:
        parts.append(f"net ↑{health['net_sent_bps'] / 1e3:.0f} kB/s ↓{health['net_received_bps'] / 1e3:.0f} kB/s")
    if "gpu_util_percent" in health:
        parts.append(f"gpu {health['gpu_util_percent']:.0f}% {health['gpu_mem_bytes'] / 1e9:.1f} GB")
    return " · ".join(parts)
