"""The dashboard's HTML panels: header, group tiles or grid, nodes, quorum, checkpoints, heals, event tail.

Pure functions from a :class:`~workbench.widgets.state.DashboardState` (or the
part of it a panel shows) to an HTML string; the
:class:`~workbench.widgets.dashboard.Dashboard` puts each in its ``w.HTML``
with :func:`show`. Every value that comes from an event file (quorum ids, heal
sources, hosts, messages) goes through :func:`fmt` or ``html.escape``. The
``class`` and ``data-*`` attributes are what the tests and the browser tests
read.
"""

from __future__ import annotations

import html
import time
from typing import Any, Optional

import ipywidgets as w

from workbench.analysis import straggler
from workbench.analysis.wallclock import STATE_COLORS
from workbench.widgets.state import STATES, DashboardState

STYLE = """<style>
.wb-tiles{display:flex;flex-wrap:wrap;gap:6px}
.wb-tile{border-radius:6px;padding:6px 8px;min-width:150px;font:12px/1.35 monospace;color:#fff}
.wb-tile b{font-size:13px}
.wb-tile{max-width:340px}
.wb-cause{font-weight:bold;overflow-wrap:anywhere}
.wb-table{font:12px monospace;border-collapse:collapse}
.wb-table td,.wb-table th{padding:1px 8px;text-align:right;border-bottom:1px solid #ddd}
.wb-nowrap td,.wb-nowrap th{white-space:nowrap}
.wb-tail{font:11px/1.3 monospace;margin:0;white-space:pre-wrap}
.wb-grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(64px,1fr));gap:3px;max-width:900px}
.wb-cell{border-radius:3px;padding:2px 3px;font:bold 12px/1.2 monospace;color:#fff;text-align:center}
.wb-legend span{display:inline-block;padding:0 6px;margin-right:4px;border-radius:3px;color:#fff;font:11px monospace}
</style>"""
TAIL_FIELDS = (
    "replica",
    "attempt",
    "action",
    "target",
    "origin",
    "state",
    "reason",
    "phase",
    "step",
    "quorum_id",
    "message",
)


def show(widget: w.HTML, value: str) -> None:
    """Set ``widget``'s HTML only when it changed (an unchanged value sends nothing to the frontend)."""
    if widget.value != value:
        widget.value = value


def fmt(value: Any, spec: str = "", unit: str = "") -> str:
    """A value as HTML text, escaped: quorum ids, heal sources and hosts come from event files."""
    if value is None:
        return "–"
    try:
        text = f"{value:{spec}}{unit}"
    except (TypeError, ValueError):
        text = str(value)
    return html.escape(text, quote=True)


def decimal_bytes(n: Optional[float]) -> str:
    """Decimal units (1 MB = 10^6 bytes), as the CLI and the benchmarks print them."""
    if n is None or not isinstance(n, (int, float)):
        return "–"
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return "–"


def header_html(s: DashboardState, run_name: str, trainer: str, replicas: int, polling: bool) -> str:
    live = "live" if polling else "not polling"
    run_state = s.run_state or ("running" if s.events_seen else "waiting for events")
    return (
        f"<div class='wb-title' data-run-state='{html.escape(run_state)}'><b>{html.escape(run_name)}</b>"
        f" · {html.escape(trainer)} · {replicas} replica groups · {html.escape(run_state)}"
        f" · <span class='wb-live'>{live}</span> · {s.events_seen} events</div>"
    )


def memory_text(s: DashboardState, replica: int, t) -> str:
    """A tile's memory: the trainer's peak accelerator memory, else its processes' resident memory
    (the controller's ``node_health`` samples, on CPU); empty when neither is known."""
    if t.mem_gb is not None:
        return f"accel mem {fmt(t.mem_gb, '.2f', ' GB')}"
    rss = s.rss_bytes(replica)
    return f"rss {decimal_bytes(rss)}" if rss is not None else ""


def score_html(score: Optional[straggler.Score]) -> str:
    """A tile's straggler score (``analysis.straggler``): relative/individual, ``slow`` when flagged."""
    if score is None:
        return ""
    rel = "–" if score.relative is None else f"{score.relative:.2f}"
    slow = " · <b class='wb-straggler'>slow</b>" if score.flagged else ""
    return f" · <span class='wb-score' data-relative='{rel}' data-flagged='{str(score.flagged).lower()}'>score {rel}/{score.individual:.2f}</span>{slow}"


