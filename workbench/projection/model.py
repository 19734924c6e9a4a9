"""The projection model: goodput of one training job under a failure process, per strategy.

A job of ``gpus`` accelerators in ``groups`` replica groups trains for a wall
window ``horizon_s``. Failures arrive as a Poisson process of rate
``gpus / device_mtbf`` (each hits the group of a uniformly drawn device), or
as a recorded trace ``[(t_s, group), ...]``. Each strategy turns the same
failure times into a piecewise-constant rate of useful work:

- **checkpoint-restart**: one synchronous job. Training time is cut into
  periods of ``period_s`` followed by a blocking write of ``write_s``. A
  failure stops every accelerator: the work since the last completed write is
  lost (``recompute``), then ``detect_s + restart_s`` (``restart``) and
  ``restore_s`` (``restore``) pass before training resumes; a failure during
  that downtime starts it again. ``period_s=None`` takes Daly's optimum.
- **elastic** (per-step, torchft): every step pays ``overhead`` (a fraction
  of the step time), given or computed as a ring all-reduce of each
  accelerator's gradient shard across the groups at ``cross_gbps`` — so it
  shrinks as groups grow at a fixed group count. A failure takes
  its group out for ``replacement + restart_s + heal + rejoin_s``, where the
  replacement is ``spare_s`` while one of ``spares`` is free (a repaired node
  returns to the pool ``replacement_s`` later) and ``replacement_s`` otherwise,
  and the heal is ``heal_bytes / heal_bandwidth``. Survivors lose
  ``stall_s`` each (detection, the quorum without the victim, the voted-down
  step) when the victim was taking part and they still form a quorum; a
  group killed again while it is still out only stays out longer.
  While fewer than ``min_groups`` groups are live nothing trains.
- **diloco** (semi-synchronous, torchft ``DiLoCo``): groups train alone and
  average every ``sync_steps`` steps; the outer step moves ``outer_bytes``
  per group over ``outer_bandwidth`` (blocking, unless ``overlap``). A
  failure fails the next outer step, so every group discards the inner steps
  since the last one (torchft ``local_sgd.py``: "sync_every steps will be
  discarded"), and keeps its group out until the first outer step after it
  is back; survivors also lose ``stall_s``.

Goodput is useful work over ``horizon_s`` at the ideal rate (every group
stepping at ``step_s``, no overhead, no failure); badput is the rest, by cause,
in the same units. ``steps_per_s`` counts optimizer steps (what "3,000 steps in
818 minutes" measures): an elastic job steps on with fewer groups.

Why a Monte-Carlo model and not a discrete-event simulation (SimPy): every
strategy is a renewal process whose state between two failures is known in
closed form (checkpoint-restart: full cycles + a remainder; elastic/DiLoCo:
the union of each group's absences), so one replicate is a few numpy passes
over the failure times, not an event loop. Measured on this machine (2 cores,
load ~1): a 54-day, 16,384-GPU replicate of Llama 3 (~420 failures) takes
0.1 ms for checkpoint-restart, 2.4 ms per-step elastic, 3.6 ms DiLoCo; 64
replicates put goodput's standard error at 0.06 points or less there.
The same job written as SimPy processes (one per group, a timeout per step)
would schedule one event per step — ~10⁶ per replicate — for the same
expectation. The accuracy check is against the closed form that holds where
first-order theory does (``M ≫ L``): ``1 − C/τ − (τ/2 + D)/M`` for
checkpoint-restart, which the model matches to a fraction of a point there
and improves on at high failure rates (a failure during a restart, a failure
during a write).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

GB = 1e9
BADPUT = (
    "checkpoint",
    "recompute",
    "restart",
    "restore",
    "overhead",
    "stall",
    "discarded",
    "missing",
    "heal",
    "sync",
    "no_quorum",
    "startup",
)


@dataclass
class Job:
    """What is trained, on how much, for how long. Units in the field names' comments."""

    gpus: int = 1024
    groups: int = 8  # replica groups (elastic, DiLoCo); checkpoint-restart runs them as one job
    step_s: float = 10.0  # fault-free step time of the synchronous job, s
    params: float = 70e9  # model parameters
    state_bytes_per_param: float = 16.0  # bf16 weights + fp32 master + Adam moments (ZeRO, Rajbhandari et al. 2020)
    horizon_s: float = 30 * 86400.0  # wall window projected, s

    @property
    def state_bytes(self) -> float:
        return self.params * self.state_bytes_per_param

    @property
    def gpus_per_group(self) -> float:
        return self.gpus / self.groups


