"""The experiment spec: what to run, validated before anything starts.

A spec is a YAML file in ``configs/`` plus overrides, either ``key=value``
strings (dotted keys reach into sections: ``lighthouse.heartbeat_timeout_ms=500``)
or a dict. Values in ``key=value`` are parsed as YAML scalars, so ``replicas=3``
is an int and ``relaunch=off`` a string.

Validation is pydantic with ``extra="forbid"`` everywhere; every failure is
re-raised as one :class:`SpecError` whose message names each bad field and what
it allows. Checks that need the world (a writable run root) are in
:func:`preflight`; none of them starts or writes anything.
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any, Literal, Mapping, Optional, Sequence, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from . import faultkinds

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
from .trainers.registry import trainer_kind, trainer_names

TRAINERS = trainer_names()


class SpecError(ValueError):
    """A spec that must not be run. The message names the field(s) and what is allowed."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LighthouseSpec(_Section):
    """torchft's lighthouse: decides quorums from heartbeats.

    ``heartbeat_timeout_ms`` is how long a dead replica group holds survivors
    up: 1000 ms instead of torchft's 5000 ms default. The run controller
    restarts a lighthouse that died, on the same address, after
    ``restart_delay_s`` (non-zero to study an outage). On a backend whose runs
    listen on loopback only (``local``), ``bind_host`` must be a loopback
    address unless ``allow_non_loopback`` says otherwise: the lighthouse
    would take quorum requests from the network.
    """

    heartbeat_timeout_ms: int = Field(1000, ge=50, le=600_000)
    join_timeout_ms: int = Field(1000, ge=0, le=3_600_000)
    quorum_tick_ms: int = Field(100, ge=10, le=10_000)
    bind_host: str = "127.0.0.1"
    port: Optional[int] = Field(None, ge=1, le=65535)
    restart_delay_s: float = Field(0.0, ge=0, le=3600)
    allow_non_loopback: bool = False


class TorchftSpec(_Section):
    """Timeouts of each replica group's torchft Manager and process group.

    ``pg_timeout_ms`` bounds how long a survivor's collective can wait on a dead
    peer. A killed peer's socket usually resets at once, but a survivor waiting
    on a peer that itself aborted only learns from this timeout (measured: 2.0 s
    stall with a 2 s timeout). It defaults to the lighthouse heartbeat timeout,
    which bounds the stall anyway: the new quorum cannot form sooner.
    """

    pg_timeout_ms: Optional[int] = Field(None, ge=100, le=3_600_000)
    timeout_s: float = Field(30.0, gt=0, le=3600)
    quorum_timeout_s: float = Field(60.0, gt=0, le=36_000)
    quorum_retries: int = Field(20, ge=0, le=1000)
    heartbeat_interval_ms: int = Field(100, ge=10, le=10_000)
    use_async_quorum: bool = True


class ModelSpec(_Section):
    """The torchft-lite decoder language model and its synthetic data."""

    vocab_size: int = Field(256, ge=8, le=1_000_000)
    dim: int = Field(64, ge=8, le=16384)
    layers: int = Field(2, ge=1, le=256)
    heads: int = Field(4, ge=1, le=256)
    seq_len: int = Field(32, ge=4, le=65536)
    batch_size: int = Field(8, ge=1, le=65536)
    lr: float = Field(3e-3, gt=0, le=10)
    step_delay_s: float = Field(0.0, ge=0, le=60)

    @model_validator(mode="after")
    def _heads_divide_dim(self) -> "ModelSpec":
        if self.dim % self.heads:
            raise ValueError(f"dim ({self.dim}) must be a multiple of heads ({self.heads})")
        return self


class FaultSpec(_Section):
    """One scheduled fault: at a committed step, or ``at_s`` seconds after the first committed step."""

    action: str = "kill"
    target: Optional[int] = Field(None, ge=0)
    at_step: Optional[int] = Field(None, ge=0)
    at_s: Optional[float] = Field(None, ge=0)
    seconds: float = Field(5.0, gt=0, le=3600)

    @field_validator("action")
    @classmethod
    def _kind(cls, v: str) -> str:
        return _fault_kind(v)

    @model_validator(mode="after")
    def _when(self) -> "FaultSpec":
        if (self.at_step is None) == (self.at_s is None):
            raise ValueError("give exactly one of at_step or at_s")
        return self


