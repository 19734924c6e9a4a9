"""A writer that meets a real write error keeps the process running, keeps its events, and records the gap.

Two real ways a file stops taking appends: a file-size limit (``RLIMIT_FSIZE`` in a child process, with
SIGXFSZ ignored so ``write`` fails with EFBIG, as a quota would; no root needed) and a full filesystem (a
64 KiB tmpfs, as root). In both the line that meets the limit goes in only in part, so the tests also hold
the writer to its contract: every line of the file whole and once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.events.reader import EventReader
from workbench.events.writer import EventWriter
from workbench.run import rundir
from workbench.spec.load import load_spec
from workbench.state.fold import RunState

REPO = Path(__file__).resolve().parent.parent
WRITER_MODULE = "workbench.events.writer"

# The child: a controller that writes `start`, meets a file-size limit a few bytes past the end of its
# file for `n` step events (emitted by `writers` EventWriters of that one file), then has room again and
# writes `run_end`. It prints what each emit returned and the file's bytes as the limit left them.
CHILD = """
import json, os, resource, signal, sys
from {module} import EventWriter
import {module} as writer_module

run_dir, n, writers, backlog = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if backlog:
    writer_module.BACKLOG_BYTES = backlog
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
ws = [EventWriter(run_dir, "controller", run="r") for _ in range(writers)]
ws[0].emit("start", role="controller")
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
before = os.path.getsize(ws[0].path)
resource.setrlimit(resource.RLIMIT_FSIZE, (before + 40, hard))
written = [ws[s % writers].emit("step", step=s) is not None for s in range(1, n + 1)]
during = open(ws[0].path, "rb").read()[before:].decode()
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
written.append(ws[-1].emit("run_end", state="completed", reason="done") is not None)
print(json.dumps({{"written": written, "during": during}}))
"""


def run_child(run_dir: Path, n: int, writers: int = 1, backlog: int = 0) -> tuple[dict, str]:
    """Run the child (stopped by its timeout if it hangs: subprocess.run kills it by PID); its report and stderr."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(module=WRITER_MODULE), str(run_dir), str(n), str(writers), str(backlog)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr  # a writer that cannot write does not end its process
    return json.loads(out.stdout), out.stderr


def whole_lines(path: Path) -> list[dict]:
    """Every line of the file, each of which must be a whole JSON object: no torn line, at the end or inside."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), data[-80:]
    return [json.loads(line) for line in data.splitlines()]


def test_events_after_a_file_size_limit_land_and_the_gap_says_how_many_came_late(tmp_path):
    run_dir = rundir.create(tmp_path / "runs", "r1", load_spec("demo", {"replicas": 2, "faults": []}).to_dict())
    report, stderr = run_child(run_dir, n=5)
    assert report["written"] == [False] * 5 + [True]
    assert report["during"] and not report["during"].endswith("\n")  # the limit cut a line: a half line was in
    assert stderr.count("is not writable") == 1, stderr  # once for the episode, not once per event
    assert stderr.count("is writable again: 5 events written late, 0 lost") == 1, stderr

    lines = whole_lines(run_dir / "events" / "controller.jsonl")
    kinds = [(e["kind"], e.get("step")) for e in lines]
    assert kinds == [("start", None), *[("step", s) for s in range(1, 6)], ("write_gap", None), ("run_end", None)]
    gap = lines[6]
    assert (gap["delayed"], gap["lost"], gap["since"]) == (5, 0, lines[1]["t"])
    assert "File too large" in gap["error"], gap

    reader = EventReader(run_dir)
    state = RunState(2)
    state.apply(reader.poll())
    assert reader.skipped_lines == 0
    assert (state.write_gaps, state.events_lost, state.state) == (1, 0, "completed")
    import workbench as wb

    status = wb.attach(run_dir).status()  # what `workbench status --json` prints
    assert (status["write_gaps"], status["events_lost"]) == (1, 0)


def test_a_backlog_past_its_bound_keeps_the_newest_events_and_counts_the_lost(tmp_path):
    report, stderr = run_child(tmp_path, n=40, backlog=1500)
    assert report["written"] == [False] * 40 + [True]
    lines = whole_lines(tmp_path / "events" / "controller.jsonl")
    gap = next(e for e in lines if e["kind"] == "write_gap")
    assert gap["lost"] > 0 and gap["delayed"] + gap["lost"] == 40, gap
    steps = [e["step"] for e in lines if e["kind"] == "step"]
    # step 1 was half in when the limit came: it is completed, not dropped; the rest kept are the newest
    assert steps == [1, *range(41 - (gap["delayed"] - 1), 41)], steps
    assert f"{gap['delayed']} events written late, {gap['lost']} lost" in stderr


def test_two_writers_of_one_file_in_one_process_never_glue_a_line_to_a_half_line(tmp_path):
    report, _ = run_child(tmp_path, n=6, writers=2)
    assert report["written"] == [False] * 6 + [True]
    lines = whole_lines(tmp_path / "events" / "controller.jsonl")
    assert [e["step"] for e in lines if e["kind"] == "step"] == list(range(1, 7))
    assert [e["kind"] for e in lines].count("write_gap") == 1


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs (root only), unmounted after the test; a missing prerequisite skips (under CI=true: fails)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mnt)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"mount -t tmpfs failed: {mounted.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)]).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], check=True)


def test_a_full_filesystem_delays_events_and_the_process_goes_on(full_disk, capsys):
    w = EventWriter(full_disk / "run", "replica-0.attempt-0", run="r", replica=0)
    assert w.emit("start", role="replica") is not None
    filler = full_disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 4096)
        except OSError:
            pass  # the filesystem is full
    written = [w.emit("step", step=s) is not None for s in range(1, 200)]
    assert False in written, "the tmpfs never filled"
    first_unwritten = written.index(False)
    assert not any(written[first_unwritten:])  # once one failed, none went in ahead of it
    assert not w.path.read_bytes().endswith(b"\n")  # the disk filled mid-line: a half line is in
    filler.unlink()
    assert w.emit("exit", reason="completed", step=199) is not None
    w.close()
    lines = whole_lines(w.path)
    assert [e["step"] for e in lines if e["kind"] == "step"] == list(range(1, 200))
    gap = next(e for e in lines if e["kind"] == "write_gap")
    assert (gap["delayed"], gap["lost"]) == (199 - first_unwritten, 0), gap
    assert "No space left on device" in gap["error"]
    assert [e["kind"] for e in lines][-2:] == ["write_gap", "exit"]
    assert capsys.readouterr().err.count("is not writable") == 1


def test_a_writer_says_since_when_its_file_fails(tmp_path):
    """``failing_since``: what a controller reads to end a run whose run root stays unwritable."""
    w = EventWriter(tmp_path / "run", "controller", run="r")
    assert w.emit("start", role="controller") is not None and w.failing_since is None
    w.close()
    (tmp_path / "run" / "events" / "controller.jsonl").unlink()
    (tmp_path / "run" / "events").rmdir()
    (tmp_path / "run" / "events").write_text("a file where the directory was")
    failed = w.emit("warning", message="lost for now")
    assert failed is None and w.failing_since is not None and "FileExistsError" in w.error
    (tmp_path / "run" / "events").unlink()
    assert w.emit("warning", message="in") is not None and w.failing_since is None
