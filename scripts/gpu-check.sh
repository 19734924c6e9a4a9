#!/usr/bin/env bash
# The GPU path, end to end, on a machine with one GPU (CUDA, or ROCm through the same torch API):
# a `titan` run of two replica groups sharing the GPU, group 1 killed and healed from group 0,
# the GPU's health sampled by the controller (workbench.controller.nodehealth: nvidia-ml-py or amdsmi).
# Under 8 minutes; every figure goes to one JSON file (default gpu-check.json):
# step time, kill -> participating, heal seconds and bytes, GPU memory and utilisation.
#
#   scripts/gpu-check.sh [OUT.json]
#
# Needs a CUDA/ROCm torch in .venv (see README) and nvidia-ml-py or amdsmi (`pip install nvidia-ml-py`).
# Not measured yet: no machine with a GPU was at hand when it was written (README says so).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-gpu-check.json}"
PY="${PY:-.venv/bin/python}"
export WORKBENCH_RUN_ROOT="${WORKBENCH_RUN_ROOT:-$(mktemp -d -t wb-gpu-check-XXXX)}"
exec timeout 470 "$PY" - "$OUT" <<'PYEOF'
import json, statistics, sys, time

import torch

import workbench as wb
from workbench import analysis

out = sys.argv[1]
if not torch.cuda.is_available():
    sys.exit("gpu-check: torch sees no GPU (torch.cuda.is_available() is False); install the CUDA/ROCm build")
t0 = time.time()
run = wb.submit("titan-cpu", {
    "name": "gpu-check", "steps": 60, "faults": [{"action": "kill", "target": 1, "at_step": 20}],
    "titan.overrides": {"fault_tolerance.process_group": "nccl", "training.mixed_precision_param": "bfloat16",
                        "training.seq_len": 512},
    "torchft.timeout_s": 120,
})
try:
    status = run.wait(timeout=420)
finally:
    if run.state() not in ("completed", "failed", "stopped"):
        run.stop(timeout=30)
events = run.event_records()
timeline = analysis.recovery_timeline(events)
kill = timeline[timeline["action"] == "kill"].iloc[0] if len(timeline) else None
steps = run.metrics().query("committed")
health = run.nodes()
figures = {
    "device": torch.cuda.get_device_name(0),
    "state": status["state"], "steps": status["step"], "wall_s": round(time.time() - t0, 1),
    "step_time_s_median": float(steps["step_time_s"].median()) if len(steps) else None,
    "kill_to_participating_s": None if kill is None else float(kill["participating"]),
    "heal_seconds": None if kill is None else kill["heal_seconds"],
    "heal_bytes": None if kill is None else kill["heal_bytes"],
    "gpu_mem_bytes_max": int(health["gpu_mem_bytes"].max()) if "gpu_mem_bytes" in health else None,
    "gpu_util_percent_median": float(health["gpu_util_percent"].median()) if "gpu_util_percent" in health else None,
    "run_dir": str(run.run_dir),
}
with open(out, "w") as f:
    json.dump(figures, f, indent=2, default=str)
print(json.dumps(figures, default=str))
sys.exit(0 if status["state"] == "completed" and figures["gpu_mem_bytes_max"] else 1)
PYEOF
