"""Where a job landed: its node and scheduler job id, and the address Slurm reaches a node at.

A job asks Slurm itself (``scontrol``, with the job's ``SLURM_CONF``) rather
than through the Slurm backend's client: importing :mod:`workbench.cluster`
imports the backends' interface (submitit, the fault table), which a job does
not need. The Slurm client asks the same question through :func:`node_address`.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from typing import Optional

SCONTROL_TIMEOUT_S = 30


def placement() -> dict:
    """Where this job landed: the node and scheduler job id, for the health grid."""
    return {
        "node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        "job_id": os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID"),
    }


def node_address(name: str, conf: Optional[str] = None) -> str:
    """The address Slurm reaches node ``name`` at (``NodeAddr`` of ``scontrol show node -o``).

    The cluster is ``conf``'s, else ``$SLURM_CONF``'s (inside a job: the
    job's). Raises ``LookupError`` naming the node when Slurm does not know it
    (or ``scontrol`` is not installed, or does not answer in
    :data:`SCONTROL_TIMEOUT_S`).
    """
    argv = ["scontrol", "show", "node", "-o", name]
    env = {**os.environ, "SLURM_CONF": conf} if conf else None
    try:
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S)
        failed, out, err = result.returncode, result.stdout, result.stderr
    except FileNotFoundError:
        failed, out, err = 127, "", "scontrol: not installed"
    except subprocess.TimeoutExpired:
        failed, out, err = 124, "", f"scontrol: no answer within {SCONTROL_TIMEOUT_S}s"
    m = re.search(r"(?:^|\s)NodeAddr=(\S+)", out)
    if failed or not m:
        raise LookupError(f"node {name!r}: no NodeAddr from scontrol ({(err or out).strip()})")
    return m.group(1)
