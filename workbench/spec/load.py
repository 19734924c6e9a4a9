"""From a config and overrides to a validated :class:`~workbench.spec.models.Spec`.

A spec is a YAML file in ``configs/`` plus overrides, either ``key=value``
strings (dotted keys reach into sections: ``lighthouse.heartbeat_timeout_ms=500``)
or a dict. Values in ``key=value`` are parsed as YAML scalars, so ``replicas=3``
is an int and ``relaunch=off`` a string. YAML is loaded safely (no object
construction), with aliases, size and nesting depth capped; every failure is
one :class:`~workbench.errors.SpecError` naming the field.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import yaml
from pydantic import BaseModel, ValidationError

from workbench.errors import SpecError
from workbench.paths import CONFIG_DIR
from workbench.spec.forms import SubfieldError
from workbench.spec.models import Spec


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
            msg = msg[len("Value error, ") :]
            error = (e.get("ctx") or {}).get("error")
            if isinstance(error, SubfieldError):
                field += error.path
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
        raise SpecError(f"{where}: not valid YAML for safe loading ({' '.join(str(e).split())})") from None
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
        data = copy.deepcopy(dict(config))  # a dotted override must not reach into the caller's sections
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
