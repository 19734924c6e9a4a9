"""The drill's probe task: ``python drill_probe.py DRILL_DIR NAME``, one per probe job (see ``drill``).

Standalone (standard library only): the drill copies this file into its
directory, so a probe runs on any node that sees that directory, whatever is
installed there. It records its start and every signal it catches, and
replaces an ``alive`` file every 0.05 s; the last value is when it died.
"""

import json
import os
import signal
import sys
import time

CAUGHT = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP", "SIGCONT", "SIGQUIT", "SIGXCPU", "SIGALRM")


def main(directory: str, probe: str) -> None:
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    name = probe + ("-" + task if task else "")

    def log(**kw: object) -> None:
        with open(os.path.join(directory, name + ".log"), "a") as f:
            f.write(json.dumps({"t": time.time(), **kw}) + "\n")

    def on(signum: int, frame: object) -> None:
        log(ev="signal", sig=signal.Signals(signum).name)

    for s in CAUGHT:
        signal.signal(getattr(signal, s), on)
    log(
        ev="start",
        job=os.environ.get("SLURM_JOB_ID"),
        array_job=os.environ.get("SLURM_ARRAY_JOB_ID"),
        task=task,
        restart=int(os.environ.get("SLURM_RESTART_COUNT", "0")),
        node=os.environ.get("SLURMD_NODENAME"),
    )
    alive = os.path.join(directory, name + ".alive")
    while True:
        with open(alive + ".tmp", "w") as f:
            f.write(repr(time.time()))
        os.replace(alive + ".tmp", alive)
        time.sleep(0.05)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
