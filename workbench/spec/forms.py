"""Range and form checks for spec values that leave Python as text: a seed, a flag, a script line, a file name.

Where each value goes, and so what it must not hold:

* seeds (``seed``, ``chaos.seed``): ``torch.manual_seed``, the torchft-lite batch generator's
  ``(seed * 1_000_003 + step) * 1009 + replica`` (a torch seed of 64 bits, overflowed from seed 1.8e10),
  MaxText's ``init_weights_seed``/``data_shuffle_seed``, TorchTitan's ``--debug.seed``, numpy's
  ``default_rng``. One range for all of them: :data:`SEED_MAX`, numpy's legacy seeds' own.
* the sbatch script submitit writes: each ``#SBATCH --key=value`` line (``slurm.partition``,
  ``account``, ``qos``, ``sbatch_args``; the log paths under ``run_root``), the ``setup`` lines and
  the ``srun`` line. submitit quotes each value with ``shlex.quote``, which keeps a newline: the
  rest of the value becomes a shell line of the job.
* Slurm's log file patterns: ``--output`` is ``<run_root>/<run>/jobs/.../%j/%j_%t_log.out``; Slurm
  expands every ``%`` in it and a ``\\`` turns the expansion off, so the logs land elsewhere.
* argv: the lighthouse's ``--bind host:port`` and its URL ``http://host:port``
  (``lighthouse.bind_host``); TorchTitan's tyro flags ``--<section>.<key> <value>``
  (``titan.overrides``, ``titan.extra_args``), where a value starting with ``-`` is read as the next
  flag; MaxText's ``key=value`` arguments (``maxtext``), where a list is written ``[a,b]``.
* environment: ``OMP_NUM_THREADS`` (``titan.threads``), ``SLURM_CONF`` (``slurm.conf``).

Each check raises :class:`SubfieldError`: ``spec.load`` appends its ``path`` to the field's name,
so the one line names the key at fault (``titan.overrides.training.seq_len: ...``).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Mapping

SEED_MAX = 2**32 - 1
"""The largest seed: numpy's legacy ``np.random.seed`` takes 0..2**32-1, and the torchft-lite batch seed
``(seed * 1_000_003 + step) * 1009 + replica`` fits torch's 64 bits with it (steps <= 10**7, replicas
<= 1024; measured: it overflows from seed 1.8e10)."""

TITAN_MAX_THREADS = 1024


class SubfieldError(ValueError):
    """A ValueError about a part of a field: ``path`` (``.key`` or ``[i]``) follows the field's name in the message."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def one_line(path: str, value: Any) -> str:
    """``value`` is a string of printable text on one line (no newline, tab or other control character)."""
    if not isinstance(value, str):
        raise SubfieldError(path, f"got {type(value).__name__} {value!r}; allowed: a string")
    if _CONTROL.search(value):
        raise SubfieldError(
            path, f"{value!r} has a control character (newline, tab, ...); allowed: one line of printable text"
        )
    return value


SBATCH_KEY = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,63}")
SBATCH_OWNED = {
    "time": "slurm.time_min",
    "nodes": "slurm.nodes",
    "ntasks-per-node": "slurm.tasks_per_node",
    "cpus-per-task": "slurm.cpus_per_task",
    "gpus-per-node": "slurm.gpus_per_node",
    "partition": "slurm.partition",
    "account": "slurm.account",
    "qos": "slurm.qos",
    "requeue": "slurm.requeue",
    "no-requeue": "slurm.requeue",
    "output": "",
    "error": "",
    "open-mode": "",
    "array": "",
    "job-name": "",
}
"""sbatch options the job's script already sets: from a spec field, or (empty) by submitit itself for the
job's log files and name. A second one would override the first and move the logs the workbench reads."""


def sbatch_args(value: Mapping[str, str]) -> Mapping[str, str]:
    """Extra ``#SBATCH --key=value`` lines: an option name each, not one the script sets, values on one line."""
    for key, text in value.items():
        if not SBATCH_KEY.fullmatch(key):
            raise SubfieldError(
                "", f"key {key!r}: an sbatch option name; allowed: letters, digits and '-', starting with a letter"
            )
        if key in SBATCH_OWNED:
            owner = SBATCH_OWNED[key]
            by = f"set it with {owner}" if owner else "submitit sets it for the job's logs and name"
            raise SubfieldError("", f"key {key!r}: the job's script sets --{key} already; {by}")
        one_line(f"[{key}]", text)
    return value


SLURM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def slurm_name(value: str | None, what: str, several: bool = False) -> str | None:
    """A Slurm partition, account or QOS name (several joined by ',' where ``several``)."""
    if value is None:
        return value
    names = value.split(",") if several else [value]
    if not all(SLURM_NAME.fullmatch(n) for n in names):
        joined = ", or several joined by ','" if several else ""
        raise SubfieldError(
            "",
            f"{value!r} is not a Slurm {what} name; allowed: letters, digits, '_', '.' and '-', "
            f"starting with a letter, digit or '_'{joined}",
        )
    return value


HOST_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252})")


