"""Where a hung group is stuck: every process's stack, by py-spy, from the hang detector, the CLI, the API
and the dashboard (issue #41)."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from html import escape as html_escape

import pytest

from tests.conftest import kill_pids, workbench_cli
from workbench.run import stacks
from workbench.widgets.stacks import StacksPanel

OWN = re.compile(r"^(workbench/trainers/|torchft/|torchtitan/)\S+:\d+ in \S+")


def stacks_events(run, **match):
    return [e for e in run.events_read if e["kind"] == "stacks" and all(e.get(k) == v for k, v in match.items())]


def assert_every_process_placed(run, event, pids):
    """The event names its file, which holds every process of the group; each is placed in the trainer's
    own code or torchft's."""
    path = run.run_dir / event["path"]
    assert path.is_file() and event["path"].startswith("stacks/"), event
    assert {p["pid"] for p in event["processes"]} == set(pids), (event, pids)
    text = path.read_text()
    for p in event["processes"]:
        assert p["where"] and OWN.match(p["where"]), p
        assert f"== pid {p['pid']}" in text and p["where"] in text, text


def test_a_stopped_process_is_read_and_left_stopped(tmp_path):
    """A ``hang`` fault SIGSTOPs the group: py-spy's default (ptrace) dump fails on a stopped process, so the
    sampler reads it without pausing it; it must find the frame it is stopped in and leave it stopped."""
    script = tmp_path / "torchft" / "spin.py"  # a file under a folder named like torchft's, so it is "own code"
    script.parent.mkdir()
    script.write_text(
        textwrap.dedent(
            """
            import time
            def wait_here():
                print("ready", flush=True)
                while True:
                    time.sleep(0.01)
            wait_here()
            """
        )
    )
    child = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5  # the signal lands asynchronously
        while not stacks.is_stopped(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        sample = stacks.dump(child.pid)
        assert sample.error is None and sample.stopped and sample.mode == "--nonblocking", sample
        where, _, _ = stacks.locate(sample.threads)
        assert re.fullmatch(r"spin\.py:[456] in wait_here", where), where
        assert stacks.is_stopped(child.pid)
        os.kill(child.pid, signal.SIGCONT)
        running = stacks.dump(child.pid)
        assert running.error is None and not running.stopped and running.mode != "--nonblocking", running
    finally:
        kill_pids([child.pid])
        child.wait()


def test_where_is_the_python_frame_that_called_into_torchfts_native_code():
    """A rank blocked in torchft's Rust extension: py-spy's ``--native`` frames put the extension's symbol
    innermost; ``where`` is the Python line that called it. The two native frames are the ones a titan
    rank's dump gave here (then ``where`` named the extension's symbol); the Python frames stand for its caller."""
    site = "/work/.venv/lib/python3.11/site-packages"
    frames = [
        {"name": "syscall", "filename": "/usr/lib/x86_64-linux-gnu/libc.so.6", "line": 0},
        {
            "name": "_RNvMs_NtCs7XYZHF9EnAN_11parking_lot7condvarNtB4_7Condvar19wait_until_internal",
            "filename": f"{site}/torchft/_torchft.cpython-311-x86_64-linux-gnu.so",
            "line": 0,
        },
        {"name": "should_commit", "filename": f"{site}/torchft/manager.py", "line": 812},
        {"name": "train", "filename": f"{site}/torchtitan/train.py", "line": 601},
    ]
    where, innermost, thread = stacks.locate([{"thread_name": "MainThread", "frames": frames}])
    assert (where, innermost, thread) == (
        "torchft/manager.py:812 in should_commit",
        "libc.so.6 in syscall",
        "MainThread",
    )


@pytest.mark.slow
def test_a_hang_yields_the_stacks_of_the_hung_group_within_the_window_plus_5_s(start_run):
    timeout_s = 2.0
    run = start_run(
        "demo", {"faults": [], "steps": 100000, "replicas": 2, "min_replicas": 1, "hang.timeout_s": timeout_s}
    )
    run.wait_for_step(30, replica=1, timeout=180)  # the group to hang must have committed
    fault = run.kill(replica=1, how="hang", seconds=8)
    run.wait_for(lambda r: stacks_events(r, origin="watchdog", target=1), timeout=timeout_s + 30)
    (event,) = stacks_events(run, origin="watchdog", target=1)
    hang = next(e for e in run.events_read if e["kind"] == "hang" and e["target"] == 1)
    assert event["t"] - fault["t"] <= timeout_s + 5, (fault, hang, event)
    assert hang["t"] <= event["t"] and event["attempt"] == hang["attempt"] == fault["attempt"], (hang, event)
    assert "error" not in event, event
    assert_every_process_placed(run, event, [fault["pid"]])
    assert "the process was stopped" in (run.run_dir / event["path"]).read_text()  # sampled inside the hang
    # the dashboard shows it, from the run's own fold
    panel = StacksPanel(run, run.spec.replicas)
    try:
        html = panel.panel.value
        where = html_escape(event["processes"][0]["where"])  # a frame like build_model.<locals>.TinyDecoder.forward
        assert "replica 1 attempt 0" in html and event["path"] in html and where in html
    finally:
        panel.stop()


@pytest.mark.slow
def test_with_hang_action_kill_the_stacks_are_taken_before_the_kill(start_run):
    """The watchdog samples in a thread; its kill waits for the stacks, which a dead process has no more."""
    run = start_run(
        "demo",
        {"faults": [], "steps": 100000, "replicas": 2, "min_replicas": 1, "hang.timeout_s": 2.0, "hang.action": "kill"},
    )
    run.wait_for_step(30, replica=1, timeout=180)
    fault = run.kill(replica=1, how="hang", seconds=60)

    def killed(r):
        return [e for e in r.events_read if e["kind"] == "fault" and e["origin"] == "watchdog"]

    (kill,) = killed(run.wait_for(killed, timeout=30))
    (event,) = stacks_events(run, origin="watchdog", target=1)
    assert event["t"] < kill["t"] and kill["target"] == 1 and kill["attempt"] == 0, (event, kill)
    assert_every_process_placed(run, event, [fault["pid"]])


@pytest.mark.slow
def test_stacks_on_request_from_the_cli_the_api_and_of_the_controller(start_run):
    run = start_run("demo", {"faults": [], "steps": 100000, "replicas": 2, "min_replicas": 1})
    run.wait_for_step(10, replica=0, timeout=180)
    run.wait_for_step(10, replica=1, timeout=180)
    status = run.status()["replicas"]
    pids = {int(r): s["pid"] for r, s in status.items()}

    cli = workbench_cli("stacks", str(run.run_dir), "--replica", "0")
    assert cli.returncode == 0, cli.stderr
    run.refresh()
    (event,) = stacks_events(run, origin="cli", target=0)
    assert_every_process_placed(run, event, [pids[0]])
    assert f"pid {pids[0]}: {event['processes'][0]['where']}" in cli.stdout, cli.stdout

    cli = workbench_cli("stacks", str(run.run_dir), "--controller")
    assert cli.returncode == 0, cli.stderr
    run.refresh()
    (ctl,) = stacks_events(run, origin="cli", target="controller")
    assert [p["pid"] for p in ctl["processes"]] == [run.run_state.controller.pid], ctl
    assert ctl["processes"][0]["where"].startswith("workbench/controller/"), ctl
    assert (run.run_dir / ctl["path"]).is_file()

    events = run.stacks()  # every group
    assert [e["target"] for e in events] == [0, 1] and all(e["origin"] == "api" for e in events), events
    for e in events:
        assert_every_process_placed(run, e, [pids[e["target"]]])

    bad = workbench_cli("stacks", str(run.run_dir), "--replica", "5")
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "workbench stacks: replica: 5 out of range; allowed: 0..1 or 'controller'"
    ), bad.stderr
    run.refresh()
    assert len(stacks_events(run)) == 4  # the refused request wrote nothing


