"""The controller's columnar index of a run's step rows: ``<run_dir>/index/steps.arrow``.

Why: a cold ``metrics()`` (a new kernel attaching to a run) otherwise parses
every step line the run wrote. pyarrow's JSON reader is the fastest parser
found for that (``step_columns``), and its parse alone of the benchmark's
50,003-event log is about 70 ms on this machine: no read of the log can pass
about 700k rows/s. The controller already reads every byte the run writes, so
it keeps a :class:`~workbench.analysis.step_columns.StepColumns` of its own and writes what
it holds, as columns, every ``PERIOD_S`` while step rows arrive and once when
the run ends. A reader starts from the index and parses only the bytes
appended after it.

Protocol
--------
- One writer, the run's controller. It writes a temporary file and renames it
  over the old one, so a reader opens either a whole index or the previous one.
- The index is an Arrow IPC file of the reader's held step rows (before the
  ``STEP_COLUMNS`` arrangement) with, in its schema metadata, the byte offset
  in each events file up to which the rows are in it, and the reader's
  counters (lines skipped, chunks read line by line).
- It is derived data: deleting it loses nothing. A reader ignores an index it
  cannot read, of another version, or that is ahead of a file (a file shorter
  than its offset), and parses the log as if there were none.
- Columns are written only in encodings that read back to the same values and
  dtypes: numbers and bools as they are, a column of equal-typed lists of ints
  or bools as an Arrow list, strings (NaN where a row lacks one) as strings,
  anything else as JSON text per value. Before writing, the writer decodes
  what it is about to write and compares it with what it holds; a frame that
  does not survive that is not indexed (the old index, a prefix, stays valid).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd
import pyarrow as pa

from workbench.analysis.step_parse import column_to_numpy, gc_paused, object_array

log = logging.getLogger(__name__)

INDEX = Path("index") / "steps.arrow"
VERSION = "1"
PERIOD_S = 30.0
_ENC = b"workbench.enc"


def path_of(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / INDEX


def write(columns, run_dir: str | os.PathLike) -> bool:
    """Read ``columns``' new bytes and write what it holds as the run's index; False when not written.

    Nothing is written when the held rows are not exactly encodable (see the module's protocol) or
    the run directory is not writable (logged once per call, never raised: the controller keeps going).
    """
    with gc_paused():
        return _write(columns, run_dir)


def _write(columns, run_dir: str | os.PathLike) -> bool:
    held, offsets, counters = columns.held()
    if held is None:
        return False
    table = _encode(held)
    if table is None or not _same(_decode(table), held):
        return False
    meta = {"version": VERSION, "offsets": {p.name: off for p, off in offsets.items()}, **counters}
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"workbench": json.dumps(meta).encode()})
    path = path_of(run_dir)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as out:
            out.write_table(table)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("step index %s not written: %s", path, e)
        tmp.unlink(missing_ok=True)
        return False
    return True


def read(run_dir: str | os.PathLike, events_dir: Path) -> Optional[tuple[pd.DataFrame, dict[Path, int], dict]]:
    """The index's held rows, its offsets per events file and its counters; None when there is no usable index.

    The cyclic garbage collector is paused meanwhile, as in ``StepColumns.read``: the list values are
    many small objects without cycles (measured: 25 ms with it paused, 65-72 ms without, 50,000 rows).
    """
    with gc_paused():
        return _read(run_dir, events_dir)


def _read(run_dir: str | os.PathLike, events_dir: Path) -> Optional[tuple[pd.DataFrame, dict[Path, int], dict]]:
    path = path_of(run_dir)
    try:
        with pa.OSFile(str(path)) as source:  # read, not mapped: the controller replaces the file under us
            table = pa.ipc.open_file(source).read_all()
        meta = json.loads((table.schema.metadata or {})[b"workbench"])
        if meta.get("version") != VERSION:
            return None
        offsets = {events_dir / name: int(off) for name, off in meta["offsets"].items()}
        for p, off in offsets.items():
            if os.stat(p).st_size < off:
                return None
        held = _decode(table)
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None
    return held, offsets, {k: int(meta.get(k, 0)) for k in ("skipped_lines", "fallback_chunks")}


def _encode(df: pd.DataFrame):
    arrays, fields = [], []
    for name in df.columns:
        col = df[name]
        values = col.to_numpy()
        dtype = col.dtype
        if isinstance(dtype, np.dtype) and dtype.kind in "iufb":
            arr, enc = pa.array(values), b"plain"
        elif isinstance(dtype, np.dtype) and dtype.kind == "O":
            arr, enc = _encode_objects(values)
        elif str(dtype) == "str":
            arr, enc = pa.array(values.astype(object), type=pa.string(), from_pandas=True), b"str"
        else:
            return None
        if arr is None:
            return None
        arrays.append(arr)
        fields.append(pa.field(str(name), arr.type, metadata={_ENC: enc}))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _encode_objects(values: np.ndarray):
    kinds = {type(v) for v in values}
    if kinds == {list}:
        try:
            arr = pa.array(values.tolist())
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            arr = None
        if arr is not None and (pa.types.is_integer(arr.type.value_type) or pa.types.is_boolean(arr.type.value_type)):
            if not arr.flatten().null_count and not arr.null_count:
                return arr, b"list"
    if kinds <= {str, float} and all(type(v) is str or v != v for v in values):
        return pa.array(values, type=pa.string(), from_pandas=True), b"object-str"
    try:
        text = [None if type(v) is float and v != v else json.dumps(v, allow_nan=True) for v in values]
    except (TypeError, ValueError):
        return None, b""
    return pa.array(text, type=pa.string()), b"json"


def _decode(table) -> pd.DataFrame:
    out = {}
    for field, col in zip(table.schema, table.columns):
        enc = (field.metadata or {}).get(_ENC)
        col = col.combine_chunks()
        if enc == b"plain":
            out[field.name] = col.to_numpy(zero_copy_only=False)
        elif enc in (b"list", b"object-str"):  # as the log's parse reads them: lists, strings, NaN for a null
            out[field.name] = column_to_numpy(col)
        elif enc == b"str":
            out[field.name] = pd.array(column_to_numpy(col), dtype="str")
        elif enc == b"json":
            out[field.name] = object_array([np.nan if v is None else json.loads(v) for v in col.to_pylist()])
        else:
            raise ValueError(f"column {field.name}: unknown encoding {enc!r}")
    return pd.DataFrame(out, copy=False)


def _same(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    try:
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    except AssertionError:
        return False
    return True
