"""Heal bandwidth at a size where it matters: ~250 MB of weights + AdamW state, one group killed.

``python -m bench --only heal``. One torchft-lite run with a model of about 250 MB of weights plus
optimizer state (``model.vocab_size/dim/layers`` below), 3 groups, one kill; the heal's bytes and
seconds come from the run's own ``heal`` events (``InstrumentedTransport`` in
``trainers/torchft_lite.py``: torchft's HTTP checkpoint transport, what ``recv_checkpoint`` fetched).
Beside it, in the same session, the bytes/s of a plain loopback TCP copy of the same size
(``socket.sendall`` → ``recv_into``, 127.0.0.1): the limit on this machine. torchft's own anchor:
12 GB healed in about 3 s with its chunked HTTP transport.

One run per checkpoint transport (``torchft.checkpoint_transport``): ``pg``, the default (torchft's
``PGTransport`` over the group's gloo process group, received in place into the model's and AdamW's
own tensors), and ``http`` (torchft's ``HTTPTransport``, the path before it).

Where the time went with ``http`` (measured while choosing): the serving side answers within 10-60 ms
of the request (``wait_s``), so the step boundary is not it; the rest is bytes and deserialisation on
two cores that the survivors' forward passes share. On an idle machine the same fetch takes 0.09-0.28 s
for 262 MB (1-2.8 GB/s), of which reading the body into a pre-touched buffer is 0.115 s: the
deserialisation materialises 262 MB of fresh memory (a plain 262 MB copy into fresh memory costs
0.13 s here, mostly page faults), which the loopback copy (a reused 1 MB buffer) never pays.
Chunked HTTP (``http_chunks`` 4) was slower on an idle machine (0.16-0.25 s: more threads, same two cores).
The in-place receive skips both the serialisation and the fresh memory.
"""

from __future__ import annotations

import os
import socket
import statistics
import threading
import time

from .sessions import Variant, run_variant

BIG_MODEL = {"model.vocab_size": 8192, "model.dim": 448, "model.layers": 6, "model.heads": 4}


TRANSPORTS = {
    "pg": {"torchft.checkpoint_transport": "pg"},
    "http": {"torchft.checkpoint_transport": "http", "torchft.http_chunks": 0},
}


def variant(at_s: float, transport: str = "pg") -> Variant:
    return Variant(
        f"torchft-lite ~250 MB state +kill, {transport} heal",
        {
            "trainer": "torchft-lite",
            **BIG_MODEL,
            **TRANSPORTS[transport],
            "torchft.timeout_s": 120.0,
            "faults": [{"action": "kill", "target": 1, "at_s": at_s}],
        },
    )


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


HEAL_KEYS = (
    "replica",
    "attempt",
    "step",
    "bytes",
    "seconds",
    "bytes_per_s",
    "interface",
    "wait_s",
    "transfer_s",
    "transport",
)


def measure(root, window_s: float = 60.0, at_s: float = 15.0, log=print, transports=("pg", "http")) -> dict:
    """One run per transport (the default first), then the loopback copy; the first run's figures are the
    section's headline, the others are today's alternatives measured in the same session."""
    runs, loaded = [], {}

    def probe() -> None:  # the same copy while the first run trains (the survivors' steps, after the heal)
        loaded.update(loopback_copy(262_000_000), loadavg_1m=os.getloadavg()[0])

    for i, tr in enumerate(transports):
        timer = threading.Timer(at_s + 30.0, probe) if i == 0 else None
        if timer:
            timer.daemon = True
            timer.start()
        rec = run_variant(variant(at_s, tr), window_s, root, log, startup_timeout=300.0)
        if timer:
            timer.join()
        heals = [e for e in rec.events if e.get("kind") == "heal" and e.get("bytes")]
        runs.append(
            {
                "variant": rec.variant,
                "transport": tr,
                "loadavg_1m": rec.loadavg[0],
                "error": rec.error,
                "heals": [{k: h.get(k) for k in HEAL_KEYS} for h in heals],
            }
        )
    out = dict(runs[0], runs=runs)
    nbytes = max((h["bytes"] for r in runs for h in r["heals"]), default=250_000_000)
    out["loopback"] = loopback_copy(nbytes)
    out["loopback"]["loadavg_1m"] = os.getloadavg()[0]
    out["loopback_under_training"] = loaded or None
    return out


def replacement_heal(run: dict):
    """The heal of the killed group's replacement (attempt >= 1): the one the target is about."""
    xs = [x for x in run["heals"] if x["attempt"]]
    return xs[-1] if xs else None


def lines(h: dict) -> list[str]:
    from .report import _f

    lb = h["loopback"]
    out = [
        "## 7. Heal bandwidth at ~250 MB (weights + optimizer state)",
        "",
        f"One torchft-lite run per checkpoint transport (`{BIG_MODEL}`), 3 groups, group 1 killed; "
        "`wait` is the time until the serving side answered (it stages its state at its own quorum), "
        "`transfer` the rest (bytes, deserialisation).",
        "",
    ]
    for run in h.get("runs") or [h]:
        out.append(
            f"**{run['variant']}** (load at its start {run['loadavg_1m']:.2f})"
            + (f" ERROR: {run['error']}" if run.get("error") else "")
        )
        out.append("")
        for x in run["heals"]:
            ratio = x["bytes_per_s"] / lb["bytes_per_s"] if x.get("bytes_per_s") else None
            why = (
                "the replacement after the kill"
                if x["attempt"]
                else f"late joiner: healed at step {x['step']}, after the others had stepped"
                if x["step"]
                else "at start, step 0"
                + (
                    ""
                    if x["bytes"] > 0.5 * max(y["bytes"] for y in run["heals"])
                    else ": weights only, no optimizer state yet"
                )
            )
            split = (
                f" (wait {_f(x['wait_s'])} s, transfer {_f(x['transfer_s'])} s)" if x.get("wait_s") is not None else ""
            )
            out.append(
                f"- heal of replica {x['replica']} (attempt {x['attempt']}, {why}): {x['bytes'] / 1e6:,.0f} MB in "
                f"{_f(x['seconds'])} s{split} = **{_f((x['bytes_per_s'] or 0) / 1e6, '{:,.0f}')} MB/s**, "
                f"{_f(ratio)}× the loopback copy"
            )
        if not run["heals"]:
            out.append("- no heal event with bytes in the run")
        out.append("")
    out.append(
        f"- plain loopback TCP copy of {lb['bytes'] / 1e6:,.0f} MB (same session, median of {lb['reps']}): "
        f"{_f(lb['seconds'])} s = **{lb['bytes_per_s'] / 1e6:,.0f} MB/s** (load {lb['loadavg_1m']:.2f})"
    )
    ul = h.get("loopback_under_training")
    if ul:
        out.append(
            f"- the same copy while the first run's groups train (not the target's baseline; what a heal "
            f"competes with): {_f(ul['seconds'])} s = **{ul['bytes_per_s'] / 1e6:,.0f} MB/s** "
            f"(load {ul['loadavg_1m']:.2f})"
        )
    return out