@pytest.mark.slow
@pytest.mark.titan
def test_every_rank_of_a_two_rank_titan_group_is_sampled(start_run):
    run = start_run(
        "titan-cpu",
        {
            "steps": 1000,
            "faults": [],
            "replicas": 1,
            "min_replicas": 1,
            "nproc_per_replica": 2,
            "titan.overrides": {"training.seq_len": 128},
        },
    )
    run.wait_for_step(2, replica=0, timeout=300)
    (event,) = run.stacks(0)
    ranks = sorted(p["rank"] for p in event["processes"] if p["rank"] is not None)
    assert ranks == [0, 1], event
    job = run.status()["replicas"]["0"]["pid"]
    assert job in [p["pid"] for p in event["processes"]], event
    for p in event["processes"]:
        assert p["where"] and OWN.match(p["where"]), p


def test_the_panel_keeps_each_targets_newest_stacks_whatever_order_they_are_read_in(tmp_path):
    """Two writers' files are read one after the other, so an older ``stacks`` event (the watchdog's) can be
    read after a newer one (a button's): the panel shows the newest of each target, with its file."""
    from workbench.widgets.stacks import newest, stacks_html

    (tmp_path / "stacks").mkdir()
    for name in ("old", "new", "ctl"):
        (tmp_path / "stacks" / f"{name}.txt").write_text(f"the {name} file <b>")
    where = "torchft/process_group.py:123 in allreduce"
    new = {
        "kind": "stacks",
        "t": 20.0,
        "target": 1,
        "attempt": 2,
        "origin": "button",
        "path": "stacks/new.txt",
        "processes": [{"pid": 7, "rank": None, "where": where, "innermost": "libgloo.so in recv"}],
    }
    old = {**new, "t": 10.0, "attempt": 1, "origin": "watchdog", "path": "stacks/old.txt"}
    ctl = {
        "kind": "stacks",
        "t": 5.0,
        "target": "controller",
        "origin": "cli",
        "path": "stacks/ctl.txt",
        "processes": [],
        "error": "pid 3 has exited",
    }
    latest = newest([new, {"kind": "step", "t": 30.0}, old, ctl], {}, tmp_path)
    assert {k: (e["path"], text) for k, (e, text) in latest.items()} == {
        "1": ("stacks/new.txt", "the new file <b>"),
        "controller": ("stacks/ctl.txt", "the ctl file <b>"),
    }
    html = stacks_html(latest)
    assert html.index("replica 1 attempt 2") < html.index("controller")  # groups first
    assert f"pid 7: {where}" in html and "not sampled: pid 3 has exited" in html
    assert "the new file &lt;b&gt;" in html and "the new file <b>" not in html  # the text is escaped


@pytest.mark.parametrize(
    "extra, message",
    [
        ((), "replica: nothing to sample: replica 0 attempt 0 has no live process; replica 1 attempt 0 has"),
        (("--controller",), "replica: nothing to sample: the run has no recorded controller"),
        (("--replica", "3"), "replica: 3 out of range; allowed: 0..2 or 'controller'"),
    ],
)
def test_a_request_with_nothing_to_sample_is_refused_in_one_line_and_writes_nothing(tmp_path, extra, message):
    import workbench as wb
    from workbench.run import rundir

    run_dir = rundir.create(tmp_path, "never-started", wb.load_spec("demo").to_dict())
    out = workbench_cli("stacks", str(run_dir), *extra)
    assert out.returncode == 2 and out.stderr.startswith(f"workbench stacks: {message}"), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (run_dir / "stacks").exists() and not list((run_dir / "events").glob("control-*"))
