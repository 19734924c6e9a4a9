"""The notebook dies, the run does not: a new kernel attaches, sees everything, and controls it."""

import os
import signal

import pytest
from jupyter_client.manager import start_new_kernel

import workbench as wb
from workbench import analysis

pytestmark = pytest.mark.slow


def _run_in(client, code: str) -> None:
    reply = client.execute_interactive(code, timeout=120)
    assert reply["content"]["status"] == "ok", reply["content"]


def test_kernel_killed_mid_run_then_attach_kill_and_stop(run_root, tmp_path):
    out = tmp_path / "run_dir.txt"
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        _run_in(
            kc,
            "import os, workbench as wb\n"
            "run = wb.submit('demo', {'faults': [], 'steps': 100000})\n"
            f"open({str(out)!r}, 'w').write(str(run.run_dir))\n"
            "run.wait_for_step(30, timeout=240)",
        )
        os.kill(km.provisioner.pid, signal.SIGKILL)  # the kernel dies without a chance to clean up
    except BaseException:
        if out.exists():  # the run outlives its kernel by design: stop it here
            wb.attach(out.read_text()).stop()
        raise
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)  # reaps it (and kills it, should the test have failed before)
    run = wb.attach(out.read_text())
    try:
        step_at_death = analysis.max_committed_step(run.event_records())
        run.wait_for_step(step_at_death + 50, timeout=120)  # it kept training without its kernel
        events = run.event_records()
        assert any(e["kind"] == "start" and e.get("role") == "controller" for e in events)  # full history
        fault = run.kill(replica=1)
        run.wait_for(
            lambda r: any(e["kind"] == "heal" and e["replica"] == 1 and e["t"] > fault["t"] for e in r.events_read),
            timeout=180,
        )
        assert run.stop()["state"] == "stopped"
        assert run.pids() == []
    finally:
        if run.state() not in ("completed", "failed", "stopped"):
            run.stop()
