"""Step rows from the events files' bytes, through pyarrow, as pandas' list-of-dicts constructor builds them.

:class:`~workbench.analysis.step_columns.StepColumns` parses each file's new
bytes with :func:`arrow_chunk` (why pyarrow, and what was measured against it:
``step_columns``); the step index (``step_index``) decodes its columns with
the same conversions (:func:`column_to_numpy`, :func:`object_array`,
:func:`inferred_column`), so that a frame is the same whether it came from the
log, the index, or event dicts (``metrics_frame``): numbers and bools as numpy
arrays, anything else as objects, NaN where a row lacks a field, nested values
as Python lists.

A chunk that cannot be read this way exactly raises ``ValueError`` (pyarrow's
``ArrowInvalid`` is one), and the caller reads it line by line instead.
"""

from __future__ import annotations

import contextlib
import gc
import io

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from pandas.api.extensions import ExtensionArray

from workbench.analysis.metrics import DROPPED


@contextlib.contextmanager
def gc_paused():
    """The cyclic garbage collector off meanwhile (and back on after, if it was on)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


KIND_STEP = b'"kind": "step"'
_KIND = b'"kind": "'


def step_lines(data: bytes) -> bytes:
    """The lines that may be step events: all but those whose writer-formatted ``kind`` is another one.

    A cheap byte test (``EventWriter`` writes ``"kind": "<kind>"``); a line
    written otherwise is kept and decided after parsing. Dropping the other
    kinds first also keeps their fields' types out of the step columns.
    """
    keep = [line for line in data.splitlines(keepends=True) if KIND_STEP in line or _KIND not in line]
    return b"".join(keep)


def arrow_chunk(data: bytes, lines: int, only_steps: bool) -> pd.DataFrame:
    table = pj.read_json(io.BytesIO(data))  # 1 MiB blocks, parsed on all cores
    if "kind" not in table.column_names or not pa.types.is_string(table.schema.field("kind").type):
        raise ValueError("no string kind column")
    if table.num_rows != lines:
        raise ValueError("row count differs from the line count")  # blank lines, two objects on a line: per line
    if "t" in table.column_names:
        t = table.schema.field("t").type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t)) or table.column("t").null_count:
            raise ValueError("t is not a number on every line")
    if table.column("kind").null_count:
        raise ValueError("a line without kind")
    if "t" not in table.column_names:
        raise ValueError("no t")
    mask = pc.equal(table.column("kind"), "step")
    table = table.drop_columns([n for n in DROPPED if n in table.column_names]).filter(mask)
    if not table.num_rows:
        return pd.DataFrame()
    cols, names = [], []
    any_null = None
    for name in table.column_names:
        if name in DROPPED:
            continue
        col = table.column(name).combine_chunks()
        if col.null_count == len(col):
            if not only_steps:
                if any_null is None:
                    any_null = b": null" in data
                if any_null and f'"{name}": null'.encode() in data:
                    raise ValueError(f"{name}: a line has it as null; which kind, only the bytes tell")
                continue  # only lines of other kinds have it
            if f'"{name}": '.encode() not in data:
                continue  # no step line has it
            values = np.empty(len(col), dtype=object)  # every step line has it, as null
            cols.append(values)
            names.append(name)
            continue
        cols.append(column_to_numpy(col))
        names.append(name)
    return pd.DataFrame({n: (inferred_column(c) if c.dtype == object else c) for n, c in zip(names, cols)}, copy=False)


def column_to_numpy(col) -> np.ndarray:
    """A column as pandas' list-of-dicts constructor would see it: numbers/bools as arrays, the rest as objects.

    A missing value is NaN, as it is for a key a dict lacks; nested values are Python lists.
    """
    t = col.type
    if col.null_count == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
        arr = col.to_numpy(zero_copy_only=False)
        return arr.astype(np.int64, copy=False) if pa.types.is_integer(t) else arr
    if pa.types.is_floating(t):
        return col.to_numpy(zero_copy_only=False)
    if pa.types.is_list(t) and col.null_count == 0:
        values = _lists(col)
    else:
        values = col.to_pylist() if (pa.types.is_nested(t) or col.null_count) else col.to_numpy(zero_copy_only=False)
    out = object_array(values)
    if col.null_count:
        out[np.asarray(col.is_null())] = np.nan
    return out


def inferred_column(values: np.ndarray) -> np.ndarray | ExtensionArray:
    """An object column in the dtype pandas' list-of-dicts constructor gives it: int64, float64 (a
    number missing from a row), bool, ``str``, or object as it was (lists, mixed types); a numpy dtype
    as an ndarray, ``str`` as its extension array.

    That constructor converts its object columns with ``convert_object_array``, a private name of
    ``pandas.core.internals.construction``, which these readers once called. The public
    ``Series.infer_objects`` does the same soft conversion (``maybe_convert_objects`` with
    non-numeric conversion on), with the same dtypes and values for every kind of value JSON holds
    (checked: None, NaN, bools, ints, floats, strings, lists, dicts, and their mixtures, pandas 3.1),
    at the same speed: that pass is the cost (2-7 ms per 50,000 values either way; the Series adds
    some 20 µs per column). Measured on the benchmark's log (``bench/pipeline.py``), medians of 7,
    private against public: a cold read of 50,000 steps 273 against 272 ms, a read of 3 new steps
    11.5 against 13.3 ms (minimums 10.5 and 10.3): the same, within this loaded machine's noise.
    """
    series = pd.Series(values, copy=False).infer_objects()
    return series.to_numpy() if isinstance(series.dtype, np.dtype) else series.array


def object_array(values) -> np.ndarray:
    """A 1-d object array holding each value as it is (a list stays one element). ``fromiter``, not
    slice assignment, which first probes the values as a nested sequence: 0.4 against 2.1 ms for
    50,000 lists of three ints."""
    return np.fromiter(values, dtype=object, count=len(values))


def _lists(col) -> list:
    """A list column as Python lists, equal to ``to_pylist()`` (ints, floats, bools in each), without
    a Python object per arrow scalar: the flat values go through numpy's ``tolist`` and are cut by the
    offsets (measured: 31 ms for the benchmark's 50,000 ``batch_seed`` triples with ``to_pylist``)."""
    flat = col.flatten()
    vt = flat.type
    if flat.null_count or not (pa.types.is_integer(vt) or pa.types.is_floating(vt) or pa.types.is_boolean(vt)):
        return col.to_pylist()
    items = flat.to_numpy(zero_copy_only=False)
    if pa.types.is_integer(vt):
        items = items.astype(np.int64, copy=False)
    offsets = np.asarray(col.offsets)
    offsets = offsets - offsets[0]
    lens = np.diff(offsets)
    if len(lens) and lens[0] > 0 and bool((lens == lens[0]).all()):
        return items.reshape(len(lens), int(lens[0])).tolist()
    items = items.tolist()
    bounds = offsets.tolist()
    return [items[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
