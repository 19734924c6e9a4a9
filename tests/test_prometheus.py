"""`workbench serve-metrics` scraped by Debian's real Prometheus server during a live run.

The run (2 torchft-lite groups on the local backend), the exporter (the CLI
command, as a user starts it) and Prometheus (config and storage in tmp_path,
listening on a free loopback port) are real processes; every one is stopped
by PID, also on failure. The assertions go through Prometheus' HTTP API
(``/api/v1/query``), so they hold for what Prometheus stored, not what the
exporter printed.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from workbench.controller.lighthouse import free_port

from .conftest import REPO

pytestmark = pytest.mark.slow

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
        assert line.split("//")[1].startswith("127.0.0.1:")
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
            ) as prom,
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
        assert prom.returncode is not None
    assert exporter.returncode == 0  # SIGTERM: a clean stop


def test_serve_metrics_refuses_a_bad_port_or_a_non_run_in_one_line(tmp_path):
    from .conftest import workbench_cli

    out = workbench_cli("serve-metrics", str(tmp_path), "--port", "70000")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--port: 70000; allowed: 0-65535" in out.stderr
    out = workbench_cli("serve-metrics", str(tmp_path), "--port", "0")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "not a run directory" in out.stderr
