"""Two multi-process MaxText jobs whose first node is the same node: each its own JAX coordinator port.

MaxText's CPU start (``max_utils.initialize_jax_for_cpu``, the real one, in ``.venv-maxtext``) dials
port 1234 whatever the environment says. Here two jobs of two processes each start ``jax.distributed``
through the job launcher with the environment the wrapper gives them, all four processes on this
machine at once; no training runs.
"""

from __future__ import annotations

import os
import subprocess

import psutil
import pytest

from workbench.trainers.maxtext import command as maxtext_command
from workbench.trainers.maxtext.command import JobLayout

from .conftest import kill_pids

pytestmark = [
    pytest.mark.maxtext,
    pytest.mark.skipif(
        not maxtext_command.maxtext_python().exists(),
        reason=f"MaxText's environment {maxtext_command.maxtext_python()} is missing: run scripts/setup-maxtext.sh",
    ),
]

# Stands in for MaxText's trainer: MaxText's own CPU start, then report and hold the service until stdin closes.
PROBE = """
import sys, jax
from maxtext.utils import max_utils
max_utils.initialize_jax_for_cpu({"jax_distributed_initialization_timeout": 60})
print(jax.process_index(), jax.process_count(), flush=True)
sys.stdin.read()
"""


def test_two_jobs_on_one_first_node_start_their_coordinators_on_different_ports(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    jobs = {"4101": [], "4102": []}
    procs = []
    try:
        for job_id, ranks in jobs.items():
            for rank in (0, 1):
                env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
                env.update(
                    maxtext_command.distributed_env(
                        "cpu",
                        JobLayout(rank, 2, ("node-a", "node-b")),
                        "127.0.0.1",
                        "127.0.0.1",
                        maxtext_command.coordinator_port(job_id),
                    )
                )
                env.update(
                    JAX_PLATFORMS="cpu",
                    PYTHONPATH=str(tmp_path),
                    WORKBENCH_WRAPPER_PID=str(os.getpid()),
                    WORKBENCH_MAXTEXT_MODULE="probe",
                )
                p = subprocess.Popen(
                    [str(maxtext_command.maxtext_python()), str(maxtext_command.LAUNCHER)],
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
                procs.append(p)
                ranks.append(p)
        # Every process of both jobs joined its own job's program (readline waits; the timeout bounds it).
        for job_id, ranks in jobs.items():
            assert [p.stdout.readline().split() for p in ranks] == [["0", "2"], ["1", "2"]], job_id
        ports = {}
        for job_id, (rank0, _) in jobs.items():
            listening = {
                c.laddr.port
                for c in psutil.Process(rank0.pid).net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN and c.laddr.ip in ("127.0.0.1", "::ffff:127.0.0.1")
            }
            ports[job_id] = listening
        assert ports["4101"] and ports["4102"] and not ports["4101"] & ports["4102"], ports
        assert maxtext_command.MAXTEXT_CPU_PORT not in ports["4101"] | ports["4102"]
    finally:
        kill_pids([p.pid for p in procs])
        for p in procs:
            p.wait()
