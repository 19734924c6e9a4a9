"""Fault schedules: turning a chaos spec into the list of faults a run will get.

``materialize`` draws the whole schedule up front from the spec's seed, with
inter-arrival times from an exponential distribution of mean ``mtbf_s`` (so the
faults form a Poisson process, which is what an MTBF claims; torchft's own
Slurm "punisher" draws a random wait and then sleeps a fixed one, which is
not). The drawn faults go into the resolved spec, so ``run.json`` holds the
exact schedule and a replay repeats it.
"""

from __future__ import annotations

import numpy as np

from workbench.faults import kinds as faultkinds
from workbench.spec.models import Spec
from workbench.spec.sections import FaultSpec


def draw(chaos, replicas: int) -> list[FaultSpec]:
    rng = np.random.default_rng(chaos.seed)
    gaps = rng.exponential(chaos.mtbf_s, size=chaos.max_faults)
    times = chaos.start_s + np.cumsum(gaps)
    targets = chaos.targets or list(range(replicas))
    out = []
    for t in times:
        action = chaos.actions[int(rng.integers(len(chaos.actions)))]
        target = int(targets[int(rng.integers(len(targets)))])
        out.append(
            FaultSpec(
                action=action,
                target=target if faultkinds.KINDS[action].targets == "replica" else None,
                at_s=round(float(t), 3),
                seconds=chaos.hang_seconds,
            )
        )
    return out


def materialize(spec: Spec) -> Spec:
    """The spec with its chaos schedule drawn into ``faults`` and ``chaos`` cleared.

    Clearing it means a replay of the resolved spec gets the same faults, not
    a second draw on top; ``run.json`` keeps the chaos parameters separately.
    """
    if spec.chaos is None:
        return spec
    data = spec.to_dict()
    data["faults"] = data["faults"] + [f.model_dump(mode="json") for f in draw(spec.chaos, spec.replicas)]
    data["chaos"] = None
    return Spec.model_validate(data)
