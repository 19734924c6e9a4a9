import dataclasses
@dataclasses.dataclass(frozen=True)
class FaultKind:
    name: str
    targets: str            # "replica" | "lighthouse" | "node"
    ends_process: bool      # the targeted process is gone: the group comes back as a new attempt
    pauses_process: bool    # the process is stopped for `seconds`, then carries on (hang)
    has_duration: bool
KINDS = {k.name: k for k in [
    FaultKind("kill", "replica", True, False, False),
    FaultKind("abort", "replica", True, False, False),
    FaultKind("preempt", "replica", True, False, False),
    FaultKind("hang", "replica", False, True, True),
    FaultKind("node_down", "replica", True, False, True),
    FaultKind("slurmd_kill", "replica", True, False, True),
    FaultKind("lighthouse_kill", "lighthouse", False, False, False),
]}
RESUME = "resume"   # the `fault` event action that records a fault's undo; not a fault itself
def kind(name): return KINDS.get(name)