@dataclass
class Failures:
    """Per-device Poisson failures (``device_mtbf_h``), or a recorded ``trace`` of (t_s, group)."""

    device_mtbf_h: Optional[float] = None
    trace: Optional[Sequence[tuple[float, int]]] = None

    def job_mtbf_s(self, job: Job) -> float:
        if self.trace is not None:
            return job.horizon_s / max(1, len(self.trace))
        return self.device_mtbf_h * 3600.0 / job.gpus

    def draw(self, job: Job, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Failure times in [0, horizon) and the group each one hits."""
        if self.trace is not None:
            tr = sorted((float(t), int(g)) for t, g in self.trace if 0 <= t < job.horizon_s)
            return np.array([t for t, _ in tr], dtype=float), np.array([g for _, g in tr], dtype=int)
        rate = 1.0 / self.job_mtbf_s(job)
        n = rng.poisson(rate * job.horizon_s)
        t = np.sort(rng.uniform(0.0, job.horizon_s, n))
        return t, rng.integers(0, job.groups, n)


@dataclass
class CheckpointRestart:
    """Checkpoint-restart costs. ``None``: from the job's state and the bandwidths (GB/s, aggregate)."""

    period_s: Optional[float] = None  # training time between writes; None: Daly's optimum
    write_s: Optional[float] = None
    write_gbps: float = 2000.0  # Llama 3's Tectonic: 2 TB/s sustained
    restore_s: Optional[float] = None
    read_gbps: float = 2000.0
    detect_s: float = 100.0  # TorchTitan's default comm.train_timeout_seconds
    restart_s: float = 900.0  # Clockwork's stated assumption: 15 min to restart training

    def costs(self, job: Job, mtbf_s: float) -> dict:
        write = self.write_s if self.write_s is not None else job.state_bytes / (self.write_gbps * GB)
        restore = self.restore_s if self.restore_s is not None else job.state_bytes / (self.read_gbps * GB)
        period = self.period_s if self.period_s is not None else daly_period(write, mtbf_s)
        return {"write_s": write, "restore_s": restore, "period_s": period, "down_s": self.detect_s + self.restart_s}


# torchft's cross-group gradient all-reduce over Gloo, per accelerator: what Clockwork's 64-H200 run
# implies (sources.CLOCKWORK_GLOO_GBPS; its replica-group count, 2, is an assumption).
GLOO_GBPS = 0.65  # = sources.clockwork_gloo_gbps(), rounded


@dataclass
class Elastic:
    """Per-step elastic (torchft) costs. Defaults: ``sources`` (published) or named as assumptions."""

    overhead: Optional[float] = None  # per-step overhead, fraction of step_s; None: the all-reduce below
    grad_bytes_per_param: float = 2.0  # bf16 gradients all-reduced across groups every step
    cross_gbps: float = GLOO_GBPS  # per accelerator, between groups (Gloo), GB/s
    stall_s: float = 5.0  # survivors' loss per failure: torchft's default 5-s heartbeat timeout bounds it
    replacement_s: float = 900.0  # a group restarted on new nodes: Clockwork's 15-min restart assumption
    spares: int = 0
    spare_s: float = 60.0  # a spare group's processes started (assumption: scheduling a warm allocation)
    restart_s: float = 120.0  # process start → ready to heal (assumption: imports, model, NCCL init)
    heal_s: Optional[float] = None  # None: the group's state / (heal_gbps per accelerator)
    heal_gbps: float = GLOO_GBPS  # a heal is a state transfer between groups over the same transport
    rejoin_s: float = 0.0  # heal done → taking part again, s
    min_groups: int = 1
    startup_s: float = 0.0  # groups joining after the window began (a measured run's stagger), group-s

    def heal(self, job: Job) -> float:
        return self.heal_s if self.heal_s is not None else job.state_bytes / job.gpus_per_group / (self.heal_gbps * GB)

    def step_overhead(self, job: Job) -> float:
        """The given overhead, else a ring all-reduce of each accelerator's gradient shard across groups."""
        if self.overhead is not None:
            return self.overhead
        if job.groups < 2:
            return 0.0
        shard = job.params * self.grad_bytes_per_param / job.gpus_per_group
        return 2 * (job.groups - 1) / job.groups * shard / (self.cross_gbps * GB) / job.step_s


@dataclass
class DiLoCo(Elastic):
    """Semi-synchronous (DiLoCo) costs; replacement and heal as elastic, no per-step all-reduce."""

    overhead: Optional[float] = 0.0
    sync_steps: int = 500  # inner steps between outer steps: DiLoCo's H (Douillard et al. 2023)
    outer_bytes_per_param: float = 4.0  # fp32 pseudo-gradients
    outer_gbps: float = GLOO_GBPS  # per accelerator, between groups, GB/s
    overlap: bool = False  # streaming DiLoCo hides the outer step behind inner steps

    def sync_s(self, job: Job) -> float:
        if self.overlap or job.groups < 2:
            return 0.0
        shard = job.params * self.outer_bytes_per_param / job.gpus_per_group
        return 2 * (job.groups - 1) / job.groups * shard / (self.outer_gbps * GB)


def young_period(write_s: float, mtbf_s: float) -> float:
    """Young (1974): τ = √(2 C M)."""
    return math.sqrt(2 * write_s * mtbf_s)


def daly_period(write_s: float, mtbf_s: float) -> float:
    """Daly (2006), the higher-order optimum: √(2CM)(1 + ⅓√(C/2M) + C/18M) − C for C < 2M, else M."""
    c, m = write_s, mtbf_s
    if c <= 0:
        return m
    if c >= 2 * m:
        return m
    return math.sqrt(2 * c * m) * (1 + math.sqrt(c / (2 * m)) / 3 + c / (18 * m)) - c


def first_order_restart(write_s: float, period_s: float, down_s: float, mtbf_s: float) -> float:
    """Goodput of checkpoint-restart to first order: 1 − C/(τ+C) − (τ/2 + D)/M (valid for M ≫ τ, D)."""
    return 1 - write_s / (period_s + write_s) - (period_s / 2 + down_s) / mtbf_s


# --- one replicate per strategy ---------------------------------------------------------------


def _restart_replicate(job: Job, t: np.ndarray, cr: CheckpointRestart, mtbf_s: float) -> dict:
    c = cr.costs(job, mtbf_s)
    tau, w, down = c["period_s"], c["write_s"], c["down_s"] + c["restore_s"]
    H = job.horizon_s
    starts = np.concatenate([[0.0], t])
    ends = np.concatenate([t, [H]])
    gaps = ends - starts
    # Each failure's downtime (the first interval starts up); a failure within it starts it again.
    dead = np.where(np.arange(len(gaps)) == 0, 0.0, np.minimum(gaps, down))
    up = gaps - dead
    cycle = tau + w
    k = np.floor(up / cycle)
    rem = up - k * cycle
    last = np.arange(len(gaps)) == len(gaps) - 1  # the window's end is not a failure: nothing is lost
    lost = np.where(last, 0.0, np.minimum(rem, tau))
    part_write = np.maximum(rem - tau, 0.0)
    useful = k * tau + np.where(last, np.minimum(rem, tau), 0.0)
    written = k * w + part_write
    frac_restart = c["down_s"] / down if down > 0 else 0.0
    return {
        "useful_s": float(useful.sum()),
        "steps": float(useful.sum()) / job.step_s,
        "badput_s": {
            "checkpoint": float(written.sum()),
            "recompute": float(lost.sum()),
            "restart": float(dead.sum()) * frac_restart,
            "restore": float(dead.sum()) * (1 - frac_restart),
        },
        "failures": int(len(t)),
        "period_s": tau,
        "write_s": w,
    }


def _absences(job: Job, t: np.ndarray, g: np.ndarray, el: Elastic, sync_period_s: Optional[float]) -> tuple:
    """Per group its merged absences [lo, hi); per failure its cost parts; the survivors' stall.

    A failure of a group already out (killed again while it restarts or heals) extends its absence
    and stalls no one: the survivors' quorum no longer has it. The replacement comes from the
    spare pool when one is free.
    """
    heal = el.heal(job)
    free = el.spares
    returns: list[float] = []
    out: dict[int, list[list[float]]] = {}
    parts = np.zeros((len(t), 3))  # missing (replacement + restart), heal, lost inner work
    stalls = 0.0  # group-seconds: each live hit stalls the groups still live, if they keep a quorum
    stalled = 0  # failures that stalled a quorum
    for i, (ti, gi) in enumerate(zip(t, g)):
        while returns and returns[0] <= ti:
            heapq.heappop(returns)
            free += 1
        if free > 0:
            free -= 1
            heapq.heappush(returns, ti + el.replacement_s)
            repl = el.spare_s
        else:
            repl = el.replacement_s
        back = ti + repl + el.restart_s + heal + el.rejoin_s
        start = ti
        if sync_period_s:
            start = math.floor(ti / sync_period_s) * sync_period_s
            back = math.ceil(back / sync_period_s) * sync_period_s
        spans = out.setdefault(int(gi), [])
        if spans and ti < spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], back)
        else:
            others = job.groups - 1 - sum(1 for k, v in out.items() if k != gi and v and v[-1][0] <= ti < v[-1][1])
            if others >= max(el.min_groups, 1):
                stalls += el.stall_s * others
                stalled += 1
            spans.append([start, back])
        parts[i] = (repl + el.restart_s, heal, ti - start)
    merged = [(a, b) for spans in out.values() for a, b in spans]
    return merged, parts, stalls, stalled