def host(value: str) -> str:
    """An IP address or a host name: it becomes ``--bind host:port`` and the URL ``http://host:port``."""
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if not HOST_NAME.fullmatch(value):
        raise SubfieldError(
            "",
            f"{value!r} is not an IP address or a host name; allowed: an IP address, or letters, digits, "
            "'-', '_' and '.' starting with a letter, digit or '_'",
        )
    return value


def run_root(value: str) -> str:
    """A directory path for Slurm's log patterns as well as the file system: one line, no ``%`` or ``\\``."""
    one_line("", value)
    bad = sorted({c for c in value if c in "%\\"})
    if bad:
        raise SubfieldError(
            "",
            f"{value!r} has {' and '.join(repr(c) for c in bad)}; Slurm reads '%' and '\\' in the job's log path "
            "as patterns; allowed: a path without them",
        )
    return value


# -- the free-form trainer sections -------------------------------------------------------------
TITAN_FLAG = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*(?:\.[A-Za-z_][A-Za-z0-9_-]*)*")
MAXTEXT_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
_SCALARS = (str, int, float, bool)


def _kind(value: Any) -> str:
    """A value's type in the spec's (YAML's) words."""
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    return "a list" if isinstance(value, list) else type(value).__name__


def titan_section(value: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``titan`` that the job turns into a path, an environment variable or argv.

    ``config``: the TOML's name or path. ``threads``: ``OMP_NUM_THREADS``. ``overrides``:
    ``{"section.key": value}``, each one ``--section.key value`` (a bool: ``--section.[no_]key``, a list:
    ``a,b``). ``extra_args``: argv elements as they are. ``checkpoint_interval``: TorchTitan's
    ``--checkpoint.interval`` in steps. Other keys are left to the trainer.
    """
    if "config" in value:
        one_line(".config", value["config"])
    if "checkpoint_interval" in value:
        every = value["checkpoint_interval"]
        if isinstance(every, bool) or not isinstance(every, int) or not 1 <= every <= 10_000_000:
            raise SubfieldError(".checkpoint_interval", f"got {every!r}; allowed: an integer 1..10000000 (steps)")
    if "threads" in value:
        threads = value["threads"]
        if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= TITAN_MAX_THREADS:
            raise SubfieldError(
                ".threads", f"got {threads!r}; allowed: an integer 1..{TITAN_MAX_THREADS} (OMP_NUM_THREADS per rank)"
            )
    if "overrides" in value:
        overrides = value["overrides"]
        if not isinstance(overrides, dict):
            raise SubfieldError(".overrides", f"got {_kind(overrides)}; allowed: a mapping of 'section.key' to a value")
        for key, flag_value in overrides.items():
            if not isinstance(key, str) or not TITAN_FLAG.fullmatch(key):
                raise SubfieldError(
                    ".overrides",
                    f"key {key!r} is not a TorchTitan flag name; allowed: names of letters, digits, '_' and '-' "
                    "joined by '.' (section.key)",
                )
            _titan_value(f".overrides.{key}", flag_value)
    if "extra_args" in value:
        extra = value["extra_args"]
        if not isinstance(extra, list):
            raise SubfieldError(".extra_args", f"got {_kind(extra)}; allowed: a list of argv strings")
        for i, arg in enumerate(extra):
            one_line(f".extra_args[{i}]", arg)
    return value


def _titan_value(path: str, value: Any) -> None:
    if value is None or isinstance(value, (bool, int, float)):
        return
    if isinstance(value, str):
        one_line(path, value)
        if value.startswith("-") and not _NUMBER.fullmatch(value):
            raise SubfieldError(
                path,
                f"{value!r} starts with '-': TorchTitan would read it as a flag; allowed: a value not starting "
                "with '-', or a number",
            )
        return
    if isinstance(value, list) and all(v is None or isinstance(v, _SCALARS) for v in value):
        for i, v in enumerate(value):
            _titan_value(f"{path}[{i}]", v)
            if isinstance(v, str) and "," in v:
                raise SubfieldError(
                    f"{path}[{i}]", f"{v!r} has ','; the list is passed as one value a,b; allowed: items without ','"
                )
        return
    raise SubfieldError(
        path,
        f"got {_kind(value)}; allowed: a string, number, boolean, null or a list of those "
        "(a nested key is written whole: {section.key: value})",
    )


def maxtext_section(value: dict[str, Any]) -> dict[str, Any]:
    """MaxText's ``base.yml`` keys, each one ``key=value`` argument: a config key, a one-line value."""
    for key, item in value.items():
        if not isinstance(key, str) or not MAXTEXT_KEY.fullmatch(key):
            raise SubfieldError(
                "", f"key {key!r} is not a MaxText config key; allowed: names of letters, digits and '_' joined by '.'"
            )
        path = f".{key}"
        if isinstance(item, str):
            one_line(path, item)
        elif isinstance(item, list) and all(isinstance(v, _SCALARS) for v in item):
            for i, v in enumerate(item):
                if isinstance(v, str):
                    one_line(f"{path}[{i}]", v)
                    if any(c in v for c in ",[]"):
                        raise SubfieldError(
                            f"{path}[{i}]",
                            f"{v!r} has ',', '[' or ']'; the list is written [a,b]; allowed: items without them",
                        )
        elif not isinstance(item, _SCALARS):
            raise SubfieldError(path, f"got {_kind(item)}; allowed: a string, number, boolean or a list of those")
    return value
