"""``docs/benchmarks.md`` and its figures (plotly HTML under ``docs/img/``) from the results."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd

from workbench.analysis import breakeven

from .recovery import ratio_of_medians

FIG_KW = dict(include_plotlyjs="cdn", full_html=True)


def breakeven_of(clean, faulted) -> Optional[dict]:
    def pick(records, trainer):
        return next(((r.events, r.spec) for r in records if r.spec.trainer == trainer and r.spec.write_events), None)

    e, r = pick(faulted, "torchft-lite"), pick(faulted, "ddp-restart")
    if e is None or r is None:
        return None
    try:
        return breakeven.breakeven(e, r, pick(clean, "torchft-lite"), pick(clean, "ddp-restart"))
    except Exception as ex:  # reported in the document, not fatal to the rest of the benchmarks
        return {"error": f"{type(ex).__name__}: {ex}"}


def table(df: pd.DataFrame, floatfmt: str = "{:.3g}") -> str:
    def cell(v: Any) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "–"
        if isinstance(v, (float, np.floating)):
            return floatfmt.format(v)
        return str(v)

    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def _f(v, fmt="{:.2f}") -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def _apart(v: float, limit: float, decimals: int = 1) -> str:
    """``v`` with as many decimals as it takes not to print as ``limit`` (5.0005 % against ≤ 5 % is "5.001",
    not a "5.0" marked as missed), at most 4."""
    while decimals < 4 and v != limit and f"{v:.{decimals}f}" == f"{limit:.{decimals}f}":
        decimals += 1
    return f"{v:.{decimals}f}"


def targets(res: dict) -> pd.DataFrame:
    rec, surv, thr, st, pipe = res["recoveries"], res["survivors"], res["throughput"], res["startup"], res["pipeline"]
    clean = thr[thr["faults"] == 0]
    thr[thr["faults"] > 0]
    rows = []

    def add(name, target, value, ok, note=""):
        rows.append(
            {
                "target": name,
                "goal": target,
                "measured": value,
                "met": "–" if ok is None else ("yes" if ok else "**no**"),
                "note": note,
            }
        )

    stall = rec["survivor_stall_s"].dropna()
    add(
        "survivor stall beyond a normal step, every kill",
        "≤ 1.0 s",
        f"max {_f(stall.max())} s, median {_f(stall.median())} s ({len(stall)} kills)" if len(stall) else "–",
        bool(len(stall)) and stall.max() <= 1.0,
    )
    lost = int(surv["survivor_steps_lost"].sum()) if len(surv) else None
    add(
        "survivor steps lost",
        "0",
        f"{lost} (discarded: {int(surv['survivor_steps_discarded'].sum())})" if lost is not None else "–",
        lost == 0 if lost is not None else None,
    )
    kp = rec["kill_to_participating_s"].dropna()
    add(
        "kill → replacement participating (fresh process, no spare)",
        "≤ 2 s median",
        f"median {_f(kp.median())} s, max {_f(kp.max())} s ({len(kp)} kills)" if len(kp) else "–",
        bool(len(kp)) and kp.median() <= 2.0,
        "forked from the run's fork server (the local default)",
    )
    sp = res.get("spare_recoveries")
    kps = sp["kill_to_participating_s"].dropna() if sp is not None and len(sp) else []
    add(
        "kill → replacement participating (hot spare, `spares: 1`)",
        "≤ 1 s",
        f"median {_f(kps.median())} s, max {_f(kps.max())} s ({len(kps)} kills)" if len(kps) else "–",
        bool(len(kps)) and kps.median() <= 1.0,
        "includes the lighthouse's heartbeat timeout (300 ms by default since 2026-12-06, 1 s before)",
    )
    r = ratio_of_medians(clean, "steady_rate", "torchft-lite", "ddp-restart")
    add(
        "torchft fault-free overhead vs plain DDP",
        "≤ 10 %",
        f"{_f((1 - r) * 100, '{:.1f}')} %" if r else "–",
        (1 - r) <= 0.10 if r else None,
        "steady-state samples/s, same model/batch/replicas, torchft async quorum on",
    )
    ratio, raw = useful_ratio(thr)
    every = res["machine"]["settings"]["kill_every_s"]
    add(
        f"useful throughput, a kill every {every:g} s, vs checkpoint-restart",
        "≥ 1.2×",
        f"{_f(ratio)}× (raw absolute {_f(raw)}×)" if ratio else "–",
        ratio >= 1.2 if ratio else None,
        "goodput under kills × paired fault-free rate; see section 3",
    )
    rd = pipe["reader"]["events_per_s"]
    add("EventReader", "≥ 500k events/s", f"{rd / 1e3:,.0f}k events/s", rd >= 500_000)
    mp = pipe.get("metrics")
    if mp:
        if "indexed_per_s" in mp:
            add(
                "`metrics()` (cold, 50,003-event log, the controller's step index)",
                "≥ 1M step events/s",
                f"{mp['indexed_per_s'] / 1e3:,.0f}k/s (no index: {mp['new_per_s'] / 1e3:,.0f}k/s; dicts: "
                f"{mp['old_per_s'] / 1e3:,.0f}k/s)",
                mp["indexed_per_s"] >= 1e6 and mp["same_frame_indexed"],
                f"load {mp['loadavg_1m']:.2f}",
            )
        else:
            add(
                "`metrics()` (cold, 50,003-event log)",
                "≥ 1M step events/s",
                f"{mp['new_per_s'] / 1e3:,.0f}k/s (before: {mp['old_per_s'] / 1e3:,.0f}k/s)",
                mp["new_per_s"] >= 1e6,
                f"load {mp['loadavg_1m']:.2f}",
            )
    w = pipe["writer"]
    add(
        "EventWriter overhead on a torchft-lite step",
        "≤ 1 %",
        f"{_f(w.get('overhead', float('nan')) * 100, '{:.2f}')} %" if "overhead" in w else "–",
        w["overhead"] <= 0.01 if "overhead" in w else None,
        "emit + checksum every 10 steps, per step",
    )
    dash = [d for d in pipe["dashboard"] if d and "points" in d]
    d100 = next((d for d in dash if d["points"] == 100_000), None)
    add(
        "dashboard update at 100k loss points",
        "≤ 100 ms",
        f"{_f(d100['update_s'] * 1e3, '{:.0f}')} ms" if d100 else "skipped",
        d100["update_s"] <= 0.1 if d100 else None,
    )
    sc = res.get("step_cost")
    if sc:
        b, f = sc.get("ddp (plain, no checkpoint)") or {}, sc.get("torchft-lite") or {}
        pr = sc.get("paired") or {}
        from .stepcost import OVERHEAD_LIMIT

        goal = f"≤ {OVERHEAD_LIMIT * 100:g} %"
        if pr.get("rate_lower_median") is not None:
            o = pr["rate_lower_median"]
            cpu = pr.get("cpu_more_median")
            add(
                "per-step overhead vs plain DDP (samples/s, section 6)",
                goal,
                f"{_apart(o * 100, OVERHEAD_LIMIT * 100)} % (median of {len(pr['rate_lower'])} paired)"
                + (f"; CPU per step +{cpu * 100:.1f} %" if cpu is not None else ""),
                o <= OVERHEAD_LIMIT,
                "heartbeat rates, each repetition's pair back to back",
            )
        else:
            o = (1 - f["rate"] / b["rate"]) if b.get("rate") and f.get("rate") else None
            add(
                "per-step overhead vs plain DDP (samples/s, section 6)",
                goal,
                f"{_apart(o * 100, OVERHEAD_LIMIT * 100) if o is not None else '–'} %",
                o <= OVERHEAD_LIMIT if o is not None else None,
                "heartbeat rates, interleaved",
            )
    h = res.get("heal")
    from .heal import replacement_heal

    rh = replacement_heal(h) if h else None
    if rh and rh.get("bytes_per_s"):
        best = rh["bytes_per_s"]
        r = best / h["loopback"]["bytes_per_s"]
        add(
            "heal throughput at ~250 MB vs a loopback copy (section 7)",
            "≥ 0.5×",
            f"{r:.2f}× ({best / 1e6:,.0f} MB/s)",
            r >= 0.5,
            f"the replacement's heal, {h.get('transport', 'http')}; load {h['loadavg_1m']:.2f}",
        )
    s = st[st["trainer"] == "torchft-lite"]["submit_to_first_step_s"].dropna()
    add(
        "submit → first committed step, local (torchft-lite)",
        "≤ 5 s median",
        f"median {_f(s.median(), '{:.1f}')} s, max {_f(s.max(), '{:.1f}')} s ({len(s)} runs)" if len(s) else "–",
        s.median() <= 5 if len(s) else None,
    )
    lp = res.get("live_plot")
    if lp:
        k = lp["kernel_side"]
        add(
            f"kernel-side cost of one loss-plot update at {k['points'] / 1e3:,.0f}k points",
            "≤ 5 ms",
            f"median {k['appending']['median_ms']:.2f} ms, p95 {k['appending']['p95_ms']:.2f} ms",
            k["appending"]["median_ms"] <= 5.0,
            f"appending; load {k['load_1min']:.2f}",
        )
        for key in ("browser_fresh", "browser_long"):
            b = lp.get(key)
            if b and "event_to_drawn" in b:
                e = b["event_to_drawn"]
                add(
                    f"event → drawn in chromium ({b['prefilled_points']:,} points before)",
                    "p95 ≤ 0.5 s, ≥ 2 draws/s",
                    f"p95 {e['p95_ms']:.0f} ms, {b['draws_per_s']:.2f} draws/s (n={e['n']})",
                    e["p95_ms"] <= 500 and b["draws_per_s"] >= 2.0,
                    f"load {b['load_1min_start']:.2f}→{b['load_1min_end']:.2f}",
                )
    return pd.DataFrame(rows)


def pipeline_section(pipe: dict) -> list[str]:
    lines = [
        "## 4. Event pipeline",
        "",
        f"- EventReader, fresh `poll()` of {pipe['reader']['events']:,} step events in 3 files: "
        f"**{pipe['reader']['events_per_s']:,.0f} events/s** (median of {pipe['reader'].get('reps', 'several')} polls); "
        "the dashboard's incremental poll is this reader on new bytes only (unchanged by the columnar path)",
    ]
    alt = pipe["reader"].get("alternatives")
    if alt:
        n = alt["events"]
        lines.append(
            f"  - same bytes, stdlib json: per line {n / alt['per_line_json_s']:,.0f}/s; one array per file "
            f"{n / alt['one_array_json_s']:,.0f}/s; the cross-file sort alone {n / alt['sort_s']:,.0f}/s"
        )
    mp = pipe.get("metrics")
    if mp:
        floor = mp.get("parse_s")
        lines += [
            f"- `Run.metrics()` read path, cold, on the {mp['events']:,}-event log ({mp['step_rows']:,} step rows), "
            f"median of {mp['reps']} interleaved, load (1 min) {mp['loadavg_1m']:.2f}: "
            f"dicts (`EventReader.poll` + `metrics_frame`, before) **{mp['old_per_s']:,.0f} steps/s** "
            f"({mp['old_s'] * 1e3:.0f} ms); columnar (`StepColumns`, pyarrow) **{mp['new_per_s']:,.0f} steps/s** "
            f"({mp['new_s'] * 1e3:.0f} ms), {mp['old_s'] / mp['new_s']:.2f}× ; same DataFrame: {mp['same_frame']}"
            + (
                f"; CPU time per call (all threads): before {mp['old_cpu_s'] * 1e3:.0f} ms, columnar "
                f"{mp['new_cpu_s'] * 1e3:.0f} ms"
                if "new_cpu_s" in mp
                else ""
            ),
            *(
                [
                    f"  - starting from the controller's step index (`analysis.step_index`, what a new kernel's "
                    f"`metrics()` does on a run the workbench ran; the index written once beforehand in "
                    f"{mp['index_write_s'] * 1e3:.0f} ms, as the controller writes it): "
                    f"**{mp['indexed_per_s']:,.0f} steps/s** ({mp['indexed_s'] * 1e3:.1f} ms), same DataFrame: "
                    f"{mp['same_frame_indexed']}"
                ]
                if "indexed_s" in mp
                else []
            ),
            f"  - warm (a notebook cell on a live run): `metrics()` after 15 new step events "
            f"{mp['warm_s'] * 1e3:.1f} ms (parses only the new bytes; the held columns are concatenated, sorted only "
            f"when out of order)"
            + (
                f"; the dashboard's incremental `EventReader.poll()` of the same bytes {mp['poll_warm_s'] * 1e3:.2f} ms"
                if "poll_warm_s" in mp
                else ""
            ),
            *(
                [
                    f"  - reading the files and pyarrow's parse alone, in the same loop: {floor * 1e3:.0f} ms "
                    f"({mp['step_rows'] / floor:,.0f} lines/s), {floor / mp['new_s'] * 100:.0f} % of the columnar "
                    f"`metrics()`; the rest is the step filter and the conversion to the DataFrame"
                ]
                if floor
                else []
            ),
            "  - candidates on the same bytes, parse only (no DataFrame), median: "
            + "; ".join(
                f"{k} " + (f"{mp['step_rows'] / v:,.0f}/s ({v * 1e3:.0f} ms)" if v else "not installed")
                for k, v in mp["candidates_s"].items()
            ),
        ]
    w = pipe["writer"]
    lines.append(
        f"- EventWriter: one step event {w['emit_s'] * 1e6:.1f} µs; weights checksum {w['checksum_s'] * 1e3:.2f} ms every "
        f"{w['checksum_every']} steps"
        + (
            f"; per torchft-lite step of {w['step_time_s'] * 1e3:.1f} ms: emit "
            f"{w['emit_share'] * 100:.2f} % + checksum {w['checksum_share'] * 100:.2f} % = "
            f"**{w['overhead'] * 100:.2f} %**"
            if "overhead" in w
            else ""
        )
    )
    for d in pipe["dashboard"]:
        if d and "skipped" in d:
            lines.append(f"- dashboard: skipped ({d['skipped']})")
        elif d:
            lines.append(
                f"- dashboard at {d['points']:,} loss points: update + forced redraw "
                f"**{d['update_s'] * 1e3:.0f} ms** (max {d['update_max_s'] * 1e3:.0f} ms); first load {d['cold_s']:.2f} s"
            )
    return lines


def writer_ab_section(wab: pd.DataFrame) -> list[str]:
    """Step events on vs off, end to end: the step rate from heartbeats (which a run writes either way)."""
    off = "torchft-lite write_events=false"
    lines = ["## 4b. Step events on / off (telemetry overhead, end to end)", ""]
    if not len(wab) or not (wab["variant"] == off).any():
        return lines + ["(not measured in this run: full mode only, `writer_ab`)"]
    r = ratio_of_medians(wab, "heartbeat_rate", "torchft-lite", off)
    lines += [
        "torchft-lite with `write_events: false` (no step events; heartbeats still carry the step) interleaved with "
        "the default runs of section 3; samples/s from each run's heartbeats (step reached vs time, first 3 s skipped).",
        "",
        table(wab[wab["variant"].isin(["torchft-lite", off])]),
        "",
        f"- step rate with step events on / off: **{_f(r, '{:.3f}')}** (ratio of medians; the per-event cost is "
        "section 4's EventWriter line)",
    ]
    return lines


def write_sections(res: dict, out: Path, img: Path) -> None:
    """Replace only the sections this (partial, ``--only``) run measured in ``out``; the rest stays as it is.

    A section is a ``## `` heading and everything up to the next one; a section the document lacks is
    inserted before "What misses its target".
    """
    new: list[list[str]] = []
    if res["machine"].get("only") and "clean" in res["machine"]["only"]:
        new.append(writer_ab_section(res["writer_ab"]))
    if "pipeline" in res:
        new.append(pipeline_section(res["pipeline"]))
    if res.get("step_cost"):
        new.append(stepcost_section(res["step_cost"]))
    if res.get("heal"):
        from .heal import lines as heal_lines

        new.append(heal_lines(res["heal"]))
    m = res["machine"]
    stamp = (
        f"_Section from `python -m bench{' --quick' if m['mode'] == 'quick' else ''} --only {','.join(m['only'])}"
        f"{''.join(' --set ' + k for k in m.get('set') or [])}`, started {m['started']}, load average at start "
        f"{', '.join(f'{x:.2f}' for x in m['loadavg_at_start'])}, at end "
        f"{', '.join(f'{x:.2f}' for x in m['loadavg_at_end'])}._"
    )
    text = out.read_text() if out.exists() else "# Benchmarks\n"
    for sec in new:
        text = replace_section(text, sec[0], "\n".join([sec[0], "", stamp] + sec[1:]) + "\n")
    out.write_text(text)


def replace_section(text: str, heading: str, body: str) -> str:
    lines = text.splitlines(keepends=True)
    start = next((i for i, l in enumerate(lines) if l.rstrip("\n") == heading), None)
    if start is None:  # before the first numbered section that sorts after it, else before the notes
        key = heading.split()[1]
        at = next(
            (
                i
                for i, l in enumerate(lines)
                if l.startswith("## ")
                and (l.startswith("## What misses") or (l.split()[1][:1].isdigit() and l.split()[1] > key))
            ),
            len(lines),
        )
        return "".join(lines[:at]) + body + "\n" + "".join(lines[at:])
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "".join(lines[:start]) + body + "\n" + "".join(lines[end:])


def useful_ratio(thr: pd.DataFrame) -> tuple[Optional[float], Optional[float]]:
    """torchft-lite / ddp-restart useful throughput under kills: (normalised, raw).

    Normalised: each kind's goodput under kills (useful / its own steady rate in
    the same run, so the machine's load at that time cancels) times its median
    fault-free rate from the interleaved fault-free pairs. Raw: the two runs'
    absolute useful rates, which on a shared machine also carry the load
    difference between the two runs.
    """
    clean, faulted = thr[thr["faults"] == 0], thr[thr["faults"] > 0]
    out = []
    for col in ("goodput", "useful_rate"):
        ft = faulted[faulted["trainer"] == "torchft-lite"][col].dropna()
        dd = faulted[faulted["trainer"] == "ddp-restart"][col].dropna()
        out.append(float(ft.median() / dd.median()) if len(ft) and len(dd) and dd.median() else None)
    rc = ratio_of_medians(clean, "steady_rate", "torchft-lite", "ddp-restart")
    return (out[0] * rc if out[0] and rc else None), out[1]


def figures(res: dict, img: Path) -> dict[str, str]:
    import plotly.graph_objects as go

    names = {}
    rec = res["recoveries"]
    if len(rec):
        fig = go.Figure()
        label = [f"kill {i + 1} (r{t})" for i, t in enumerate(rec["target"])]
        fig.add_bar(x=label, y=rec["survivor_stall_s"], name="survivor stall beyond a step (s)")
        fig.add_bar(x=label, y=rec["kill_to_participating_s"], name="kill → participating (s)")
        fig.add_hline(y=1.0, line_dash="dot", annotation_text="stall target 1 s")
        fig.add_hline(y=4.0, line_dash="dash", annotation_text="rejoin target 4 s")
        fig.update_layout(title="torchft-lite: each kill", barmode="group", yaxis_title="seconds", height=380)
        names["recovery"] = _save(fig, img / "bench-recovery.html")
    thr = res["throughput"]
    if len(thr):
        fig = go.Figure()
        for kind, g in thr.groupby("faults", sort=True):
            label = "fault-free" if kind == 0 else f"{kind} kills"
            fig.add_bar(x=g["variant"], y=g["useful_rate"], name=f"useful ({label})")
        fig.update_layout(
            title="Useful throughput (committed samples/s, each step once)",
            barmode="group",
            yaxis_title="samples/s",
            height=380,
        )
        names["throughput"] = _save(fig, img / "bench-throughput.html")
    b = res.get("breakeven")
    if (
        b
        and "error" not in b
        and b["elastic"]["lost_per_fault_s"] is not None
        and b["restart"]["lost_per_fault_s"] is not None
    ):
        names["breakeven"] = _save(breakeven.breakeven_figure(b), img / "bench-breakeven.html")
    return names


def _save(fig, path: Path) -> str:
    fig.write_html(path, **FIG_KW)
    _png(fig, path.with_suffix(".png"))
    return path.name


def _png(fig, path: Path) -> None:
    """A PNG beside the HTML for the README: headless chromium screenshots a self-contained page."""
    import shutil
    import subprocess
    import tempfile

    browser = shutil.which("chromium")
    if browser is None:
        return
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "fig.html"
        fig.write_html(page, include_plotlyjs=True, full_html=True, default_width=900, default_height=420)
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={tmp}/profile",
                "--window-size=920,440",
                "--hide-scrollbars",
                f"--screenshot={path.resolve()}",
                page.as_uri(),
            ],
            capture_output=True,
            timeout=60,
        )


def jsonable(res: dict) -> dict:
    out = {}
    for k, v in res.items():
        out[k] = v.to_dict(orient="records") if isinstance(v, pd.DataFrame) else v
    return out


def write(res: dict, out: Path, img: Path) -> None:
    m = res["machine"]
    figs = figures(res, img)
    thr = res["throughput"]
    pipe = res["pipeline"]
    clean = thr[thr["faults"] == 0]
    faulted = thr[thr["faults"] > 0]
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python -m bench" + (" --quick" if m["mode"] == "quick" else "") + "` (`make bench`). "
        "Ratios between variants run side by side, interleaved in one session, are the claim; absolute "
        "times on a shared machine are context.",
        "",
        "## Machine",
        "",
        f"- `nproc`: {m['nproc']} (affinity {m['affinity']}); CPU: {m['cpu_model']}",
        f"- load average at start: {', '.join(f'{x:.2f}' for x in m['loadavg_at_start'])}; "
        f"at end: {', '.join(f'{x:.2f}' for x in m['loadavg_at_end'])}",
        f"- Python {m['python']}, torch {m['torch']}, {m['platform']}; started {m['started']}; "
        f"the whole benchmark took {m['bench_wall_s'] / 60:.1f} min ({m['mode']} mode)",
        f"- settings: `{m['settings']}`",
        "",
        "## Targets",
        "",
        table(targets(res)),
        "",
        "## 1–2. Kill recovery (torchft-lite, 3 replica groups, fresh replacement process)",
        "",
        "One row per kill (`analysis.recovery_timeline`; seconds after the kill).",
        "",
        table(res["recoveries"].drop(columns=["run_dir"])),
        "",
        "The same kills with a hot spare (`spares: 1`): the replacement was imported, built and warmed up before "
        "the kill, so it only has to be assigned, join the quorum and heal.",
        "",
        table(res["spare_recoveries"].drop(columns=["run_dir"]))
        if len(res.get("spare_recoveries", []))
        else "(no spare run)",
        "",
        table(res["survivors"]),
        "",
    ]
    if "recovery" in figs:
        lines += [f"Figure: [each kill](img/{figs['recovery']})", ""]
    lines += [
        "Checkpoint-restart (ddp-restart) kills, for comparison: every rank stops; "
        "`kill_to_participating_s` is fault → the relaunched job's first step, `steps_lost_by_victim` the steps "
        "redone from the checkpoint.",
        "",
        table(res["restart_recoveries"].drop(columns=["run_dir"])),
        "",
        "## 3. Useful throughput, fault-free and under kills",
        "",
        "Samples/s of committed, participating steps, each (replica, step) once (a restart's redone steps count "
        "once) over `analysis.goodput`'s window; `steady_rate` is goodput's fault-free-stretch rate; "
        "`goodput` = useful / (steady × window). Same model, batch (8 per replica) and 3 replicas for both.",
        "",
        table(thr.drop(columns=["trainer"])),
        "",
    ]
    rc = ratio_of_medians(clean, "steady_rate", "torchft-lite", "ddp-restart")
    ft, dd = faulted[faulted["trainer"] == "torchft-lite"], faulted[faulted["trainer"] == "ddp-restart"]
    if rc:
        lines.append(
            f"- fault-free: torchft-lite / ddp-restart steady rate = **{rc:.3f}** (median of {len(clean) // 2 or 1} interleaved pairs)"
        )
    if len(ft) and len(dd):
        ftc = clean[clean["variant"] == "torchft-lite"]["steady_rate"].median()
        ddc = clean[clean["variant"] == "ddp-restart"]["steady_rate"].median()
        lines += [
            f"- under kills: useful rate torchft-lite / ddp-restart = **{ft['useful_rate'].median() / dd['useful_rate'].median():.2f}×**; "
            f"absolute {ft['useful_rate'].median():.0f} vs {dd['useful_rate'].median():.0f} samples/s",
            f"- each as a share of its own fault-free rate: goodput in the same run torchft-lite "
            f"{ft['goodput'].median():.3f}, ddp-restart {dd['goodput'].median():.3f}; against the interleaved "
            f"fault-free runs {ft['useful_rate'].median() / ftc:.2f} and {dd['useful_rate'].median() / ddc:.2f}",
            f"- normalised useful-throughput ratio (goodput ratio × fault-free rate ratio): "
            f"**{useful_ratio(thr)[0]:.2f}×** — the claim; the raw absolute ratio also carries the load difference "
            "between two runs minutes apart on a shared machine",
        ]
    if "throughput" in figs:
        lines += ["", f"Figure: [useful throughput](img/{figs['throughput']})"]
    b = res.get("breakeven")
    lines += ["", "### Break-even MTBF (`workbench.analysis.breakeven`)", ""]
    if b and "error" not in b:
        e, r = b["elastic"], b["restart"]
        lines += [
            f"- elastic: R = {_f(e['rate_samples_per_s'], '{:.0f}')} samples/s fault-free, L = {_f(e['lost_per_fault_s'])} s "
            f"of full-rate work lost per kill (goodput, {e['faults']} kills)",
            f"- checkpoint-restart: R = {_f(r['rate_samples_per_s'], '{:.0f}')} samples/s, L = restart "
            f"{_f(r.get('restart_s'))} s + half the checkpoint period {_f((r.get('checkpoint_period_s') or float('nan')) / 2)} s = "
            f"{_f(r['lost_per_fault_s'])} s (this run's own faults lost {_f(r['measured_lost_per_fault_s'])} s each)",
            f"- crossing MTBF: **{_f(b['crossing_mtbf_s'], '{:.0f}')} s**; elastic wins {b['elastic_wins']}"
            + (" it" if b["elastic_wins"] in ("below", "above") else ""),
        ]
        if "breakeven" in figs:
            lines.append(f"- Figure: [throughput vs MTBF](img/{figs['breakeven']})")
            lines += ["", "![Useful throughput vs MTBF, elastic and checkpoint-restart](img/bench-breakeven.png)"]
    else:
        lines.append(f"not computed: {b.get('error') if b else 'no faulted runs of both kinds'}")
    wab = res["writer_ab"]
    lines += [""] + pipeline_section(pipe)
    if res.get("log_route"):
        from .torchft_logs import lines as log_route_lines

        lines += log_route_lines(res["log_route"])
    lines += [""] + writer_ab_section(wab)
    st = res["startup"]
    lines += [
        "",
        "## 5. Submit → first committed step (local)",
        "",
        table(st.groupby("variant")["submit_to_first_step_s"].agg(["count", "median", "min", "max"]).reset_index()),
        "",
    ]
    if res.get("step_cost"):
        lines += [""] + stepcost_section(res["step_cost"])
    if res.get("heal"):
        from .heal import lines as heal_lines

        lines += [""] + heal_lines(res["heal"])
    lines += [
        "",
        "## What misses its target, what bounds it, what would move it",
        "",
        NOTES,
        "",
        "Profiles (pyinstrument): [reader](img/profile-reader.txt), [dashboard at 100k](img/profile-dashboard-100k.txt).",
        "",
    ]
    out.write_text("\n".join(lines))


NOTES = """\
- **EventReader events/s and `metrics()`.** The reader builds one Python dict per line (orjson), which
  bounds it on one core. `Run.metrics()` does not go through dicts: `StepColumns` parses each file's new
  bytes with pyarrow's JSON reader (1 MiB blocks on both cores) into columns and merges the files' columns
  as numpy arrays (sorted only when out of order, list fields built through numpy). Reading and parsing the
  bytes alone is about half of a cold `metrics()` (section 4) and by itself runs at about 1M lines/s only
  when the 2 cores are not taken by other users' training; the rest (step filter, 50,000 Python lists for
  `batch_seed`, merge) roughly doubles right after a dict-heavy call, which is why each read in
  section 4 starts with no other read's frame alive. Neither polars' `read_ndjson` (with or
  without a schema), an explicit pyarrow schema, nor pyarrow's CSV tokenizer over the same bytes parsed
  faster by enough (measured for issue 19). So the controller, which reads every byte anyway, keeps the
  step rows as columns and writes them as an Arrow file (`index/steps.arrow`, one writer, replaced by
  rename, at most every 30 s and at the run's end); a cold `metrics()` starts from it and parses only the
  bytes after it. Of such a read (about 9 ms on a quiet machine) most is building the 50,000 `batch_seed`
  lists that the frame holds as Python lists, like the dict path's. The dashboard's incremental poll still needs dicts (its fold
  reads each event), on new bytes only.
- **Kill → participating (fresh process).** Local jobs are forked from the run's fork server, which
  imported torch, torchft and the trainer and warmed up once, so a replacement no longer pays process
  start and imports (~1.5-3 s and ~2-4 s through submitit's `LocalExecutor`, whose figures the fork-server
  section keeps beside it). What is left: the controller noticing the dead job, the lighthouse's
  heartbeat timeout before the survivors' next quorum, and the heal; a hot spare saves only the fork.
- **Survivor stall.** Survivors wait for the dead peer's socket reset or the process-group timeout, then
  a new quorum, which forms once the dead group's heartbeats are `lighthouse.heartbeat_timeout_ms` old
  (300 ms by default since 2026-12-06, 1 s before it); a stall above that appears when the survivors
  themselves are descheduled on an overloaded machine. A shorter timeout risks evicting live groups under
  load; the sections "Survivor stall against the heartbeat timeout" and "Survivor stall under chaos"
  count those evictions (`analysis.evictions`).
- **Submit → first step.** Controller start, lighthouse and the fork server's imports (torch, torchft,
  the trainer, one warm-up step) run side by side; the groups are then forked, so three processes no
  longer import torch at once on two cores. What remains is one process's import and warm-up time,
  which grows with whatever else the two cores run.