def tiles_html(s: DashboardState) -> str:
    """One tile per group: state, step, attempt, heartbeat age, speed and straggler score, memory, hosts."""
    now = time.time()
    scores = straggler.scores(s.run)
    parts = ["<div class='wb-tiles'>"]
    for r, t in sorted(s.tiles.items()):
        age = t.heartbeat_age(now)
        last = " · ".join(x for x in (memory_text(s, r, t), html.escape(", ".join(t.hosts))) if x)
        end = s.end_shown(r)
        parts.append(
            f"<div class='wb-tile' data-replica='{r}' data-state='{t.state}' data-attempt='{t.attempt}' "
            f"data-step='{t.step if t.step is not None else ''}' data-diverged='{fmt(t.diverged_at) if t.diverged_at is not None else ''}' "
            f"style='background:{STATE_COLORS.get(t.state, '#555')}"
            + (";outline:3px solid #000" if t.diverged_at is not None else "")
            + "'>"
            f"<b>replica {r}</b> · <span class='wb-tile-state'>{t.state}</span>"
            + (
                f" · <b class='wb-diverged'>diverged at step {fmt(t.diverged_at)}</b>"
                if t.diverged_at is not None
                else ""
            )
            + (f" · <b class='wb-impaired'>{fmt(t.impaired['kind'])}</b>" if t.impaired else "")
            + (
                f"<br><span class='wb-cause' data-attempt='{end.attempt}' data-injected='{str(end.injected is not None).lower()}'>"
                f"attempt {end.attempt} ended: {html.escape(end.summary())}</span>"
                if end is not None
                else ""
            )
            + "<br>"
            f"step {fmt(t.step)} · attempt {t.attempt}"
            + (f" · {t.steps_lost} steps redone" if t.steps_lost else "")
            + "<br>"
            + (f"heartbeat {fmt(age, '.1f', ' s')} ago<br>" if age is not None else "")
            + f"step {fmt(t.step_time_s and t.step_time_s * 1000, '.0f', ' ms')} · {fmt(t.tokens_per_s, ',.0f')} tok/s"
            + score_html(scores.get(r))
            + (f"<br><span class='wb-tile-mem'>{last}</span>" if last else "")
            + "</div>"
        )
    parts.append("</div>")
    return "".join(parts)


def grid_html(grid: list) -> str:
    """One small cell per group, coloured by state, its attempt in the corner."""
    counts = {st: 0 for st in STATES}
    parts = []
    for c in grid:
        counts[c.state] = counts.get(c.state, 0) + 1
        parts.append(
            f"<div class='wb-cell' data-replica='{c.replica}' data-state='{c.state}' "
            f"data-attempt='{c.attempt}' style='background:{c.color}' title='replica {c.replica}: "
            f"{c.state}, attempt {c.attempt}'>{c.replica}<sup>{c.attempt or ''}</sup></div>"
        )
    legend = "".join(f"<span style='background:{STATE_COLORS[st]}'>{st} {n}</span>" for st, n in counts.items() if n)
    return f"<div class='wb-legend'>{legend}</div><div class='wb-grid'>{''.join(parts)}</div>"


def backlog_html(b: dict) -> str:
    """The dead-group queue (:meth:`~workbench.analysis.wallclock.Timeline.backlog`) and whether it kept up."""
    verdict = (
        "relaunch and spares kept up"
        if b["kept_up"]
        else "<b style='color:#c62828'>fault rate not absorbed: the queue of dead groups grows</b>"
    )
    return (
        f"<div class='wb-backlog-now' data-peak='{b['peak']}' data-at-end='{b['at_end']}' "
        f"data-kept-up='{str(b['kept_up']).lower()}'><b>dead-group queue</b> peak {b['peak']} · "
        f"mean {b['mean']:.2f} · now {b['at_end']} · {verdict}</div>"
    )


def nodes_html(s: DashboardState) -> str:
    rows = []
    for n in s.node_rows():
        state = n["state"] + (f" ({fmt(n['fault'])})" if n["fault"] else "")
        running = ", ".join(f"replica {fmt(p['replica'])} task {fmt(p['task'])}" for p in n["parts"]) or "–"
        rows.append(
            f"<tr data-node='{fmt(n['node'])}' data-state='{n['state']}'><td>{fmt(n['node'])}</td>"
            f"<td>{fmt(n['address'])}</td><td>{state}</td><td>{running}</td>"
            f"<td class='wb-health'>{html.escape(n['health_line'])}</td></tr>"
        )
    if not rows:
        return ""
    return (
        "<b>nodes</b><table class='wb-table'><tr><th>node</th><th>address</th><th>state</th>"
        f"<th>running</th><th>health</th></tr>{''.join(rows)}</table>"
    )


