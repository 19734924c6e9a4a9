"""Claims of docs/security.md that no other test checked, each checked for real and as cheaply as it can be.

Another local user is played by uid 65534 (``nobody``) through ``subprocess``'s ``user=``: it runs
``cat``, ``ls`` and ``kill`` (not Python: the interpreter lives under root's 0700 home), and each of its
refusals is paired with something it can do, so a test cannot pass because the user switch or the path
failed. Switching users needs root (the suite runs as root; elsewhere these tests skip, and under
``CI=true`` a skip fails). Every process a test starts is stopped by PID, also on failure; nothing is
written outside the test's own temporary directories, except one owner record under ``/run/wbn-faults``
that the test removes.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from workbench.cluster.procs import MARKER_FILE, RUN_MARKER, Marker, Proc, start_time
from workbench.controller.lighthouse import free_port, socket_inodes, tcp_listeners
from workbench.events.writer import EventWriter
from workbench.run import rundir
from workbench.spec.load import load_spec

from .conftest import REPO, kill_pids

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="playing another local user (uid 65534) needs root")


def as_nobody(*argv: str) -> subprocess.CompletedProcess:
    """``argv`` run as uid/gid 65534 with no supplementary groups."""
    return subprocess.run(
        list(argv), user=NOBODY, group=NOBODY, extra_groups=[], cwd="/", capture_output=True, text=True, timeout=30
    )


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


def _modes(top: Path) -> dict[str, int]:
    return {str(p.relative_to(top)): stat.S_IMODE(p.lstat().st_mode) for p in [top, *top.rglob("*")]}


@contextlib.contextmanager
def public_dir():
    """A directory under /tmp that every user may enter (0755): only what is made inside it keeps them out."""
    top = Path(tempfile.mkdtemp(prefix="wb-security-", dir="/tmp"))
    try:
        top.chmod(0o755)
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


@contextlib.contextmanager
def sleepers(*specs: tuple[int, dict]):
    """One ``sleep`` per (uid, extra environment); killed by PID at the end, also on failure."""
    base = {k: v for k, v in os.environ.items() if k != RUN_MARKER}
    started = []
    try:
        for uid, extra in specs:
            ids = {} if uid == os.geteuid() else {"user": uid, "group": uid, "extra_groups": []}
            started.append(subprocess.Popen(["sleep", "300"], env={**base, **extra}, cwd="/", **ids))
        for p in started:
            _wait(lambda p=p: start_time(p.pid) is not None, 10, f"sleep {p.pid} to start")
        yield started
    finally:
        kill_pids(p.pid for p in started)
        for p in started:
            p.wait()


def _proc(p: subprocess.Popen) -> Proc:
    return Proc(p.pid, None, start_time(p.pid))


# -- who may read a run ------------------------------------------------------------------------------


@needs_root
def test_another_local_user_reads_nothing_in_a_run_or_sweep_directory_whatever_the_umask(tmp_path):
    """The directories are made 0700 and the files 0600 by the code that makes them, not by the umask of
    whoever runs it (a notebook's is usually 022): checked under umask 0, for a run, a sweep and a run root
    the workbench creates. Then uid 65534, which can read a 0644 file beside them, can neither list the run
    directory nor read its record, marker or events."""
    from workbench.experiments.sweep import sweepdir

    with public_dir() as top:
        runs = top / "runs"
        (runs / "sweeps").mkdir(parents=True)  # made 0755 here: the run's own directory is what is tested
        for d in (runs, runs / "sweeps"):
            d.chmod(0o755)
        (top / "readable").write_text("anyone\n")
        (top / "readable").chmod(0o644)
        spec = load_spec("demo", {"faults": [], "run_root": str(runs)})
        old = os.umask(0)
        try:
            run_dir = rundir.create(runs, rundir.new_run_id("sec"), spec.to_dict())
            EventWriter(run_dir, "control-1", run=run_dir.name).emit("warning", message="a notebook's line")
            sweep_dir = sweepdir.create(spec, [{"steps": 10}], 1)
            rundir.create(top / "made-here", rundir.new_run_id("sec"), spec.to_dict())  # a run root it creates
        finally:
            os.umask(old)
        assert stat.S_IMODE((top / "made-here").stat().st_mode) == 0o700

        for top_dir in (run_dir, sweep_dir):
            modes = _modes(top_dir)
            assert {m for p, m in modes.items() if (top_dir / p).is_dir()} == {0o700}, modes
            assert {m for p, m in modes.items() if not (top_dir / p).is_dir()} == {0o600}, modes
        assert {"run.json", MARKER_FILE, "events/control-1.jsonl"} <= set(_modes(run_dir))
        assert {"sweep.json", MARKER_FILE} <= set(_modes(sweep_dir))

        control = as_nobody("cat", str(top / "readable"))
        assert control.returncode == 0 and control.stdout == "anyone\n", control.stderr
        assert set(as_nobody("ls", str(runs)).stdout.split()) == {"sweeps", run_dir.name}  # names are visible, no more
        for argv in (
            ("ls", str(run_dir)),
            ("cat", str(run_dir / "run.json")),
            ("cat", str(run_dir / MARKER_FILE)),
            ("cat", str(run_dir / "events" / "control-1.jsonl")),
            ("cat", str(sweep_dir / MARKER_FILE)),
        ):
            out = as_nobody(*argv)
            assert out.returncode != 0 and "Permission denied" in out.stderr, (argv, out)


# -- who may signal a run's processes ----------------------------------------------------------------


@needs_root
def test_another_user_cannot_read_the_marker_from_a_runs_process_and_carrying_it_proves_nothing(tmp_path):
    """With real users: the run's secret is in its processes' environment, which uid 65534 cannot read
    (nor signal the process, as it can its own); a process of uid 65534 that carries the secret anyway is
    refused, because it is not the run directory's owner's; and once the directory is 65534's, root's own
    process with the secret is refused in turn (root running ``workbench stop`` on a user's run proves only
    that user's processes). Proc.signal is the one gate every path that signals goes through."""
    run_dir = rundir.create(tmp_path / "runs", rundir.new_run_id("sec"), load_spec("demo").to_dict())
    marker = Marker.of(run_dir)
    assert marker is not None and marker.uid == 0
    with sleepers((0, marker.env()), (NOBODY, marker.env()), (NOBODY, {})) as (own, foreign, strangers):
        assert _proc(own).why_not_ours(marker) is None
        environ = as_nobody("cat", f"/proc/{own.pid}/environ")
        assert environ.returncode != 0 and "Permission denied" in environ.stderr, environ
        assert marker.value not in environ.stdout
        assert as_nobody("cat", f"/proc/{strangers.pid}/environ").returncode == 0  # its own: it can
        assert as_nobody("kill", "-0", str(own.pid)).returncode != 0
        assert as_nobody("kill", "-0", str(strangers.pid)).returncode == 0

        why = _proc(foreign).why_not_ours(marker)
        assert why == f"pid {foreign.pid} (sleep) belongs to uid {NOBODY}, not to the owner of the run (uid 0)"
        assert not _proc(foreign).signal(signal.SIGKILL, marker) and foreign.poll() is None

        os.chown(run_dir, NOBODY, NOBODY)
        theirs = Marker.of(run_dir)
        assert theirs.uid == NOBODY and theirs.value == marker.value
        assert _proc(own).why_not_ours(theirs) == (
            f"pid {own.pid} (sleep) belongs to uid 0, not to the owner of the run (uid {NOBODY})"
        )
        assert not _proc(own).signal(signal.SIGKILL, theirs) and own.poll() is None
        assert _proc(foreign).why_not_ours(theirs) is None  # the owner's process with the secret: the run's
        assert _proc(foreign).signal(signal.SIGKILL, theirs)
        assert foreign.wait(timeout=30) == -signal.SIGKILL


@pytest.mark.slow
def test_a_real_runs_marker_is_in_its_processes_environment_and_nowhere_a_reader_could_find_it(start_run):
    """The secret rides in the environment only: on no command line of the run's processes (every local
    user reads ``/proc/PID/cmdline``), and in no file of the run directory but ``process-marker`` (run.json,
    the events, controller.log, the jobs' logs and submitit's pickles)."""
    run = start_run("demo", {"faults": [], "replicas": 2, "min_replicas": 1, "steps": 40})
    run.wait_for_step(3, timeout=240)
    marker = Marker.of(run.run_dir)
    tree = [psutil.Process(pid) for pid in run.pids()]
    tree += [c for p in list(tree) for c in p.children(recursive=True)]
    assert len({p.pid for p in tree}) >= 4, tree  # the controller, the lighthouse, the fork server, two groups
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            assert p.environ().get(RUN_MARKER) == marker.value, p
            assert marker.value not in " ".join(p.cmdline()), p.cmdline()
    status = run.wait(timeout=300)
    assert status["state"] == "completed", status
    run.wait_exited()
    holding = [
        str(path.relative_to(run.run_dir))
        for path in run.run_dir.rglob("*")
        if path.is_file() and marker.value.encode() in path.read_bytes()
    ]
    assert holding == [MARKER_FILE], holding


# -- what listens where ------------------------------------------------------------------------------


def _listening(pids) -> list[tuple[int, str, int]]:
    out = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            out += [
                (pid, c.laddr.ip, c.laddr.port)
                for c in psutil.Process(pid).net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN
            ]
    return out


def _get(url: str) -> int:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    try:
        with urllib.request.build_opener(NoRedirect).open(url, timeout=120) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _wait_listening(proc: subprocess.Popen, port: int, log: Path, timeout: float = 120) -> None:
    def up() -> bool:
        assert proc.poll() is None, f"exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    _wait(up, timeout, f"a listener on 127.0.0.1:{port}")


def _stop_tree(proc: subprocess.Popen, seen: dict) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for p in seen.values():  # psutil checks the PID is still that process (its start time) before killing
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def test_the_classroom_page_with_faults_listens_on_loopback_only_and_its_token_is_in_no_log(tmp_path):
    """``workbench classroom --faults`` with a page loaded: Voilà and the page's kernel (its ZMQ ports,
    whose messages are signed with a key in a connection file only the owner reads) listen on 127.0.0.1
    only; the token is printed on the command's stdout and nowhere in its or Voilà's log."""
    pytest.importorskip("voila", reason="the classroom page needs Voilà: make browser-env")
    port, log = free_port(), tmp_path / "classroom.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "workbench.apps.cli", "classroom", "--run-root", str(tmp_path), "--port", str(port)]
            + ["--faults"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            stdin=subprocess.DEVNULL,
        )
    seen: dict[int, psutil.Process] = {}
    try:
        found = None
        while found is None:
            line = proc.stdout.readline()
            assert line, f"workbench classroom exited ({proc.wait()}):\n{log.read_text()[-3000:]}"
            assert "fault buttons off" not in line, line
            found = re.search(rf"http://127\.0\.0\.1:{port}/\?token=(\w+)", line)
        token = found.group(1)
        _wait_listening(proc, port, log)
        assert _get(f"http://127.0.0.1:{port}/?token={token}") == 200  # the page ran in a kernel of its own

        def kernels():
            children = psutil.Process(proc.pid).children(recursive=True)
            seen.update((c.pid, c) for c in children)
            return [c for c in children if "ipykernel_launcher" in " ".join(c.cmdline())]

        (kernel,) = _wait(kernels, 60, "the page's kernel")

        def listening_kernel():  # its five ZMQ channels (shell, iopub, stdin, control, heartbeat)
            found = _listening(seen)
            return found if len([x for x in found if x[0] == kernel.pid]) >= 5 else None

        listeners = _wait(listening_kernel, 60, f"the kernel's listeners: {_listening(seen)}")
        assert [x for x in listeners if x[1] != "127.0.0.1"] == [], listeners
        assert any(x[2] == port for x in listeners), listeners  # Voilà itself
        connection = Path(kernel.cmdline()[kernel.cmdline().index("-f") + 1])
        assert stat.S_IMODE(connection.stat().st_mode) & 0o077 == 0  # 0600
        assert stat.S_IMODE(connection.parent.stat().st_mode) & 0o077 == 0  # 0700 (and sticky)
    finally:
        _stop_tree(proc, seen)
    assert token not in log.read_text(), "the token is in the page's log"


def test_make_lab_serves_jupyterlab_on_loopback_and_refuses_a_request_without_its_token(tmp_path):
    """The command ``make lab`` runs (read off ``make -n lab``, run with a free port and a private
    runtime directory): it listens on 127.0.0.1 only, answers 403 without the token it printed, 200
    with it, and the token is on no command line."""
    dry = subprocess.run(["make", "-n", "lab"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.replace("\\\n", " ").splitlines()
    (command,) = [line.split() for line in lines if " lab " in line and "jupyter" in line.split()[0]]
    assert "--ip" in command and command[command.index("--ip") + 1] == "127.0.0.1", command
    port, log = free_port(), tmp_path / "lab.log"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("JUPYTER_TOKEN", "JUPYTER_TOKEN_FILE")},
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
    }
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*command, f"--port={port}", "--ServerApp.port_retries=0"],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    seen: dict[int, psutil.Process] = {proc.pid: psutil.Process(proc.pid)}
    try:
        _wait_listening(proc, port, log)
        token = _wait(lambda: re.findall(rf"127\.0\.0\.1:{port}/lab\?token=(\w+)", log.read_text()), 60, "the URL")[0]
        seen.update((c.pid, c) for c in psutil.Process(proc.pid).children(recursive=True))
        listeners = _listening(seen)
        assert listeners and [x for x in listeners if x[1] != "127.0.0.1"] == [], listeners
        assert _get(f"http://127.0.0.1:{port}/api/status") == 403
        assert _get(f"http://127.0.0.1:{port}/api/status?token=not{token}") == 403
        assert _get(f"http://127.0.0.1:{port}/api/status?token={token}") == 200
        for p in seen.values():
            assert token not in " ".join(p.cmdline()), p.cmdline()
    finally:
        _stop_tree(proc, seen)


def test_a_runs_store_listens_on_loopback_on_its_own_socket_with_a_port_the_kernel_chose():
    """``trainers/loopback.loopback_store``: the store's port is the one the kernel gave the socket it
    bound itself (port 0), on 127.0.0.1, and the only listener at that port is that socket, so no port
    is picked in advance for another run (or user) to take first."""
    from workbench.trainers import loopback

    store = loopback.loopback_store()
    sock = loopback._LISTEN_SOCKETS[-1]
    try:
        assert sock.getsockname() == ("127.0.0.1", store.port)
        at_port = tcp_listeners(store.port)
        assert [x.ip for x in at_port] == ["127.0.0.1"], at_port
        assert {x.inode for x in at_port} == {os.fstat(sock.fileno()).st_ino} <= socket_inodes(os.getpid())
    finally:
        del store


# -- the classroom page's fault buttons ---------------------------------------------------------------


def test_a_click_sent_to_the_hidden_fault_button_of_a_page_without_faults_injects_nothing(tmp_path):
    """Without ``--faults`` the page's kernel still builds the fault controls (not shown), and a browser
    could message the button's widget by its id: the click arrives as the comm message a browser sends,
    and no fault is asked of the run; the same message to a page with faults asks for one."""
    from workbench.widgets import Dashboard

    spec = load_spec("demo", ["replicas=2", f"run_root={tmp_path}"])
    run_dir = rundir.create(tmp_path, rundir.new_run_id("sec"), spec.to_dict())
    click = {"content": {"data": {"method": "custom", "content": {"event": "click"}}}, "buffers": []}
    asked = {}
    for faults in (False, True):
        page = Dashboard(run_dir, faults=faults, start=False)
        asked[faults] = []
        page.run.fault = lambda *a, asked=asked[faults], **k: asked.append((a, k)) or {"kind": "fault", "target": 1}
        page.controls.inject_button._handle_msg(click)
        page.close()
    assert asked[False] == [], asked
    assert len(asked[True]) == 1 and asked[True][0][1]["origin"] == "button", asked


# -- the page's token file, and machine-level fault records --------------------------------------------


def test_the_page_token_file_is_private_and_a_callers_jupyter_token_is_not_passed_on(tmp_path, monkeypatch):
    from workbench.apps import classroom

    private = tmp_path / "page"
    private.mkdir(mode=0o700)
    monkeypatch.setenv("JUPYTER_TOKEN", "the-callers-own")
    token = secrets.token_hex(8)
    old = os.umask(0)
    try:
        env = classroom.voila_env(private, token)
    finally:
        os.umask(old)
    assert "JUPYTER_TOKEN" not in env and token not in env.values()
    path = Path(env["JUPYTER_TOKEN_FILE"])
    assert path.parent == private and path.read_text() == token and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not any(token in a for a in classroom.voila_command(tmp_path / "page.ipynb", 8866))


@needs_root
def test_a_host_faults_owner_record_is_roots_alone(tmp_path):
    """The records ``cluster down`` and a run's stop trust to tell whose a fault object is: 0600 under
    umask 0, in a directory of root's that no one else can write."""
    from workbench.faults import host as hostfaults

    run_dir = rundir.create(tmp_path / "runs", rundir.new_run_id("sec"), load_spec("demo").to_dict())
    name = f"{hostfaults.PREFIX}sec{secrets.token_hex(4)}.slow_link"
    old = os.umask(0)
    try:
        path = Path(hostfaults.write_record(name, run_dir, "slow_link", node=f"sec{secrets.token_hex(4)}"))
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == 0
        folder = path.parent.stat()
        assert folder.st_uid == 0 and stat.S_IMODE(folder.st_mode) & 0o022 == 0, oct(folder.st_mode)
        assert hostfaults.records()[name]["run_id"] == run_dir.name
    finally:
        hostfaults._drop_record(name)
    assert name not in hostfaults.records()
