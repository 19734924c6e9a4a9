"""The columnar read path of a run's step metrics: :class:`StepColumns`, what ``Run.metrics()`` reads.

Its frame equals :func:`~workbench.analysis.metrics.metrics_frame` of all the
run's events. Each events file's new bytes (the reader's protocol: byte
offsets, a torn last line left for the next read) go through pyarrow's JSON
reader (``step_parse``) straight into columns, step rows only, without one
Python dict per line. Measured on the benchmark's 50,003-event log
(``bench/pipeline.py``, 15 MB) on this 2-core machine under load: dicts then
frame ~70-110k steps/s; parse only: orjson per line ~160k/s, msgspec into
typed structs ~0.9M/s (but it drops fields it was not told about), pyarrow
(1 MiB blocks, both cores) 0.75-1M/s, polars' ``read_ndjson`` 0.65-0.85M/s.
Polars was not taken: it silently drops a field that first appears after its
inference window and turns an int into a string where a later line has one;
pyarrow errors instead, and an error sends the chunk down the exact per-line
path.

After the parse, the chunks are merged as numpy columns (rows reordered only
when ``t`` is out of order: numpy's stable sort merges the files' sorted runs)
and list fields become Python lists through numpy's ``tolist``, not arrow's
``to_pylist``. Measured per stage on the same log (issue 19, load 1.1): read
10 ms, line counts 6, pyarrow parse 102, step filter 5, to numpy 8, frames,
merge and sort 11: the parse is the bound. No faster parser was found here:
an explicit pyarrow schema (no gain), polars with a schema (87 vs pyarrow's
101 ms in one session, slower in others), msgspec into structs (135 ms, one
core), pyarrow's CSV tokenizer after rewriting ``": `` (56-67 vs 71-90 ms,
and it would need its own JSON validation).

That floor is for a log read from its start. A run the workbench ran has
the controller's step index (``step_index``): ``StepColumns`` starts from it
and parses only the bytes written after it.

A chunk pyarrow refuses (a malformed line, a diverged loss written as
``NaN``, a field whose type changes) is read line by line instead, exactly as
:class:`~workbench.events.reader.EventReader` does (bad lines counted in
``skipped_lines``); the result is the same frame either way (``tests/test_metrics_columns.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import numpy as np
import orjson
import pandas as pd

from workbench.analysis import step_index
from workbench.analysis.metrics import arrange_steps
from workbench.analysis.step_parse import KIND_STEP, arrow_chunk, gc_paused, inferred_column, step_lines
from workbench.events.layout import EVENTS_DIR
from workbench.events.reader import new_lines


class StepColumns:
    """Incremental, columnar reader of a run's step events: ``frame()`` equals ``metrics_frame(all events)``.

    One byte offset per events file, as :class:`~workbench.events.reader.EventReader`;
    each read parses only what was appended since, into a small DataFrame of
    that chunk's step rows, kept; ``frame()`` concatenates them (cached until
    new rows arrive): as numpy columns when every chunk has the same columns
    and dtypes, through pandas' alignment otherwise.
    """

    def __init__(self, run_dir: str | os.PathLike, index: bool = True) -> None:
        self.dir = Path(run_dir) / EVENTS_DIR
        self._offsets: dict[Path, int] = {}
        self._chunks: list[pd.DataFrame] = []
        self._frame: Optional[pd.DataFrame] = None
        self.skipped_lines = 0
        self.fallback_chunks = 0
        self.indexed_rows = 0
        if index:  # start from the controller's index, when there is a usable one: parse only what follows it
            found = step_index.read(run_dir, self.dir)
            if found is not None:
                held, self._offsets, counters = found
                self._chunks = [held] if len(held) else []
                self.skipped_lines, self.fallback_chunks = counters["skipped_lines"], counters["fallback_chunks"]
                self.indexed_rows = len(held)

    def read(self) -> int:
        """Read every file's new complete lines; returns the number of step rows added.

        The cyclic garbage collector is paused meanwhile: the rows' nested values (lists) are many
        small objects that make no cycles, and collections triggered by them walked the whole heap
        (measured: 371 → 227 ms for the benchmark's log read right after a dict-based read).
        """
        with gc_paused():
            return self._read()

    def _read(self) -> int:
        added = 0
        for data in new_lines(self.dir, self._offsets):
            chunk = self._parse(data)
            if chunk is not None and len(chunk):
                self._chunks.append(chunk)
                added += len(chunk)
        if added:
            self._frame = None
        return added

    def frame(self) -> pd.DataFrame:
        self.read()
        if self._frame is None:
            if not self._chunks:
                self._frame = arrange_steps(pd.DataFrame())
            else:
                df, in_t_order = self._consolidate()
                self._frame = arrange_steps(df.copy(deep=False), in_t_order)  # adds columns; the held chunk stays
        return self._frame.copy(deep=False)

    def held(self) -> tuple[Optional[pd.DataFrame], dict[Path, int], dict]:
        """After reading the new bytes: every step row read so far as one frame (before ``arrange_steps``),
        the byte offset per file it covers, and the counters; what ``step_index`` writes."""
        self.read()
        counters = {"skipped_lines": self.skipped_lines, "fallback_chunks": self.fallback_chunks}
        held = self._consolidate()[0] if self._chunks else None
        return held, dict(self._offsets), counters

    def _consolidate(self) -> tuple[pd.DataFrame, bool]:
        """The chunks as one held frame (a live run adds a chunk per poll: each is concatenated once),
        in ``t`` order where it can be, so that the next poll's (later) rows append in order."""
        cols = _concat_columns(self._chunks)
        in_t_order = cols is not None and _t_sortable(cols)
        if cols is None:  # chunks of different columns or dtypes: pandas' own alignment
            df = self._chunks[0] if len(self._chunks) == 1 else _concat(self._chunks)
        else:
            df = pd.DataFrame(_in_t_order(cols) if in_t_order else cols, copy=False)
        self._chunks = [df]
        return df, in_t_order

    def _parse(self, data: bytes) -> Optional[pd.DataFrame]:
        lines = data.count(b"\n")
        head = data[:65536]
        # Mostly step lines at the head (the benchmark's log): parse it all, filter in arrow. Otherwise
        # the other kinds are dropped as bytes first, so that their fields' types cannot clash with a step's.
        mostly_steps = head.count(KIND_STEP) >= 0.9 * head.count(b"\n")
        candidate = data if mostly_steps else step_lines(data)
        if not candidate:
            return None
        try:
            return arrow_chunk(
                candidate, lines if mostly_steps else candidate.count(b"\n"), only_steps=not mostly_steps
            )
        except (ValueError, TypeError, KeyError):  # pyarrow.ArrowInvalid is a ValueError
            pass
        if mostly_steps:
            candidate = step_lines(data)
            try:
                return arrow_chunk(candidate, candidate.count(b"\n"), only_steps=True)
            except (ValueError, TypeError, KeyError):
                pass
        self.fallback_chunks += 1
        return self._per_line(candidate)

    def _per_line(self, steps: bytes) -> pd.DataFrame:
        """EventReader's rules, line by line: a bad line (not JSON, not an event) is skipped and counted."""
        rows = []
        for line in steps.splitlines():
            if not line.strip():
                continue
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                try:
                    event = json.loads(line)
                except ValueError:
                    self.skipped_lines += 1
                    continue
            if isinstance(event, dict) and "kind" in event and isinstance(event.get("t", 0.0), (int, float)):
                if event.get("kind") == "step":
                    rows.append(event)
            else:
                self.skipped_lines += 1
        return pd.DataFrame(rows)


def _concat(chunks: list[pd.DataFrame]) -> pd.DataFrame:
    """Chunks as one frame, each object column re-inferred as the list-of-dicts constructor infers it
    (a column of strings in one chunk and absent in another is ``str`` there, ``object`` after a concat)."""
    df = pd.concat(chunks, ignore_index=True, sort=False)
    for name in [c for c in df.columns if df[c].dtype == object]:
        df[name] = inferred_column(df[name].to_numpy(dtype=object))
    return df


def _concat_columns(chunks: list[pd.DataFrame]) -> Optional[dict]:
    """The chunks' columns concatenated as numpy arrays, when every chunk has the same columns and dtypes
    (what ``_concat`` then gives too, without pandas' alignment); None otherwise.

    Object and string columns are concatenated as objects and re-inferred as ``_concat`` does.
    """
    first = chunks[0]
    names, dtypes = list(first.columns), list(first.dtypes)
    for c in chunks[1:]:
        if list(c.columns) != names or list(c.dtypes) != dtypes:
            return None
    out: dict = {}
    obj = []
    for i, (name, dtype) in enumerate(zip(names, dtypes)):
        if isinstance(dtype, np.dtype) and dtype.kind in "iufb":
            parts = [c.iloc[:, i].to_numpy() for c in chunks]
            out[name] = parts[0] if len(parts) == 1 else np.concatenate(parts)
        elif len(chunks) == 1:
            out[name] = first.iloc[:, i].array
        else:
            obj.append(name)
            out[name] = np.concatenate([c.iloc[:, i].to_numpy(dtype=object) for c in chunks])
    for name in obj:
        out[name] = inferred_column(out[name])
    return out


def _t_sortable(cols: dict) -> bool:
    t = cols.get("t")
    return isinstance(t, np.ndarray) and t.dtype.kind in "if"


def _in_t_order(cols: dict) -> dict:
    """The columns' rows in stable ``t`` order, as ``arrange_steps``' sort puts them (NaN last). Nothing is
    moved when they already are in order (one file, or new rows after the held ones); across files
    numpy's stable sort merges the files' sorted runs."""
    t = cols["t"]
    if len(t) < 2 or bool((t[1:] >= t[:-1]).all()):
        return cols
    order = np.argsort(t, kind="stable")
    return {name: col.take(order) for name, col in cols.items()}