def _fault_kind(name: str) -> str:
    if name not in faultkinds.KINDS:
        raise ValueError(f"got {name!r}; allowed: {', '.join(faultkinds.names())}")
    return name


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _loopback_only(cluster: str) -> bool:
    from .cluster import backend_class

    return backend_class(cluster).loopback_only


def _cluster_name(name: str) -> str:
    from .cluster import backend_names

    if name not in backend_names():
        raise ValueError(f"got {name!r}; allowed: {', '.join(backend_names())}")
    return name


class ChaosSpec(_Section):
    """Random faults with exponential inter-arrival times (a Poisson process of rate 1/mtbf_s).

    Drawn once, at submit, from ``seed``: the drawn list is written into the
    resolved spec's ``faults`` so the run records, and a replay repeats,
    exactly the faults that were injected.
    """

    mtbf_s: float = Field(..., gt=0, le=10_000_000)
    seed: int = Field(0, ge=0)
    actions: list[str] = Field(default_factory=lambda: ["kill"], min_length=1)
    targets: Optional[list[int]] = None
    start_s: float = Field(5.0, ge=0)
    max_faults: int = Field(10, ge=1, le=100_000)
    hang_seconds: float = Field(3.0, gt=0, le=3600)

    @field_validator("actions")
    @classmethod
    def _kinds(cls, v: list[str]) -> list[str]:
        return [_fault_kind(a) for a in v]


class HangSpec(_Section):
    """Hang detection: a replica group that made no step progress for ``timeout_s``.

    ``timeout_s: null`` derives it from the run: 20 × the median step interval,
    at least ``min_timeout_s``. ``action: kill`` kills and relaunches it.
    """

    timeout_s: Optional[float] = Field(None, gt=0, le=86_400)
    min_timeout_s: float = Field(3.0, gt=0, le=86_400)
    action: Literal["none", "kill"] = "none"


class SlurmSpec(_Section):
    """Where and how Slurm runs the jobs (``cluster: slurm``); see docs/slurm.md.

    ``conf`` is the ``slurm.conf`` clients use: empty means ``$SLURM_CONF``, else
    the local dev cluster when it is up, else the machine's default; submit
    pins the choice here. Jobs are ``--no-requeue``: the controller resubmits an
    ended job as the next attempt. ``requeue: true`` (checkpoint-restart
    trainers only) lets Slurm requeue it instead, as the same attempt.
    ``sbatch_args`` are extra ``#SBATCH`` options (``{constraint: h100}``).
    """

    conf: Optional[str] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time_min: int = Field(60, ge=1)
    nodes: int = Field(1, ge=1)
    tasks_per_node: int = Field(1, ge=1)
    gpus_per_node: int = Field(0, ge=0)
    cpus_per_task: int = Field(1, ge=1)
    requeue: bool = False
    srun_args: list[str] = Field(default_factory=list)
    setup: list[str] = Field(default_factory=list)
    sbatch_args: dict[str, str] = Field(default_factory=dict)

    @field_validator("sbatch_args")
    @classmethod
    def _sbatch_args(cls, v: dict[str, str]) -> dict[str, str]:
        """submitit writes each as ``#SBATCH --key=value`` unquoted: a newline would be a shell line."""
        for key, value in v.items():
            if not SBATCH_KEY.fullmatch(key):
                raise ValueError(f"key {key!r}: an sbatch option name; allowed: letters, digits and '-', "
                                 "starting with a letter")
            _one_line(f"[{key}]", value)
        return v

    @field_validator("srun_args", "setup")
    @classmethod
    def _lines(cls, v: list[str]) -> list[str]:
        for i, value in enumerate(v):
            _one_line(f"[{i}]", value)
        return v


SBATCH_KEY = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,63}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _one_line(where: str, value: str) -> None:
    if _CONTROL.search(value):
        raise ValueError(f"{where}: {value!r} has a control character (newline, tab, ...); allowed: one line of "
                         "printable text")


