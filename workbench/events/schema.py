"""The event log's schema as one document: ``docs/events.md`` is written from it.

The schema itself is typed Python: :mod:`~workbench.events.layout` (the writers and their
files), :mod:`~workbench.events.fields` (a field, and those on every event),
:mod:`~workbench.events.kinds` (every kind, its writers and fields) and
:mod:`~workbench.events.states` (the sets of values, and the states the fold derives).
This module renders them, with the prose below, as Markdown, so the document cannot say
something the code does not: ``python -m workbench.events.schema --markdown`` rewrites
``docs/events.md``, ``--check`` fails if it is stale, and ``tests/test_event_schema.py``
runs the check.
"""

from __future__ import annotations

import argparse
import sys
from enum import StrEnum
from pathlib import Path
from typing import Iterable, Optional

from workbench.events import states
from workbench.events.fields import COMMON_FIELDS, Field
from workbench.events.kinds import Kind
from workbench.events.layout import ANY_WRITER, EVENTS_DIR, Writer

DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"

INTRO = f"""\
# Event schema

<!-- Written by `python -m workbench.events.schema --markdown` from workbench/events/{{layout,fields,kinds,states}}.py:
edit those, not this file (tests/test_event_schema.py fails when the two differ). -->

Every process that reports something owns one append-only file,
`<run_dir>/{EVENTS_DIR}/<writer>.jsonl`, one JSON object per line (see `workbench/events/writer.py` and
`workbench/events/reader.py` for the protocol: whole-line appends, readers keep byte offsets and leave a
torn last line for later). A field marked *required* is written by every writer of its kind (possibly
`null`); any other may be absent, and writers may add fields that no reader needs yet. A kind's field
named like a common one replaces it (a `fault`'s `pid` is the process signalled, not the writer)."""

# The sets of values, in the order the document lists them.
VALUE_SETS: tuple[type[StrEnum], ...] = (
    states.ReplicaState,
    states.RunStatus,
    states.RunEndReason,
    states.ExitReason,
    states.CheckpointState,
    states.JobState,
    states.LighthouseState,
    states.NodeState,
    states.Role,
    states.Phase,
    states.FaultOrigin,
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _doc(enum: type) -> str:
    return " ".join((enum.__doc__ or "").split()).replace("``", "`")


def _field_rows(fields: Iterable[Field]) -> list[str]:
    rows = ["| field | | meaning |", "|---|---|---|"]
    for f in fields:
        meaning = f.meaning
        if f.values:
            meaning += f": {', '.join(f'`{v}`' for v in f.values)} (`{type(f.values[0]).__name__}`, below)"
        rows.append(f"| `{f.name}` | {'required' if f.required else ''} | {_cell(meaning)} |")
    return rows


def _writers(kind: Kind) -> str:
    return "any writer" if kind.writers == ANY_WRITER else ", ".join(w.value for w in kind.writers)


def render() -> str:
    """``docs/events.md``, from the schema."""
    out = [INTRO, "", "## Writers", "", "| writer | file | who |", "|---|---|---|"]
    out += [f"| {w.value} | `{w.file}` | {_cell(w.who)} |" for w in Writer]
    out += ["", "## Common fields", "", *_field_rows(COMMON_FIELDS)]
    out += ["", "## Kinds", "", "| kind | writer | what |", "|---|---|---|"]
    out += [f"| `{k.value}` | {_writers(k)} | {_cell(k.summary)} |" for k in Kind]
    for k in Kind:
        out += ["", f"### `{k.value}`", "", f"Written by {_writers(k)}: {k.summary}."]
        if k.fields:
            out += ["", *_field_rows(k.fields)]
        if k.notes:
            out += ["", k.notes]
    out += ["", "## Values", "", "The sets of strings some fields take, and the states the run-state fold derives."]
    for enum in VALUE_SETS:
        props = _properties(enum)
        out += ["", f"### `{enum.__name__}`", "", _doc(enum), ""]
        out += ["| " + " | ".join(["value", *props]) + " |", "|---" * (len(props) + 1) + "|"]
        out += ["| " + " | ".join([f"`{m.value}`", *(_value(getattr(m, p)) for p in props)]) + " |" for m in enum]
    return "\n".join(out) + "\n"


def _properties(enum: type) -> list[str]:
    """The properties its members carry (``meaning`` first), as the class annotates them."""
    names = [n for cls in reversed(enum.__mro__) for n in vars(cls).get("__annotations__", {}) if not n.startswith("_")]
    return sorted(dict.fromkeys(names), key=lambda n: n != "meaning")


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "yes" if v else ""
    return f"`{v}`" if isinstance(v, StrEnum) else _cell(str(v))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workbench.events.schema", description="docs/events.md from the schema"
    )
    parser.add_argument("--markdown", action="store_true", help="write the document")
    parser.add_argument("--check", action="store_true", help="exit 1 if the document differs from the schema")
    parser.add_argument("--path", type=Path, default=DOC, help=f"the document (default: {DOC})")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        stale = not args.path.exists() or args.path.read_text() != text
        print(f"{args.path}: {'stale; run python -m workbench.events.schema --markdown' if stale else 'up to date'}")
        return 1 if stale else 0
    if args.markdown:
        args.path.write_text(text)
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
