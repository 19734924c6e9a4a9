"""Heal bandwidth at a size where it matters: ~250 MB of weights + AdamW state, one group killed.

``python -m bench --only heal``. One torchft-lite run with a model of about 250 MB of weights plus
optimizer state (``model.vocab_size/dim/layers`` below), 3 groups, one kill; the heal's bytes and
seconds come from the run's own ``heal`` events (``InstrumentedTransport`` in
``trainers/torchft_lite.py``: torchft's HTTP checkpoint transport, what ``recv_checkpoint`` fetched).
Beside it, in the same session, the bytes/s of a plain loopback TCP copy of the same size
(``socket.sendall`` → ``recv_into``, 127.0.0.1): the limit on this machine. torchft's own anchor:
12 GB healed in about 3 s with its chunked HTTP transport.
"""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time

from .sessions import Variant, run_variant

BIG_MODEL = {"model.vocab_size": 8192, "model.dim": 448, "model.layers": 6, "model.heads": 4}


def variant(at_s: float) -> Variant:
    return Variant("torchft-lite ~250 MB state +kill", {
        "trainer": "torchft-lite", **BIG_MODEL,
        "torchft.timeout_s": 120.0, "faults": [{"action": "kill", "target": 1, "at_s": at_s}],
    })


def loopback_copy(nbytes: int, reps: int = 3) -> dict:
    """Seconds to push ``nbytes`` through one loopback TCP connection (median of ``reps``)."""
    payload = memoryview(bytearray(os.urandom(1 << 20)) * max(1, nbytes >> 20))
    times = []
    for _ in range(reps):
        srv = socket.create_server(("127.0.0.1", 0))
        port = srv.getsockname()[1]
        got = [0]

        def sink() -> None:
            conn, _ = srv.accept()
            buf = bytearray(1 << 20)
            with conn:
                while True:
                    n = conn.recv_into(buf)
                    if not n:
                        break
                    got[0] += n

        th = threading.Thread(target=sink)
        th.start()
        t0 = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port)) as c:
            c.sendall(payload)
        th.join()
        times.append(time.perf_counter() - t0)
        srv.close()
        assert got[0] == len(payload)
    s = statistics.median(times)
    return {"bytes": len(payload), "seconds": s, "bytes_per_s": len(payload) / s, "reps": reps}


def measure(root, window_s: float = 60.0, at_s: float = 15.0, log=print) -> dict:
    rec = run_variant(variant(at_s), window_s, root, log, startup_timeout=300.0)
    heals = [e for e in rec.events if e.get("kind") == "heal" and e.get("bytes")]
    out = {"variant": rec.variant, "loadavg_1m": rec.loadavg[0], "error": rec.error,
           "heals": [{k: h.get(k) for k in ("replica", "attempt", "step", "bytes", "seconds", "bytes_per_s", "interface")}
                     for h in heals]}
    nbytes = max((h["bytes"] for h in heals), default=250_000_000)
    out["loopback"] = loopback_copy(nbytes)
    out["loopback"]["loadavg_1m"] = os.getloadavg()[0]
    return out


def lines(h: dict) -> list[str]:
    from .report import _f

    out = ["## 7. Heal bandwidth at ~250 MB (weights + optimizer state)", "",
           f"One torchft-lite run (`{BIG_MODEL}`), 3 groups, group 1 killed; load at its start {h['loadavg_1m']:.2f}."
           + (f" ERROR: {h['error']}" if h.get("error") else ""), ""]
    lb = h["loopback"]
    for x in h["heals"]:
        ratio = x["bytes_per_s"] / lb["bytes_per_s"] if x.get("bytes_per_s") else None
        why = ("the replacement after the kill" if x["attempt"] else
               "full state: it joined after the others had stepped" if x["bytes"] > 0.5 * max(y["bytes"] for y in h["heals"])
               else "at start: weights only, no optimizer state yet")
        out.append(f"- heal of replica {x['replica']} (attempt {x['attempt']}, {why}): {x['bytes'] / 1e6:,.0f} MB in "
                   f"{_f(x['seconds'])} s = **{_f((x['bytes_per_s'] or 0) / 1e6, '{:,.0f}')} MB/s**, "
                   f"{_f(ratio)}× the loopback copy")
    if not h["heals"]:
        out.append("- no heal event with bytes in the run")
    out.append(f"- plain loopback TCP copy of {lb['bytes'] / 1e6:,.0f} MB (same session, median of {lb['reps']}): "
               f"{_f(lb['seconds'])} s = **{lb['bytes_per_s'] / 1e6:,.0f} MB/s** (load {lb['loadavg_1m']:.2f})")
    return out
