"""The control path is not open to the network, and a run's files are private to its user."""

import ipaddress
import stat

import psutil
import pytest

pytestmark = pytest.mark.slow


def _listeners(pids):
    """Every listening inet socket of the processes ``pids`` and of all their descendants (ranks, MaxText)."""
    procs = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs[pid] = p
            procs.update((c.pid, c) for c in p.children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    out = []
    for pid, p in procs.items():
        try:
            conns = p.net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        out += [(pid, c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return out


def _is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    if getattr(addr, "ipv4_mapped", None):
        addr = addr.ipv4_mapped
    return addr.is_loopback


def _assert_on_loopback(listeners) -> None:
    exposed = [entry for entry in listeners if not _is_loopback(entry[1])]
    assert exposed == [], f"listening beyond loopback: {exposed}"


def test_every_listener_of_a_local_run_is_on_loopback_and_it_still_heals(start_run):
    run = start_run("demo", {"faults": [{"action": "kill", "target": 1, "at_step": 60}], "steps": 100000})
    run.wait_for(lambda r: any(e["kind"] == "heal" for e in r.events_read), timeout=240)
    run.wait_for_step(analysis_step(run) + 20, timeout=60)
    listeners = _listeners(run.pids())
    # the lighthouse, and per replica group at least its store, Manager gRPC and checkpoint HTTP servers
    assert len({pid for pid, _, _ in listeners}) >= 1 + 3 and len(listeners) >= 1 + 3 * 3, listeners
    _assert_on_loopback(listeners)


@pytest.mark.titan
def test_every_listener_of_a_local_titan_run_is_on_loopback_and_it_still_heals(start_run):
    """The job's rendezvous store, and in rank 0 torchft's Manager server, checkpoint server and stores."""
    pytest.importorskip("torchtitan")
    run = start_run(
        "titan-cpu",
        {
            "faults": [{"action": "kill", "target": 1, "at_step": 3}],
            "steps": 100000,
            "titan.overrides": {"training.seq_len": 128},
        },
    )
    healed = lambda r: any(e["kind"] == "heal" and e["replica"] == 1 and e["attempt"] == 1 for e in r.events_read)  # noqa: E731
    run.wait_for(lambda r: healed(r) or r.state() in ("completed", "failed", "stopped"), timeout=900)
    assert run.state() == "running", run.status()
    run.wait_for_step(analysis_step(run) + 2, timeout=300)
    listeners = _listeners(run.pids())
    by_pid = {}
    for pid, _, _ in listeners:
        by_pid[pid] = by_pid.get(pid, 0) + 1
    # the lighthouse; per group its job's store and rank 0's Manager gRPC, checkpoint HTTP and rendezvous store
    assert len(by_pid) >= 1 + 2 * 2 and sum(n >= 3 for n in by_pid.values()) >= 2, listeners
    _assert_on_loopback(listeners)


@pytest.mark.maxtext
def test_every_listener_of_a_local_maxtext_run_is_on_loopback(start_run):
    """JAX's coordination service (its preemption notice) binds [::] unless told otherwise."""
    from workbench.trainers.maxtext import command as maxtext_command

    if not maxtext_command.maxtext_python().exists():
        pytest.skip(
            f"MaxText's environment {maxtext_command.maxtext_python()} is missing: run scripts/setup-maxtext.sh"
        )
    run = start_run("maxtext-cpu-tiny", {"steps": 100000})
    run.wait_for_step(20, timeout=600)
    assert run.state() == "running", run.status()
    listeners = _listeners(run.pids())
    assert listeners, "MaxText's coordinator is not listening"
    _assert_on_loopback(listeners)


def analysis_step(run):
    from workbench import analysis

    return analysis.max_committed_step(run.events_read)


def test_run_directory_and_its_files_are_private(start_run):
    run = start_run("demo", {"faults": [], "steps": 30})
    run.wait(timeout=240)
    run.wait_exited()
    assert stat.S_IMODE(run.run_dir.stat().st_mode) == 0o700
    for path in run.run_dir.rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path} is {oct(mode)}"
    record = (run.run_dir / "run.json").read_text()
    for secret_ish in ("token", "password", "TORCHFT_LIGHTHOUSE"):
        assert secret_ish not in record