class CheckpointSpec(_Section):
    """When the ``ddp-restart`` baseline writes its checkpoint: every ``every_steps`` committed
    steps, or every ``every_s`` seconds of training, whichever comes first (unset: never).
    ``keep`` durable checkpoints are kept; older ones are deleted."""

    every_steps: Optional[int] = Field(None, ge=1)
    every_s: Optional[float] = Field(None, gt=0)
    keep: int = Field(2, ge=1, le=1000)


class Spec(_Section):
    """One experiment. ``workbench.load_spec`` builds it; ``to_dict`` round-trips."""

    name: str = Field("run", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    trainer: Literal[TRAINERS] = "torchft-lite"
    cluster: str = "local"
    replicas: int = Field(3, ge=1, le=1024)
    min_replicas: int = Field(1, ge=1, le=1024)
    nproc_per_replica: int = Field(1, ge=1, le=64)
    steps: int = Field(200, ge=1, le=10_000_000)
    seed: int = Field(0, ge=0)
    run_root: str = Field(default_factory=lambda: os.environ.get("WORKBENCH_RUN_ROOT", "runs"))
    relaunch: Literal["auto", "off"] = "auto"
    relaunch_delay_s: float = Field(0.0, ge=0, le=3600)
    max_restarts: int = Field(20, ge=0, le=10_000)
    spares: int = Field(0, ge=0, le=64)
    heartbeat_s: float = Field(1.0, gt=0, le=600)
    checksum_every: int = Field(10, ge=1)
    write_events: bool = True
    lighthouse: LighthouseSpec = Field(default_factory=LighthouseSpec)
    torchft: TorchftSpec = Field(default_factory=TorchftSpec)
    model: ModelSpec = Field(default_factory=ModelSpec)
    faults: list[FaultSpec] = Field(default_factory=list)
    chaos: Optional[ChaosSpec] = None
    hang: HangSpec = Field(default_factory=HangSpec)
    slurm: SlurmSpec = Field(default_factory=SlurmSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    titan: dict[str, Any] = Field(default_factory=dict)
    maxtext: dict[str, Any] = Field(default_factory=dict)

    @field_validator("cluster")
    @classmethod
    def _backend(cls, v: str) -> str:
        return _cluster_name(v)

    @model_validator(mode="after")
    def _cross_field(self) -> "Spec":
        if self.min_replicas > self.replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) must be <= replicas ({self.replicas})"
            )
        here = faultkinds.names(self.cluster)
        for i, f in enumerate(self.faults):
            if f.action not in here:
                raise ValueError(f"faults[{i}].action: {f.action} is not a fault on cluster {self.cluster}; "
                                 f"allowed: {', '.join(here)}")
            if f.target is not None and f.target >= self.replicas and faultkinds.KINDS[f.action].targets == "replica":
                raise ValueError(f"faults[{i}].target ({f.target}) must be < replicas ({self.replicas})")
        for a in self.chaos.actions if self.chaos else ():
            if a not in here:
                raise ValueError(f"chaos.actions: {a} is not a fault on cluster {self.cluster}; allowed: {', '.join(here)}")
        lh = self.lighthouse
        if _loopback_only(self.cluster) and not lh.allow_non_loopback and not is_loopback(lh.bind_host):
            raise ValueError(f"lighthouse.bind_host: {lh.bind_host!r} is not a loopback address; a {self.cluster} "
                             "run listens on 127.0.0.1 only (set lighthouse.allow_non_loopback: true to serve "
                             "quorums to the network)")
        if self.spares and not trainer_kind(self.trainer).supports_spares:
            with_spares = ", ".join(n for n in TRAINERS if trainer_kind(n).supports_spares)
            raise ValueError(f"spares ({self.spares}): hot spares are implemented for trainer {with_spares} only")
        if self.chaos and self.chaos.targets:
            bad = [t for t in self.chaos.targets if not 0 <= t < self.replicas]
            if bad:
                raise ValueError(f"chaos.targets {bad}: each must be in 0..{self.replicas - 1}")
        return self

    @property
    def pg_timeout_ms(self) -> int:
        return self.torchft.pg_timeout_ms or self.lighthouse.heartbeat_timeout_ms

    def to_dict(self) -> dict:
        return self.model_dump(mode="json")


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "spec"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
            parent = _model_at(e["loc"][:-1])
            if parent is not None:
                msg += f"; allowed: {', '.join(sorted(parent.model_fields))}"
        elif e["type"] == "literal_error":
            msg = f"got {e.get('input')!r}; {msg[0].lower()}{msg[1:]}"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        lines.append(f"{field}: {msg}")
    return "invalid spec: " + "; ".join(lines)


