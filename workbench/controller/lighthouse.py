"""The torchft lighthouse, as a supervised child process of the run controller.

The lighthouse decides each quorum: which replica groups take part in the next
step, and who heals from whom. It drops a replica group whose heartbeats stop
for ``heartbeat_timeout_ms``, which is what bounds a survivor's stall after a
kill. It runs as ``torchft_lighthouse`` (not in-process) so that killing it is
a fault like any other, and so it can be restarted on the same address: the
replicas' Managers keep retrying (``TORCHFT_QUORUM_RETRIES``) and reconnect.
:class:`LighthouseSupervisor` is that supervision: the controller ticks it,
and it restarts a dead lighthouse without ever blocking the loop.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from workbench.cluster import procs
from workbench.events.writer import EventWriter
from workbench.run import rundir
from workbench.trainers.torchft import quorum_epochs

START_S = 30.0  # a restart that does not listen within this has failed
RETRIES = 8  # failed restarts in a row before the run fails
BACKOFF_S = 0.5  # after the first failed restart; doubling, at most 10 s


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


class LighthouseSupervisor:
    """Keeps the run's lighthouse up, and says so: a ``lighthouse`` event (``up``, ``down``) for each change."""

    def __init__(self, lighthouse: Lighthouse, run_dir: Path, writer: EventWriter) -> None:
        self.lighthouse = lighthouse
        self.run_dir = run_dir
        self.writer = writer
        self.down_t: Optional[float] = None
        self.next_try = 0.0
        self.pending: Optional[float] = None  # launched, not listening yet: give up at this time
        self.failures = 0
        self.launched_t: Optional[float] = None

    @property
    def address(self) -> str:
        return self.lighthouse.address

    def start(self) -> None:
        """The run's first start: blocks until it listens."""
        self._write_epoch()
        self.lighthouse.start()
        self._event("up")

    def supervise(self) -> None:
        """Restart a dead lighthouse on the same address, without ever blocking the loop: launch,
        then check each tick whether it listens. A start that fails (its port was taken meanwhile,
        say) is retried with exponential backoff, ``RETRIES`` times, then the run fails."""
        lh, now = self.lighthouse, time.time()
        if self.pending is not None:
            try:
                if lh.ready():
                    self.pending, self.down_t, self.failures = None, None, 0
                    self._event("up", restarted=True, launched_t=self.launched_t)
                    return
                if now < self.pending:
                    return
                error = f"did not listen within {START_S:.0f} s"
            except RuntimeError as e:
                error = str(e)
            lh.stop()
            self.pending = None
            self.failures += 1
            if self.failures > RETRIES:
                raise RuntimeError(f"lighthouse: {self.failures} restarts failed, the last: {error}")
            backoff = min(BACKOFF_S * 2 ** (self.failures - 1), 10.0)
            self.next_try = now + backoff
            self.writer.emit(
                "warning", message=f"lighthouse restart {self.failures} failed ({error}); retrying in {backoff:.1f} s"
            )
            return
        if lh.alive():
            return
        if self.down_t is None:
            self.down_t = now
            self.next_try = now + lh.spec.lighthouse.restart_delay_s
            self._event("down", returncode=lh.proc.returncode)
        if now < self.next_try:
            return
        self._write_epoch()
        lh.launch()
        self.launched_t = time.time()
        self.pending = now + START_S

    def stop(self) -> None:
        self.lighthouse.stop()
        self._event("down")

    def _event(self, state: str, **fields: Any) -> None:
        lh = self.lighthouse
        identity = procs.identity(lh.pid) if state == "up" else {"pid": lh.pid}
        self.writer.emit("lighthouse", state=state, address=lh.address, **identity, **fields)

    def _write_epoch(self) -> None:
        """Before each (re)start: see trainers/torchft/quorum_epochs.py for why replicas need it."""
        rundir.write_json_text(quorum_epochs.epoch_path(self.run_dir), str(self.lighthouse.starts))
