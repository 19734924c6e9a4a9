"""The torchft lighthouse, as a supervised child process of the run controller.

The lighthouse decides each quorum: which replica groups take part in the next
step, and who heals from whom. It drops a replica group whose heartbeats stop
for ``heartbeat_timeout_ms``, which is what bounds a survivor's stall after a
kill. It runs as ``torchft_lighthouse`` (not in-process) so that killing it is
a fault like any other, and so it can be restarted on the same address: the
replicas' Managers keep retrying (``TORCHFT_QUORUM_RETRIES``) and reconnect.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def lighthouse_binary() -> str:
    cand = Path(sys.executable).parent / "torchft_lighthouse"
    if cand.exists():
        return str(cand)
    found = shutil.which("torchft_lighthouse")
    if not found:
        raise RuntimeError("torchft_lighthouse not found: install torchft-nightly in this environment")
    return found


class Lighthouse:
    def __init__(self, spec, log_dir: Path, host: str = "127.0.0.1") -> None:
        self.spec = spec
        self.log_dir = Path(log_dir)
        self.host = host
        self.port = spec.lighthouse.port or free_port(host if host not in ("0.0.0.0", "::") else "127.0.0.1")
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def address(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        lh = self.spec.lighthouse
        return [
            lighthouse_binary(),
            "--bind",
            f"{self.host}:{self.port}",
            "--min_replicas",
            str(self.spec.min_replicas),
            "--join_timeout_ms",
            str(lh.join_timeout_ms),
            "--quorum_tick_ms",
            str(lh.quorum_tick_ms),
            "--heartbeat_timeout_ms",
            str(lh.heartbeat_timeout_ms),
        ]

    def start(self, timeout: float = 30.0) -> None:
        """Launch and wait until it listens (the run's first start; restarts use launch/ready)."""
        self.launch()
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"lighthouse did not listen on {self.host}:{self.port} within {timeout}s")
            time.sleep(0.05)

    def launch(self) -> None:
        """Start the process; returns at once."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / "lighthouse.log", "ab")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)  # RUST_LOG: the controller's
        log.close()
        self.starts += 1

    def ready(self) -> bool:
        """True once it accepts connections; RuntimeError if it exited (its port taken, say)."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"lighthouse exited with {self.proc.returncode}; see {self.log_dir}/lighthouse.log")
        try:
            with socket.create_connection((self.host, self.port), timeout=0.05):
                return True
        except OSError:
            return False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