def _group_replicate(job: Job, t: np.ndarray, g: np.ndarray, el: Elastic) -> dict:
    H, R = job.horizon_s, job.groups
    sync = el.sync_s(job) if isinstance(el, DiLoCo) else 0.0
    over = el.step_overhead(job)
    sync_period = el.sync_steps * job.step_s * (1 + over) + sync if isinstance(el, DiLoCo) else None
    merged, parts, stall, stalled = _absences(job, t, g, el, sync_period)
    # Live groups over time: a sweep over the absences' ends, clipped to the window.
    edges = [(max(0.0, a), -1) for a, b in merged if a < H] + [(min(H, b), +1) for a, b in merged if a < H]
    edges.sort()
    live, prev = R, 0.0
    live_s = 0.0  # group-seconds live while a quorum exists
    no_quorum = 0.0
    quorum_s = 0.0  # wall seconds with a quorum (steps advance)
    for x, d in edges + [(H, 0)]:
        span = x - prev
        if live >= el.min_groups and live > 0:
            live_s += live * span
            quorum_s += span
        else:
            no_quorum += live * span
        live += d
        prev = x
    absent = R * H - live_s - no_quorum
    discarded = 0.0
    if sync_period:
        # torchft's DiLoCo: a failure between outer steps fails the next one, and every group discards
        # the inner steps since the last (local_sgd.py: "sync_every steps will be discarded").
        discarded = len(np.unique(np.floor(t / sync_period))) * sync_period * (R - 1)
    stall = min(stall + discarded, live_s)
    live_s -= stall + el.startup_s
    quorum_s -= el.stall_s * stalled
    slow = 1.0 + over
    if sync_period:
        slow *= sync_period / (sync_period - sync) if sync_period > sync else math.inf
    useful = live_s / slow
    total_parts = parts.sum(axis=0) if len(parts) else np.zeros(3)
    # Absent group-seconds split by cause in proportion to each failure's parts (merging overlaps shrinks all).
    raw = total_parts.sum()
    share = total_parts / raw if raw > 0 else np.zeros(3)
    overhead = live_s - useful
    sync_part = live_s / (1 + over) - useful if sync_period else 0.0
    badput = {
        "overhead": (overhead - sync_part) / R,
        "sync": sync_part / R,
        "missing": absent * share[0] / R,
        "heal": absent * share[1] / R,
        "recompute": absent * share[2] / R,
        "stall": (stall - min(discarded, stall)) / R,
        "discarded": min(discarded, stall) / R,
        "no_quorum": no_quorum / R,
        "startup": el.startup_s / R,
    }
    return {
        "useful_s": useful / R,
        "steps": max(quorum_s, 0.0) / (job.step_s * slow),
        "badput_s": badput,
        "failures": int(len(t)),
    }


