"""A field of an event: its name, what it means, whether every writer writes it, and its values.

``required`` means every writer of the kind writes the field (possibly ``null``), so a
reader may index it; any other field may be absent, and a writer may add fields no
reader needs yet. ``values``: the members of a :mod:`~workbench.events.states` enum the
field takes, where it takes one of a set of strings. A kind's field named like a common
one replaces it (a ``fault``'s ``pid`` is the process signalled, not the writer).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Iterable, NamedTuple


class Field(NamedTuple):
    """One field of an event: its name, what it means, whether every writer writes it, the values it takes."""

    name: str
    meaning: str
    required: bool = False
    values: tuple[StrEnum, ...] = ()  # members of one enum of workbench.events.states; () where it is not a set


def required(name: str, meaning: str, values: Iterable[StrEnum] = ()) -> Field:
    return Field(name, meaning, True, tuple(values))


def optional(name: str, meaning: str, values: Iterable[StrEnum] = ()) -> Field:
    return Field(name, meaning, False, tuple(values))


COMMON_FIELDS = (
    required("t", "unix seconds (float) on the writer's host"),
    required("kind", "one of the kinds below"),
    required("run", "run id (`null` in a sweep's directory)"),
    required("replica", "replica group index, or `null` for run-wide writers"),
    required("attempt", "relaunch count of that replica, from 0"),
    required("host", "where the writer runs"),
    required("pid", "the writer's process"),
    optional("sweep", "sweep id, in a sweep's directory"),
    optional("spare", "a hot spare's index, on its own events until it is assigned"),
)
