"""`workbench serve-metrics` scraped by Debian's real Prometheus server during a live run.

The run (2 torchft-lite groups on the local backend), the exporter (the CLI
command, as a user starts it) and Prometheus (config and storage in tmp_path,
listening on a free loopback port) are real processes; every one is stopped
by PID, also on failure. The assertions go through Prometheus' HTTP API
(``/api/v1/query``), so they hold for what Prometheus stored, not what the
exporter printed; where the exporter listens is read off its process's
sockets (``ss``), and its exit is the one SIGTERM gave it, not a kill's.

The rest runs no training: the refusal of a non-loopback ``--addr`` (and
what ``--allow-remote`` opens), and the answer cached between scrapes, through
the exporter's real HTTP endpoint and a Run on a run directory written by hand.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import pytest

from workbench import analysis
from workbench.apps import exporter as wb_exporter
from workbench.controller.lighthouse import free_port
from workbench.events.writer import EventWriter
from workbench.run import rundir
from workbench.run.handle import attach
from workbench.spec.load import load_spec

from .conftest import REPO, tcp_listeners, workbench_cli

SCRAPE_S = 0.5


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def _started(args, **kw):
    proc = subprocess.Popen(args, **kw)
    try:
        yield proc
    finally:
        _stop(proc)


def _query(port: int, q: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def _wait(what: str, fn, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = fn()
        except OSError:  # Prometheus not listening yet
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not seen within {timeout} s")
        time.sleep(0.25)


def _scalar(port: int, q: str):
    res = _query(port, q)
    return float(res[0]["value"][1]) if res else None


@pytest.mark.slow
def test_prometheus_scrapes_a_live_run(start_run, tmp_path):
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("Debian's prometheus is not installed (make prometheus-pkg)")
    run = start_run("demo", ["steps=100000", "faults=[]", "replicas=2", "min_replicas=1"])
    with _started(
        [sys.executable, "-m", "workbench.apps.cli", "serve-metrics", str(run.run_dir), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    ) as exporter:
        line = exporter.stdout.readline()
        assert "/metrics" in line, line
        exporter_port = int(line.rsplit(":", 1)[1].split("/")[0])
        # The socket the exporter opened, not the URL it printed: one listener, on loopback, at that port.
        listening = [(host, port) for _, host, port, _ in tcp_listeners([exporter.pid])]
        assert listening == [("127.0.0.1", exporter_port)], listening
        prom_port = free_port()
        (tmp_path / "prometheus.yml").write_text(
            "global:\n"
            f"  scrape_interval: {int(SCRAPE_S * 1000)}ms\n"
            f"  scrape_timeout: {int(SCRAPE_S * 800)}ms\n"
            "scrape_configs:\n"
            "  - job_name: workbench\n"
            "    static_configs:\n"
            f"      - targets: ['127.0.0.1:{exporter_port}']\n"
        )
        with (
            open(tmp_path / "prometheus.log", "wb") as log,
            _started(
                [
                    prometheus,
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            ),
        ):
            _wait("the exporter's target up", lambda: _scalar(prom_port, 'up{job="workbench"}') == 1.0, 60)
            first = _wait(
                "a committed step in Prometheus",
                lambda: _scalar(prom_port, f'workbench_committed_step{{run="{run.id}"}}'),
                180,
            )
            assert _scalar(prom_port, f'workbench_faults_total{{run="{run.id}"}}') == 0.0
            # The counter grows while the run trains, as Prometheus stored it.
            _wait(
                "the step counter growing",
                lambda: (_scalar(prom_port, f'workbench_committed_step{{run="{run.id}"}}') or 0) >= first + 20,
                60,
            )

            run.kill(replica=1)
            _wait(
                "the kill counted", lambda: _scalar(prom_port, f'workbench_faults_total{{run="{run.id}"}}') == 1.0, 30
            )
            assert _scalar(prom_port, f'workbench_replica_faults_total{{run="{run.id}",replica="1"}}') == 1.0
            assert _scalar(prom_port, f'workbench_replica_faults_total{{run="{run.id}",replica="0"}}') == 0.0
            _wait(
                "the relaunch counted",
                lambda: _scalar(prom_port, f'workbench_replica_restarts_total{{run="{run.id}",replica="1"}}') == 1.0,
                60,
            )
            # The survivor kept training through it: participating, its loss and step time there.
            assert (
                _scalar(prom_port, f'workbench_replica_state{{run="{run.id}",replica="0",state="participating"}}')
                == 1.0
            )
            assert _scalar(prom_port, f'workbench_replica_step_time_seconds{{run="{run.id}",replica="0"}}') > 0
            assert _scalar(prom_port, f'workbench_replica_loss{{run="{run.id}",replica="0"}}') > 0
            goodput = _wait("goodput", lambda: _scalar(prom_port, f'workbench_goodput_ratio{{run="{run.id}"}}'), 30)
            assert goodput > 0  # the run's own steady rate is the yardstick: early on it can read above 1
            assert len(_query(prom_port, f'workbench_badput_seconds{{run="{run.id}"}}')) >= 8
            nodes = _query(prom_port, f'workbench_node_up{{run="{run.id}"}}')
            assert nodes and all(float(n["value"][1]) == 1.0 for n in nodes)

            # The scrape interval achieved, from Prometheus' own sample timestamps.
            samples = _query(prom_port, f'workbench_committed_step{{run="{run.id}"}}[30s]')[0]["values"]
            ts = [float(t) for t, _ in samples]
            values = [float(v) for _, v in samples]
            gaps = [b - a for a, b in zip(ts, ts[1:])]
            interval = statistics.median(gaps)
            print(
                f"\nscrape interval achieved: median {interval:.3f} s, max {max(gaps):.3f} s over {len(gaps)} "
                f"scrapes (configured {SCRAPE_S} s)"
            )
            assert abs(interval - SCRAPE_S) < 0.05 * SCRAPE_S
            assert values == sorted(values) and values[-1] > values[0]
        # Its own exit on SIGTERM, as a service manager stops it (``_stop`` would kill it only after 10 s).
        exporter.send_signal(signal.SIGTERM)
        assert exporter.wait(timeout=30) == 0


def test_serve_metrics_refuses_a_bad_port_or_a_non_run_in_one_line(tmp_path):
    out = workbench_cli("serve-metrics", str(tmp_path), "--port", "70000")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--port: 70000; allowed: 0-65535" in out.stderr
    out = workbench_cli("serve-metrics", str(tmp_path), "--port", "0")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "not a run directory" in out.stderr


def _hand_written_run(tmp_path, steps: int = 5):
    spec = load_spec("demo", ["replicas=2", "faults=[]"], run_root=str(tmp_path)).to_dict()
    run_dir = rundir.create(tmp_path, "r1", spec)
    for r in (0, 1):
        w = EventWriter(run_dir, f"replica-{r}.attempt-0", run="r1", replica=r, attempt=0)
        w.emit("start", trainer="torchft-lite", role="replica")
        for s in range(1, steps + 1):
            w.emit("step", step=s, loss=2.0 / s, committed=True, participating=True, step_time_s=0.03)
    return run_dir


def test_serve_metrics_refuses_a_non_loopback_addr_unless_allowed_and_then_says_it_is_open(tmp_path):
    run_dir = _hand_written_run(tmp_path)
    for addr in ("0.0.0.0", "::", "example.org"):
        # Refused before anything is bound: the command returns (it would serve until stopped otherwise).
        out = workbench_cli("serve-metrics", str(run_dir), "--port", "0", "--addr", addr, timeout=60)
        assert out.returncode == 2 and out.stdout == "", (addr, out)
        assert out.stderr.splitlines() == [
            f"workbench serve-metrics: --addr: {addr!r} is not a loopback address; allowed: 127.0.0.0/8, ::1 or "
            "localhost, or any address with --allow-remote (the endpoint has no authentication)"
        ], addr
    for args, host, warned in (
        (["--addr", "127.0.0.2"], "127.0.0.2", False),  # loopback: no flag needed, nothing to warn of
        (["--addr", "0.0.0.0", "--allow-remote"], "0.0.0.0", True),
    ):
        with _started(
            [sys.executable, "-m", "workbench.apps.cli", "serve-metrics", str(run_dir), "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        ) as proc:
            line = proc.stdout.readline()
            port = int(line.rsplit(":", 1)[1].split("/")[0])
            assert line.startswith(f"serving metrics of r1 on http://{host}:{port}/metrics"), line
            listening = [(h, p) for _, h, p, _ in tcp_listeners([proc.pid])]
            assert listening == [(host, port)], listening
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
            err = proc.stderr.read().splitlines()
        if warned:
            assert err == [
                "workbench serve-metrics: --allow-remote: '0.0.0.0' is not loopback and the endpoint has no "
                "authentication: whoever reaches it reads the run's metrics"
            ]
        else:
            assert err == []


def test_the_exporter_answers_scrapes_within_fresh_s_from_one_collection(tmp_path, monkeypatch):
    """Two scrapes in quick succession, and a burst of them at once, fold the log and compute goodput
    once: counted on the real Run (its refreshes, the events it read) and on ``analysis.goodput``."""
    run_dir = _hand_written_run(tmp_path)
    run = attach(run_dir)
    refreshes, goodputs = [], []
    real_refresh, real_goodput = run.refresh, analysis.goodput
    monkeypatch.setattr(run, "refresh", lambda: refreshes.append(1) or real_refresh())
    monkeypatch.setattr(analysis, "goodput", lambda *a, **k: goodputs.append(1) or real_goodput(*a, **k))
    now = [1000.0]  # the collector's clock, moved by hand: "quick succession" must not depend on the load
    collector = wb_exporter.RunCollector(run, clock=lambda: now[0])
    assert collector.fresh_s == wb_exporter.FRESH_S == 1.0 and collector.goodput_every_s == 5.0
    server, thread = wb_exporter.serve(collector, 0, "127.0.0.1")
    url = f"http://127.0.0.1:{server.server_port}/metrics"

    def scrape() -> str:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.read().decode()

    def faults(body: str) -> float:
        return float(next(x for x in body.splitlines() if x.startswith('workbench_faults_total{run="r1"}')).split()[-1])

    try:
        first = scrape()
        read = len(run.events_read)
        assert (len(refreshes), len(goodputs), faults(first), read) == (1, 1, 0.0, 12)
        EventWriter(run_dir, "control-1", run="r1").emit("fault", action="kill", target=1, origin="api")
        now[0] += 0.5
        assert scrape() == first  # the same answer: the new fault not read, nothing refolded
        bodies: list = []
        burst = [threading.Thread(target=lambda: bodies.append(scrape())) for _ in range(8)]
        for t in burst:
            t.start()
        for t in burst:
            t.join(30)
        assert bodies == [first] * 8
        assert (len(refreshes), len(goodputs), len(run.events_read)) == (1, 1, read)

        now[0] += 0.5  # fresh_s after the first collection: a new one reads the fault
        assert faults(scrape()) == 1.0 and len(run.events_read) == read + 1
        assert (len(refreshes), len(goodputs)) == (2, 1)  # goodput waits for goodput_every_s
        now[0] += 5.0
        scrape()
        assert (len(refreshes), len(goodputs)) == (3, 2)  # the log grew since the last goodput
        now[0] += 5.0
        scrape()
        assert (len(refreshes), len(goodputs)) == (4, 2)  # nothing new: goodput's answer is the same
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