STRATEGIES = ("checkpoint-restart", "elastic", "diloco")


@dataclass
class Projection:
    """A job, its failure process, and the strategies' costs; :meth:`run` projects it."""

    job: Job = field(default_factory=Job)
    failures: Failures = field(default_factory=lambda: Failures(device_mtbf_h=50_000.0))
    restart: CheckpointRestart = field(default_factory=CheckpointRestart)
    elastic: Elastic = field(default_factory=Elastic)
    diloco: DiLoCo = field(default_factory=DiLoCo)

    def replace(self, **changes) -> "Projection":
        """A copy with fields of its parts changed: ``replace(gpus=4096, device_mtbf_h=8e3, spares=2)``."""
        parts = {f.name: dataclasses.replace(getattr(self, f.name)) for f in dataclasses.fields(self)}
        for key, value in changes.items():
            if key.startswith("diloco_"):
                key, value = key[len("diloco_") :], value
                setattr(parts["diloco"], key, value)
                continue
            owners = [p for p in parts.values() if key in {f.name for f in dataclasses.fields(p)}]
            if not owners:
                raise ValueError(f"{key}: not an input of the projection; allowed: {', '.join(sorted(input_names()))}")
            for p in owners[:1] if key == "overhead" else owners:  # DiLoCo's own overhead: diloco_overhead
                setattr(p, key, value)
        return Projection(**parts)

    def run(self, replicates: int = 32, seed: int = 0, strategies: Sequence[str] = STRATEGIES) -> dict:
        """Mean goodput, its standard error, badput by cause, steps/s, and Daly's period, per strategy."""
        bad = [s for s in strategies if s not in STRATEGIES]
        if bad:
            raise ValueError(f"strategies: {bad}; allowed: {', '.join(STRATEGIES)}")
        job = self.job
        rng = np.random.default_rng(seed)
        n = 1 if self.failures.trace is not None else replicates
        mtbf = self.failures.job_mtbf_s(job)
        draws = [self.failures.draw(job, rng) for _ in range(n)]
        out: dict = {"job_mtbf_s": mtbf, "replicates": n}
        for name in strategies:
            reps = []
            for t, g in draws:
                if name == "checkpoint-restart":
                    reps.append(_restart_replicate(job, t, self.restart, mtbf))
                else:
                    reps.append(_group_replicate(job, t, g, self.elastic if name == "elastic" else self.diloco))
            good = np.array([r["useful_s"] / job.horizon_s for r in reps])
            res = {
                "goodput": float(good.mean()),
                "stderr": float(good.std(ddof=1) / math.sqrt(n)) if n > 1 else 0.0,
                "badput": {
                    k: float(np.mean([r["badput_s"].get(k, 0.0) for r in reps])) / job.horizon_s
                    for k in BADPUT
                    if any(k in r["badput_s"] for r in reps)
                },
                "steps_per_s": float(np.mean([r["steps"] for r in reps])) / job.horizon_s,
                "failures": float(np.mean([r["failures"] for r in reps])),
            }
            if name == "checkpoint-restart":
                c = self.restart.costs(job, mtbf)
                res.update(
                    period_s=c["period_s"],
                    write_s=c["write_s"],
                    restore_s=c["restore_s"],
                    daly_period_s=daly_period(c["write_s"], mtbf),
                    young_period_s=young_period(c["write_s"], mtbf),
                )
            out[name] = res
        return out

    def time_to_steps(self, steps: int, **kw) -> dict:
        """Wall seconds to ``steps`` optimizer steps, per strategy (from ``steps_per_s``)."""
        res = self.run(**kw)
        return {s: steps / res[s]["steps_per_s"] for s in STRATEGIES if s in res and res[s]["steps_per_s"] > 0}


def input_names() -> set[str]:
    return {f.name for cls in (Job, Failures, CheckpointRestart, Elastic, DiLoCo) for f in dataclasses.fields(cls)}
