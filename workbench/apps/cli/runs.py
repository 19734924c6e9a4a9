"""``workbench demo|submit|validate|status|wait|stop|metrics|summary|kill|replay``: one run, from a shell.

Each command attaches the run directory (or submits a config) through the same
``Run`` handle the notebook uses, so the CLI and the notebook see one run the
same way; what is printed is that handle's ``status()``/``summary()``.
"""

from __future__ import annotations

import json
import sys

from workbench.analysis import straggler
from workbench.run.handle import ENDED, attach, submit
from workbench.run.replay import replay
from workbench.spec.load import load_spec
from workbench.spec.preflight import preflight
from workbench.state.run_status import state_lost_text


def print_summary(summary: dict) -> None:
    """The headline figures of a run (``Run.summary()``), one per line; ``n/a`` where not measured."""

    def fmt(v, unit=""):
        return "n/a" if v is None else (f"{v:.2f}{unit}" if isinstance(v, float) else f"{v}{unit}")

    print(f"run {summary['run_dir']}")
    print(f"  state                 {summary['state']}  ({summary['trainer']}, {summary['replicas']} replica groups)")
    print(f"  steps                 {summary['steps_completed']} / {summary['steps_target']}")
    print(f"  faults / restarts     {summary['faults']} / {summary['restarts']}   heals: {summary['heals']}")
    print(
        f"  survivor steps lost   {summary['survivor_steps_lost']}   (discarded attempts: {summary['survivor_steps_discarded']})"
    )
    print(f"  survivor stall        {fmt(summary['survivor_stall_s'], ' s')} beyond a normal step")
    if summary.get("state_lost"):
        print(f"  model state lost      {state_lost_text(summary['state_lost'])}")
    print(f"  kill -> rejoin        {fmt(summary['kill_to_rejoin_s'], ' s')}")
    heal_bytes = summary["heal_bytes"]
    print(
        f"  heal transfer         {fmt(summary['heal_seconds'], ' s')}, "
        f"{'n/a' if heal_bytes is None else f'{heal_bytes / 1e6:.2f} MB'}"
    )
    print(f"  submit -> first step  {fmt(summary['submit_to_first_step_s'], ' s')}")


def follow(handle, detach: bool) -> bool:
    """Wait for a run or sweep unless detached; Ctrl-C stops it. True if it was waited for."""
    if detach:
        return False
    try:
        handle.wait()
    except KeyboardInterrupt:
        handle.stop()
    return True


def cmd_demo(args) -> int:
    run = submit("demo", args.overrides)
    print(
        f"demo: 3 replica groups; replica 1 is SIGKILLed at step 150 and relaunched. run dir: {run.run_dir}", flush=True
    )
    try:
        run.wait(timeout=args.timeout)
    finally:
        if run.state() not in ENDED:
            run.stop()
    summary = run.summary()
    print_summary(summary)
    print(json.dumps(summary))
    return 0 if summary["state"] == "completed" else 1


def cmd_submit(args) -> int:
    run = submit(args.config, args.overrides)
    print(run.run_dir, flush=True)
    if not follow(run, args.detach):
        return 0
    summary = run.summary()
    print_summary(summary)
    return 0 if summary["state"] == "completed" else 1


def cmd_validate(args) -> int:
    spec = load_spec(args.config, args.overrides)
    for w in preflight(spec):
        print(f"warning: {w}", file=sys.stderr)
    print(json.dumps(spec.to_dict(), indent=2))
    return 0


def cmd_status(args) -> int:
    run = attach(args.run)
    st = run.status()
    if args.json:
        print(json.dumps(st))
    else:
        print(
            f"{run.id}: {st['state']}  step {st['step']}/{st['steps_target']}  faults {st['faults']}  restarts {st['restarts']}"
            + (f"  bad event lines {st['bad_lines']}" if st["bad_lines"] else "")
            + (f"  event write gaps {st['write_gaps']} ({st['events_lost']} lost)" if st["write_gaps"] else "")
        )
        if st["reason"]:
            print(f"  ended: {st['reason']}")
        if st.get("state_lost") and not (st["reason"] or "").startswith("state_lost"):
            print(f"  {state_lost_text(st['state_lost'])}")
        if st["reason"] is None and st["controller"] != "running":  # gone without run_end: why, and its trace
            print(f"  {st['controller']}")
        failed = {str(e["replica"]): e for e in st["ends"] if not e["planned"]}  # each group's last unplanned end
        for r, s in st["replicas"].items():
            end = f"  last end: attempt {failed[r]['attempt']}, {failed[r]['summary']}" if r in failed else ""
            print(f"  replica {r}: {s['state']:<13} attempt {s['attempt']}  step {s['step']}{end}")
        if straggler.line(st["stragglers"]):
            print(straggler.line(st["stragglers"]))
        ck = st.get("checkpoints")
        if ck is not None:
            last = ck["last_durable"]
            print(
                "  last durable checkpoint: "
                + (
                    f"step {last['step']}  {last['path']}"
                    + ("" if last["marker_present"] else "  (commit marker missing on disk)")
                    if last
                    else "none"
                )
            )
            for flag in ("incomplete", "skipped"):
                if ck[flag]:
                    print(f"  {flag} save at step {', '.join(map(str, ck[flag]))}")
    return 0


def cmd_kill(args) -> int:
    run = attach(args.run)
    event = run.kill(replica=args.replica, how=args.how, seconds=args.seconds, origin="cli")
    print(json.dumps(event))
    return 0


def cmd_wait(args) -> int:
    run = attach(args.run)
    st = run.wait(timeout=args.timeout)
    print(st["state"])
    return 0 if st["state"] == "completed" else 1


def cmd_stop(args) -> int:
    """Prints the run's state; exits 1 naming each process of the run it did not stop, and why."""
    result = attach(args.run).stop()
    print(result["state"])
    for line in result["not_stopped"]:
        print(f"workbench stop: not stopped: {line}", file=sys.stderr)
    return 1 if result["not_stopped"] else 0


def cmd_metrics(args) -> int:
    df = attach(args.run).metrics()
    if args.csv:
        df.to_csv(sys.stdout, index=False)
    else:
        print(df.to_string(max_rows=40))
    return 0


def cmd_summary(args) -> int:
    summary = attach(args.run).summary()
    print_summary(summary)
    print(json.dumps(summary))
    return 0


def cmd_replay(args) -> int:
    # plotly's subplots, io and colours (40 ms, 87 modules, measured): only `workbench replay` pays for them
    from workbench.analysis.compare_figures import replay_comparison

    run = replay(args.run)
    print(run.run_dir, flush=True)
    if args.detach:
        return 0
    try:
        run.wait()
    except KeyboardInterrupt:
        run.stop()
    both = replay_comparison(attach(args.run), run)
    print(both["table"].drop(columns=["run_dir"], errors="ignore").to_string(index=False))
    print(both["faults"].to_string(index=False))
    return 0 if run.state() == "completed" else 1