def quorum_html(s: DashboardState, replicas: int) -> str:
    rows = "".join(
        f"<tr><td>{fmt(q['quorum_id'])}</td><td>{fmt(q['step'])}</td><td>{fmt(q['participants'])}</td></tr>"
        for q in s.quorum_history[-5:][::-1]
    )
    return (
        f"<div class='wb-quorum-now' data-quorum-id='{fmt(s.quorum_id)}' data-participants='{fmt(s.participants)}'>"
        f"<b>quorum</b> {fmt(s.quorum_id)} · <b>{fmt(s.participants)}</b> participants</div>"
        f"<div style='display:flex;gap:16px;align-items:flex-start'>"
        f"<table class='wb-table'><tr><th>quorum</th><th>step</th><th>participants</th></tr>{rows}</table>"
        f"{participants_svg(s, replicas)}</div>"
    )


def participants_svg(s: DashboardState, replicas: int, width: int = 360, height: int = 90) -> str:
    """Participants over time as a step line, drawn as a small SVG (no second plot to sync)."""
    h = [q for q in s.quorum_history if q["participants"] is not None]
    if not h:
        return ""
    t0, now = s.t0 or h[0]["t"], max(time.time(), h[-1]["t"])
    span, top = max(now - t0, 1e-9), max(max(q["participants"] for q in h), replicas)
    x = lambda t: 30 + (t - t0) / span * (width - 40)
    y = lambda p: 10 + (1 - p / top) * (height - 25)
    points, prev = [], None
    for q in h:
        if prev is not None:
            points.append(f"{x(q['t']):.1f},{y(prev):.1f}")
        points.append(f"{x(q['t']):.1f},{y(q['participants']):.1f}")
        prev = q["participants"]
    points.append(f"{x(now):.1f},{y(prev):.1f}")
    return (
        f"<svg class='wb-participants' width='{width}' height='{height}' data-changes='{len(h)}'>"
        f"<text x='30' y='{height - 2}' font-size='12'>participants over {span:.0f} s</text>"
        f"<text x='2' y='{y(top) + 4:.0f}' font-size='12'>{top}</text><text x='2' y='{y(0) + 4:.0f}' font-size='12'>0</text>"
        f"<line x1='30' x2='{width - 10}' y1='{y(0):.1f}' y2='{y(0):.1f}' stroke='#bbb'/>"
        f"<polyline fill='none' stroke='#1f77b4' stroke-width='2' points='{' '.join(points)}'/></svg>"
    )


def checkpoints_html(s: DashboardState) -> str:
    now = time.time()
    rows = (
        "".join(
            f"<tr><td>{k}</td><td>{fmt(c['step'])}</td><td>{fmt(now - c['t'], '.0f', ' s')}</td>"
            f"<td>{decimal_bytes(c['bytes'])}</td><td>{fmt(c['seconds'], '.2f', ' s')}</td></tr>"
            for k, c in sorted(s.checkpoints.items(), key=lambda kv: str(kv[0]))
        )
        or "<tr><td colspan=5>no durable checkpoint yet</td></tr>"
    )
    return (
        "<b>durable checkpoints</b><table class='wb-table wb-nowrap'><tr><th>replica</th><th>step</th><th>age</th>"
        f"<th>size</th><th>write</th></tr>{rows}</table>"
    )


def heals_html(s: DashboardState) -> str:
    rows = (
        "".join(
            f"<tr><td>{fmt(h['replica'])}</td><td>{fmt(h['from'])}</td><td>{fmt(h['step'])}</td>"
            f"<td>{fmt(h['seconds'], '.2f', ' s')}</td><td>{decimal_bytes(h['bytes'])}</td>"
            f"<td>{decimal_bytes(h['bytes_per_s'])}/s · {fmt(h['served_from'])} via {fmt(h['interface'])}</td></tr>"
            for h in s.heals[-5:][::-1]
        )
        or "<tr><td colspan=6>no peer heal yet</td></tr>"
    )
    return (
        "<b>peer-heal transfers</b><table class='wb-table wb-nowrap'><tr><th>replica</th><th>from</th><th>step</th>"
        f"<th>time</th><th>bytes</th><th>rate · route</th></tr>{rows}</table>"
    )


def tail_html(s: DashboardState) -> str:
    lines = []
    for e in list(s.tail)[::-1]:
        stamp = time.strftime("%H:%M:%S", time.localtime(e.get("t") or 0))
        extra = " ".join(
            f"{k}={e[k]}"
            for k in TAIL_FIELDS
            if e.get(k) is not None and not (k == "attempt" and e.get("replica") is None)
        )
        lines.append(f"{stamp} {e.get('kind')} {extra}")
    return "<b>latest events</b><pre class='wb-tail'>" + html.escape("\n".join(lines)) + "</pre>"