def _model_at(loc: Sequence[Any]) -> type[BaseModel] | None:
    model: Any = Spec
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        candidates = [ann, *args]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return None
    return model


def parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise SpecError(f"override {item!r}: expected key=value")
    key, _, raw = item.partition("=")
    key = key.strip()
    if not key:
        raise SpecError(f"override {item!r}: empty key")
    value = safe_yaml(raw, f"{key}") if raw.strip() else ""
    return key, value


def _set_dotted(d: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    cur = d
    for p in parts[:-1]:
        nxt = cur.get(p)
        if nxt is None:
            nxt = cur[p] = {}
        if not isinstance(nxt, dict):
            raise SpecError(f"{key}: {p} is not a section")
        cur = nxt
    cur[parts[-1]] = value


def resolve_config_path(config: str | os.PathLike) -> Path:
    p = Path(config)
    if p.exists():
        return p
    for cand in (CONFIG_DIR / p, CONFIG_DIR / f"{p}.yaml"):
        if cand.exists():
            return cand
    names = sorted(x.stem for x in CONFIG_DIR.glob("*.yaml"))
    raise SpecError(f"config: {str(config)!r} not found; shipped configs: {', '.join(names)}")


MAX_YAML_ALIASES = 50
MAX_DEPTH = 20
MAX_CONFIG_BYTES = 1_000_000


def safe_yaml(text: str, where: str):
    """``yaml.safe_load`` (no object construction), with aliases capped.

    Safe loading refuses tags that build Python objects; the cap stops an
    alias bomb (a few lines that expand exponentially when the spec is
    serialised into ``run.json``).
    """
    if len(text) > MAX_CONFIG_BYTES:
        raise SpecError(f"{where}: {len(text)} bytes; a config is at most {MAX_CONFIG_BYTES}")
    try:
        aliases = sum(isinstance(tok, yaml.AliasToken) for tok in yaml.scan(text))
        if aliases > MAX_YAML_ALIASES:
            raise SpecError(f"{where}: {aliases} YAML aliases; at most {MAX_YAML_ALIASES} are allowed")
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(f"{where}: not valid YAML for safe loading ({e})") from None
    except RecursionError:
        raise SpecError(f"{where}: nested too deeply; a spec is at most {MAX_DEPTH} levels deep") from None
    if _depth(data) > MAX_DEPTH:
        raise SpecError(f"{where}: nested too deeply; a spec is at most {MAX_DEPTH} levels deep")
    return data


def _depth(x, level: int = 0) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(x, dict):
        return max((_depth(v, level + 1) for v in x.values()), default=level + 1)
    if isinstance(x, list):
        return max((_depth(v, level + 1) for v in x), default=level + 1)
    return level


def load_yaml(path: Path) -> dict:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"config {path}: cannot read ({e})") from None
    data = safe_yaml(text, f"config {path}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(f"config {path}: top level must be a mapping, got {type(data).__name__}")
    return data


def load_spec(
    config: Union[str, os.PathLike, Mapping[str, Any], Spec, None] = None,
    overrides: Union[Sequence[str], Mapping[str, Any], None] = None,
    **kwargs: Any,
) -> Spec:
    """Build a validated :class:`Spec` from a config name/path/dict plus overrides.

    ``load_spec("demo", ["replicas=2"])``, ``load_spec("demo", {"model.dim": 32})``
    and ``load_spec(steps=50)`` all work; a dotted key reaches into a section.
    """
    if isinstance(config, Spec):
        data = config.to_dict()
    elif isinstance(config, Mapping):
        data = dict(config)
    elif config is None:
        data = {}
    else:
        data = load_yaml(resolve_config_path(config))
    items: list[tuple[str, Any]] = []
    if isinstance(overrides, Mapping):
        items.extend(overrides.items())
    elif overrides:
        if isinstance(overrides, str):
            overrides = [overrides]
        items.extend(parse_override(o) for o in overrides)
    items.extend(kwargs.items())
    for key, value in items:
        _set_dotted(data, key, value)
    if _depth(data) > MAX_DEPTH:
        raise SpecError(f"spec: nested too deeply; a spec is at most {MAX_DEPTH} levels deep")
    try:
        return Spec.model_validate(data)
    except ValidationError as e:
        raise SpecError(_format_errors(e)) from None


def _port_busy(host: str, port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def preflight(spec: Spec) -> list[str]:
    """World-facing and cross-field checks before submit.

    Raises :class:`SpecError` for what cannot work; returns warnings for what
    works badly. Each message names the values and says why. Nothing is
    created: the run root's writability is judged on its nearest existing
    ancestor.
    """
    root = Path(spec.run_root).expanduser().resolve()
    probe = root
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise SpecError(f"run_root: {str(root)!r} is not writable (checked {str(probe)!r})")
    lh, tf = spec.lighthouse, spec.torchft
    if lh.port is not None and _port_busy(lh.bind_host, lh.port):
        raise SpecError(f"lighthouse.port: {lh.bind_host}:{lh.port} is already in use; pick another or leave it unset")
    if lh.join_timeout_ms >= tf.quorum_timeout_s * 1000:
        raise SpecError(
            f"lighthouse.join_timeout_ms ({lh.join_timeout_ms}) must be below torchft.quorum_timeout_s "
            f"({tf.quorum_timeout_s} s): replicas would time out their quorum while the lighthouse still waits for stragglers"
        )
    warnings: list[str] = []
    hb = lh.heartbeat_timeout_ms
    if spec.pg_timeout_ms < hb:
        warnings.append(
            f"torchft.pg_timeout_ms ({spec.pg_timeout_ms}) < lighthouse.heartbeat_timeout_ms ({hb}): "
            "a slow step fails its collective and is discarded, yet the next quorum still waits "
            "for the heartbeat timeout"
        )
    if tf.quorum_timeout_s * 1000 <= hb:
        warnings.append(
            f"torchft.quorum_timeout_s ({tf.quorum_timeout_s}) must exceed lighthouse.heartbeat_timeout_ms "
            f"({hb} ms), or a quorum times out before a dead replica is dropped"
        )
    if lh.join_timeout_ms < 2 * lh.quorum_tick_ms:
        warnings.append(
            f"lighthouse.join_timeout_ms ({lh.join_timeout_ms}) < 2 × quorum_tick_ms ({lh.quorum_tick_ms}): "
            "a group that is already heartbeating (a replacement about to ask to join) is left out of the "
            "next quorum and splits off into a later one"
        )
    if trainer_kind(spec.trainer).elastic and spec.relaunch == "auto" and spec.replicas == 1:
        warnings.append("replicas is 1: a relaunched group has no live peer to heal from and restarts from scratch")
    for i, f in enumerate(spec.faults):
        if f.at_step is not None and f.at_step >= spec.steps:
            warnings.append(f"faults[{i}].at_step ({f.at_step}) >= steps ({spec.steps}): it never fires")
    key = trainer_kind(spec.trainer).checkpoint_period
    section, _, name = (key or "").partition(".")
    period = getattr(spec, section).get(name) if key else None
    if isinstance(period, int) and period > spec.steps:
        warnings.append(
            f"checkpoint period ({period}) is longer than the run (steps={spec.steps}): no checkpoint is "
            "ever written, so a restart starts from step 0"
        )
    if spec.hang.timeout_s is not None and spec.hang.timeout_s * 1000 < spec.pg_timeout_ms:
        warnings.append(
            f"hang.timeout_s ({spec.hang.timeout_s}) is shorter than the process-group timeout "
            f"({spec.pg_timeout_ms} ms): survivors waiting out a dead peer would be reported as hung"
        )
    return warnings