- **Per-step overhead vs plain DDP (section 6).** Timed per phase inside torchft-lite steps
  (`torchft.step_timing`, median step ~31 ms on this loaded 2-core machine): the gradient all-reduce
  through torchft's `Manager.allreduce` and its process-group wrapper ~12 ms mean (~39 %; plain DDP
  all-reduces too, over gloo directly; its own share is not timed), the commit vote (`should_commit`,
  an RPC to the group's manager server) ~2.3 ms (~7 %), waiting on the async quorum ~1.3 ms (~4 %),
  `zero_grad` (joining the previous quorum future, submitting the next, making the batch) ~2.3 ms.
  What the workbench adds after the step (commit record, loss, checksum every 10 steps, the event
  write) is ~0.5 ms mean (~1.6 %): cutting it cannot reach 5 %. torchft's DDP wrapper also waits on
  each bucket's all-reduce inside its hook and runs with `find_unused_parameters=True`; its quorum
  round trip (~8 ms) overlaps the forward pass but shares the two cores with it. A 500 ms Manager
  heartbeat (instead of 100 ms) was within the run-to-run noise. What would move it: fewer
  synchronisations (LocalSGD / DiLoCo) rather than a cheaper per-step one.
- **Heal at ~250 MB (section 7).** The heal now goes over torchft's `PGTransport` on the group's own
  gloo process group, received in place into the model's and AdamW's tensors (AdamW's state is created
  when the model is built), and a new process waits for its first quorum before its first forward pass
  (`torchft.checkpoint_transport`, default `pg`; `http` is torchft's HTTP transport). Three
  `--quick --only heal` runs (12:27, 12:44, 12:48 UTC, load 1.9-2.9 at their start): the replacement's
  262 MB heal took 0.28 / 0.15 / 0.10 s with `pg` (median 0.15 s = 1.77 GB/s, median 0.67× the idle
  loopback copy of the same session) and 0.35 / 0.19 / 0.20 s with `http` (median 0.20 s, 0.51×);
  before (http, no wait) 0.39 s (0.25×) and 0.33 s (0.32×). Where the HTTP heal's time went: the
  serving side answers 10-60 ms after the request (`wait_s`), so the step boundary is not it; the rest
  is bytes plus deserialising into 262 MB of fresh memory (a plain 262 MB copy into fresh memory costs
  0.13 s here, mostly page faults; the loopback copy reuses one 1 MB buffer), on two cores that both
  survivors' forward passes share (the same loopback copy while the groups train: 1.7-2.6 GB/s).
  The late joiner (0.11× before) heals at step 1, during the survivors' first and slowest steps
  (1.0-1.2 s: first-touch of activations, AdamW creating its 175 MB of moments), and with the async
  quorum its own first forward ran beside its heal: `http` 0.36-0.63 s, `pg` 0.21-0.25 s (~0.4×) in
  these runs. Chunked HTTP (`http_chunks` 4): 0.28 s for the replacement in one run, but slower than
  one stream on an idle machine (0.16-0.25 s vs 0.09-0.16 s for 262 MB): more threads, same two cores.
  What bounds it now: the two cores shared with the survivors' training; the run-to-run spread (0.10-0.28 s)
  is as large as the remaining gap to the idle copy.
- **Useful throughput vs checkpoint-restart.** The checkpoint-restart job loses restart time (the same
  process start and imports, for every rank) plus half a checkpoint period of redone work per fault;
  torchft loses about one group's absence divided by the number of groups. The break-even section turns
  the measured losses into the MTBF below which elastic wins.
"""


def stepcost_section(sc: dict) -> list[str]:
    from .stepcost import lines as stepcost_lines

    return stepcost_lines(sc)
