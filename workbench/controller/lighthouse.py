"""The torchft lighthouse, as a supervised child process of the run controller.

The lighthouse decides each quorum: which replica groups take part in the next
step, and who heals from whom. It drops a replica group whose heartbeats stop
for ``heartbeat_timeout_ms``, which is what bounds a survivor's stall after a
kill. It runs as ``torchft_lighthouse`` (not in-process) so that killing it is
a fault like any other, and so it can be restarted on the same address: the
replicas' Managers keep retrying (``TORCHFT_QUORUM_RETRIES``) and reconnect.
:class:`LighthouseSupervisor` is that supervision: the controller ticks it,
and it restarts a dead lighthouse without ever blocking the loop.

Whose lighthouse. A run hands its lighthouse's address to every replica
group, and torchft's lighthouse has no authentication and no run id: whatever
answers on that address decides the groups' quorums and tells them whom to
heal from. So "something accepts a TCP connection there" does not make it the
run's. :meth:`Lighthouse.ready` asks the kernel instead: the listening socket
at the address must be one of the lighthouse child's own file descriptors
(the socket's inode in ``/proc/net/tcp`` among ``/proc/<child>/fd``), and no
other process may listen where a connection to that address could land.
Anything else is refused, named (:func:`socket_holder`) in a ``warning``
event, and its address is never handed to a group. The first start binds port
0 and reads back the port the kernel gave the child's own socket, so no other
process can take it between a free-port pick and the child's bind (the
child's start-up, python imports included, takes seconds); restarts bind the
same address again, because the groups keep dialing it.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple, Optional

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


WILDCARDS = ("0.0.0.0", "::")
LISTEN = "0A"  # TCP_LISTEN, as /proc/net/tcp writes a socket's state


class Listener(NamedTuple):
    ip: str
    port: int
    inode: int


def tcp_listeners(port: Optional[int] = None) -> list[Listener]:
    """Every listening TCP socket of this network namespace (on ``port``), from ``/proc/net/tcp`` and ``tcp6``."""
    out = []
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            lines = Path("/proc/net", name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10 or f[3] != LISTEN:
                continue
            addr, hexport = f[1].split(":")
            if port is not None and int(hexport, 16) != port:
                continue
            # Each 32-bit word is printed as the kernel holds it in memory, read as a native integer.
            raw = b"".join(struct.pack("=I", int(addr[i : i + 8], 16)) for i in range(0, len(addr), 8))
            out.append(Listener(socket.inet_ntop(family, raw), int(hexport, 16), int(f[9])))
    return out


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets among ``pid``'s open file descriptors (empty if it is gone)."""
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(int(link[8:-1]))
    return out


def socket_holder(inode: int) -> str:
    """Who holds socket ``inode``: ``pid N (command line)``, or that this user cannot see it."""
    for pid in sorted((int(p) for p in os.listdir("/proc") if p.isdigit()), reverse=True):
        if inode in socket_inodes(pid):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                cmd = "?"
            return f"pid {pid} ({cmd[:120]})"
    return "a process whose descriptors this user cannot read"


def reachable_ips(host: str) -> Optional[set[str]]:
    """The listening addresses a connection to ``host`` can land on (None: any, ``host`` is a wildcard)."""
    if host in WILDCARDS:
        return None
    try:
        ips = {info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    except OSError:
        ips = {host}
    return ips | set(WILDCARDS) | {f"::ffff:{ip}" for ip in ips if ":" not in ip}


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
        self.port: int = spec.lighthouse.port or 0  # 0 until the first start reads back the child's own port
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
        """Launch and wait until it listens (the run's first start; restarts use launch/ready).
        RuntimeError, the child stopped, if it does not, or if another process listens on its address."""
        self.launch()
        deadline = time.monotonic() + timeout
        try:
            while not self.ready():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"lighthouse did not listen on {self.host}:{self.port} within {timeout}s")
                time.sleep(0.05)
        except RuntimeError:
            self.stop()
            raise

    def launch(self) -> None:
        """Start the process; returns at once."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / "lighthouse.log", "ab")
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)  # RUST_LOG: the controller's
        log.close()
        self.starts += 1

    def ready(self) -> bool:
        """True once the child itself listens on the address and no other process listens where a
        connection to it could land (module docstring); on a first start with no port, the port is then
        the one the kernel gave the child. RuntimeError if it exited (its port taken, say), or if another
        process listens there: that one is never taken for the run's lighthouse."""
        assert self.proc is not None, "launch() first"
        exited = self.proc.poll() is not None
        ips = reachable_ips(self.host)
        found = [x for x in tcp_listeners(self.port or None) if ips is None or x.ip in ips]
        own = set() if exited else socket_inodes(self.proc.pid)
        strangers = [x for x in found if x.inode not in own] if self.port else []
        if strangers:
            why = (
                f"{self.host}:{self.port} is held by {socket_holder(strangers[0].inode)}, not this run's "
                f"lighthouse (pid {self.proc.pid}); its address is handed to no replica group"
            )
            raise RuntimeError(why + (f"; the lighthouse exited with {self.proc.returncode}" if exited else ""))
        if exited:
            raise RuntimeError(f"lighthouse exited with {self.proc.returncode}; see {self.log_dir}/lighthouse.log")
        ports = {x.port for x in found if x.inode in own}
        if len(ports) != 1:
            return False
        self.port = ports.pop()
        return True

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
        """The run's first start: blocks until it listens. A refusal (another process holds its
        address, say) is a ``warning`` event before the RuntimeError that fails the run."""
        self._write_epoch()
        try:
            self.lighthouse.start()
        except RuntimeError as e:
            self.writer.emit("warning", message=f"lighthouse: {e}")
            raise
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
