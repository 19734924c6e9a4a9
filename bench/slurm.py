"""Kill → participating (TorchTitan) and restart → first step (MaxText) on the dev Slurm cluster, each without and
with a hot spare: ``python -m bench --only slurm`` (issue #40).

``measure(reps)`` runs, one after the other:

1. TorchTitan, a group of 2 nodes × 1 rank (:func:`bench.multihost.on_devcluster`, layout ``2x1``): group 0
   killed ``reps`` times, each once the previous attempt participates, with ``spares: 0`` and then with
   ``spares: 1``, each variant on a dev cluster of its own (what ``python -m bench.multihost --layouts 2x1
   --kills N --spares 0`` and ``--spares 1`` measure);
2. MaxText, one job of 2 processes (:func:`bench.maxtext_slurm.measure`, what ``python -m bench.maxtext_slurm
   --processes 2 --spares 0,1 --reps N`` measures): its first node set DOWN at step 25, resubmitted (or handed to
   the spare), ``reps`` restarts a variant, the two variants alternating on one dev cluster.

A part that fails is recorded in ``errors`` (MaxText's rows so far are kept) and the next part still runs.
``render`` gives the report's section: per variant n, median, p95 and each, the 1-minute load average at the
faults, and the replacement's phase medians.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path

from . import machine, maxtext_slurm, multihost

LAYOUT = "2x1"
TARGETS_S = {"titan": 10.0, "maxtext": 12.0}  # issue #40


def measure(reps: int, root: Path | None = None, timeout: float = 300.0) -> dict:
    """Both parts (module docstring), ``reps`` kills / restarts a variant; runs under ``root`` if given."""
    t0, started = time.time(), time.strftime("%Y-%m-%d %H:%M %Z")
    m = machine.describe()
    load_start = machine.loadavg()[0]
    titan: list[dict] = []
    maxtext_rows: list[dict] = []
    errors: dict[str, str] = {}
    network = None
    for spares in (0, 1):
        print(f"[slurm] TorchTitan {LAYOUT}, spares {spares}: {reps} kill(s) on a dev cluster of its own", flush=True)
        try:
            result = multihost.on_devcluster([LAYOUT], reps, timeout, spares, run_root=root)
            network = result["network"]
            titan += [{"spares": spares, **s} for s in result["layouts"]]
        except Exception as e:
            traceback.print_exc()
            errors[f"TorchTitan {LAYOUT}, spares {spares}"] = f"{type(e).__name__}: {e}"
    print(f"[slurm] MaxText, 2 processes, spares 0 and 1 alternating: {reps} restart(s) each", flush=True)
    try:
        maxtext_slurm.measure(reps, processes=(2,), spares=(0, 1), on_row=maxtext_rows.append, run_root=root)
    except Exception as e:
        traceback.print_exc()
        errors["MaxText 2 processes"] = f"{type(e).__name__}: {e}"
    return {
        "started": started,
        "seconds": time.time() - t0,
        "reps": reps,
        "machine": {"nproc": m["nproc"], "cpu_model": m["cpu_model"]},
        "network": network,
        "load_start": load_start,
        "load_end": machine.loadavg()[0],
        "titan": titan,
        "maxtext": maxtext_slurm.summarize(maxtext_rows),
        "maxtext_rows": maxtext_rows,
        "errors": errors,
    }


def _s(v, fmt: str = "{:.2f}") -> str:
    return "–" if v is None else fmt.format(v)


def _load_range(loads: list[float]) -> str:
    return "–" if not loads else f"{min(loads):.1f}-{max(loads):.1f}"


def _phases(medians: dict | None) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in (medians or {}).items() if v is not None and v == v) or "–"


def render(result: dict) -> list[str]:
    """The report's section, without its markers (``bench.__main__._write_marked`` adds them)."""
    reps, m = result["reps"], result["machine"]
    rows, phases = [], []
    for s in result["titan"]:
        name = "TorchTitan 2 nodes × 1 rank, " + ("hot spare (`spares: 1`)" if s["spares"] else "relaunched")
        rows.append(
            f"| {name} | kill → participating | {s['n']} | **{_s(s['median_kill_to_participating_s'])}** "
            f"| {_s(s['p95_kill_to_participating_s'])} | {', '.join(f'{x:.1f}' for x in s['each_s'])} "
            f"| {_load_range(s['load_1m_at_kills'])} |"
        )
        phases.append(f"- {name}: {_phases(s['phase_medians_s'])}")
    for s in result["maxtext"]:
        name = f"MaxText {s['processes']} processes, " + ("hot spare (`spares: 1`)" if s["spares"] else "relaunched")
        loads = [float(x.split()[0]) for x in s["loads"]]
        rows.append(
            f"| {name} | node_down → first step | {s['n']} | **{_s(s['median_s'])}** | {_s(s['p95_s'])} "
            f"| {', '.join(f'{x:.1f}' for x in s['each_s'])} | {_load_range(loads)} |"
        )
        phases.append(f"- {name}: {_phases(s['phase_medians_s'])}")
    head = (
        f"{result['started']}; {result['seconds'] / 60:.0f} min on {m['nproc']} CPUs ({m['cpu_model']}), load "
        f"{result['load_start']:.2f} → {result['load_end']:.2f}"
    ) + (f"; network `{result['network']}`" if result["network"] else "")
    lines = [
        "## Kill → participating and restart → first step on the dev Slurm cluster, from `make bench` "
        "(`python -m bench --only slurm`)",
        "",
        head + ". Each measurement brings up a dev cluster of its own (`workbench.devcluster`: four Slurm nodes "
        "on this machine, whose processes share its cores) and takes it down. TorchTitan: two `titan-cpu` groups "
        "of 2 nodes × 1 rank "
        f"(`training.seq_len=64`, 4 CPUs a task, 2 with the spare), group 0 killed {reps} time(s), each once the "
        "previous attempt participates and, with the spare, once a spare is ready (`python -m bench.multihost "
        f"--layouts 2x1 --kills {reps} --spares 0`, then `--spares 1`). MaxText: `maxtext-cpu-tiny`, one job of 2 "
        f"processes (`slurm.nodes=2`), its first node set DOWN at step {maxtext_slurm.FIRST_FAULT_STEP}, {reps} "
        "restart(s) a variant, the two alternating on one cluster (`python -m bench.maxtext_slurm --processes 2 "
        f"--spares 0,1 --reps {reps}`). Seconds after the fault; the load is the 1-minute load average at the "
        f"faults (lowest-highest). Targets (issue #40): TorchTitan ≤ {TARGETS_S['titan']:g} s, MaxText ≤ "
        f"{TARGETS_S['maxtext']:g} s.",
        "",
        "| variant | figure | n | median (s) | p95 (s) | each (s) | load (1 min) |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        "The replacement's phases, medians in seconds after the fault (`analysis.phases.replacement_phases`):",
        "",
        *phases,
    ]
    if result["errors"]:
        lines += ["", "**Failed:** " + "; ".join(f"{k}: {v}" for k, v in result["errors"].items())]
    return lines
