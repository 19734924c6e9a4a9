"""The dashboard's stacks panel: the newest stacks of each group (and of the controller), and a button.

A ``stacks`` event (the hang watchdog's, or one taken from the CLI, the API or this button) names its
file under ``<run_dir>/stacks/`` and says where each process is (``workbench.run.stacks``). The panel
keeps the newest event of each target (:func:`newest`) and its file's text, read once when the event
arrives (the file is written before its event), and shows them (:func:`stacks_html`): one row a target,
one line a process, the whole file folded under it. Both are plain Python, tested without a browser.
The button is ``run.stacks(target, origin="button")``; what failed is shown next to it, not raised.
"""

from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Any, Iterable, Optional

import ipywidgets as w

from workbench.run.stacks import CONTROLLER
from workbench.widgets.panels import show

MAX_TEXT = 20_000  # characters of a stacks file shown under its row


def newest(events: Iterable[dict], latest: dict, run_dir: Path) -> dict:
    """``latest`` (target -> (event, file text)) with each newer ``stacks`` event of ``events`` in it."""
    for e in events:
        if e.get("kind") != "stacks" or e.get("target") is None:
            continue
        key = str(e["target"])
        if key in latest and latest[key][0].get("t", 0) > e.get("t", 0):
            continue
        try:
            text = (Path(run_dir) / str(e.get("path"))).read_text(errors="replace")[:MAX_TEXT]
        except OSError as err:
            text = f"(file not readable: {err})"
        latest[key] = (e, text)
    return latest


def _order(key: str) -> tuple:
    return (1, 0) if key == CONTROLLER else (0, int(key) if key.isdigit() else 0)


def process_line(p: dict) -> str:
    rank = "" if p.get("rank") is None else f" rank {p['rank']}"
    where = p.get("where") or "(no frame of its own code)"
    line = f"pid {p.get('pid')}{rank}: {where}  [innermost: {p.get('innermost')}]"
    return line + (f"  {p['error']}" if p.get("error") else "")


def stacks_html(latest: dict) -> str:
    """The panel: a row for each target's newest stacks (when, who asked, each process's ``where``)."""
    if not latest:
        return "<b>stacks</b> <span class='wb-stacks-none'>none taken yet</span>"
    rows = []
    for key in sorted(latest, key=_order):
        e, text = latest[key]
        who = "controller" if key == CONTROLLER else f"replica {key} attempt {e.get('attempt')}"
        stamp = time.strftime("%H:%M:%S", time.localtime(e.get("t") or 0))
        lines = [process_line(p) for p in e.get("processes") or []]
        if e.get("error"):
            lines.append(f"not sampled: {e['error']}")
        rows.append(
            f"<div class='wb-stacks-row' data-target='{html.escape(key, quote=True)}'>"
            f"<b>{html.escape(who)}</b> {stamp} ({html.escape(str(e.get('origin')))}) "
            f"<code>{html.escape(str(e.get('path')))}</code>"
            f"<pre class='wb-stacks-where'>{html.escape(chr(10).join(lines))}</pre>"
            f"<details><summary>every thread</summary><pre>{html.escape(text)}</pre></details></div>"
        )
    return "<b>stacks</b>" + "".join(rows)


class StacksPanel(w.VBox):
    """The newest stacks of ``run``'s groups, kept current from its fold's events; with ``button``, a
    target picker and a button that takes them now."""

    def __init__(self, run: Any, replicas: int, button: bool = True, **kwargs: Any) -> None:
        self.run = run
        self.latest: dict = {}
        self.picker = w.Dropdown(
            options=[("every group", None), *((f"replica {r}", r) for r in range(replicas)), (CONTROLLER, CONTROLLER)],
            value=None,
            description="stacks of",
            layout=w.Layout(width="220px"),
        ).add_class("wb-stacks-picker")
        self.button = w.Button(description="take stacks", icon="search").add_class("wb-stacks-button")
        self.button.on_click(lambda _: self.take())
        self.status = w.HTML().add_class("wb-stacks-status")
        self.panel = w.HTML().add_class("wb-stacks")
        controls = [w.HBox([self.picker, self.button, self.status])] if button else []
        super().__init__([*controls, self.panel], **kwargs)
        self._unsubscribe = run.run_state.subscribe(self.present)
        self.present(list(run.events_read))
        self.render()

    def present(self, events: list[dict]) -> None:
        newest(events, self.latest, self.run.run_dir)

    def take(self) -> Optional[list]:
        """Take the stacks the picker names; the outcome shows next to the button."""
        try:
            events = self.run.stacks(self.picker.value, origin="button")
        except Exception as e:  # shown, not raised: a click has no cell to raise into
            self.status.value = f"<span style='color:#c62828'>{html.escape(str(e))}</span>"
            return None
        self.status.value = html.escape(f"taken: {', '.join(str(e['path']) for e in events if e)}")
        self.run.refresh()
        self.render()
        return events

    def render(self) -> None:
        show(self.panel, stacks_html(self.latest))

    def stop(self) -> None:
        self._unsubscribe()
