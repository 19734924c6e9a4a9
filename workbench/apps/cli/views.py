"""``workbench serve-metrics|report|classroom``: a run shown outside the notebook.

Prometheus scrapes (and OTLP pushes) through :mod:`workbench.apps.exporter`,
a self-contained HTML page through :mod:`workbench.apps.report`, the live
dashboard as a page with no code through :mod:`workbench.apps.classroom`.
The exporter and the report are imported when their command runs: every
command imports this module, and on top of what ``workbench status`` imports
the exporter costs 15-30 ms and 35 modules (``prometheus_client``), the report
0.2-0.3 s and 280 (``plotly.express``), the OTLP push 65-110 ms and 140 more
(OpenTelemetry's SDK and exporter), measured.
"""

from __future__ import annotations

import ipaddress
import signal
import sys
import threading

from workbench.apps.classroom import ClassroomError, require_port, run_for, serve
from workbench.run.handle import attach, submit


def cmd_serve_metrics(args) -> int:
    """Serve the run's metrics for Prometheus until SIGINT/SIGTERM."""
    from workbench.apps import exporter

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port: {args.port}; allowed: 0-65535 (0: any free port)")
    if args.otlp and not args.otlp.startswith(("http://", "https://")):
        raise ValueError(f"--otlp: {args.otlp!r}; allowed: an OTLP/HTTP metrics URL (http://HOST:4318/v1/metrics)")
    if not 0.1 <= args.otlp_every <= 3600:
        raise ValueError(f"--otlp-every: {args.otlp_every}; allowed: 0.1-3600 seconds")
    remote = not is_loopback(args.addr)
    if remote and not args.allow_remote:
        raise ValueError(
            f"--addr: {args.addr!r} is not a loopback address; allowed: 127.0.0.0/8, ::1 or localhost, "
            "or any address with --allow-remote (the endpoint has no authentication)"
        )
    run = attach(args.run)
    collector = exporter.RunCollector(run)
    try:
        server, _ = exporter.serve(collector, args.port, args.addr)
    except OSError as e:
        raise ValueError(f"--port: cannot listen on {args.addr}:{args.port} ({e.strerror or e})") from None
    provider = None
    if args.otlp:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=args.otlp), export_interval_millis=args.otlp_every * 1000
        )
        provider = exporter.otel_meter_provider(collector, [reader])
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    if remote:
        print(
            f"workbench serve-metrics: --allow-remote: {args.addr!r} is not loopback and the endpoint has no "
            "authentication: whoever reaches it reads the run's metrics",
            file=sys.stderr,
            flush=True,
        )
    host = f"[{args.addr}]" if ":" in args.addr else args.addr  # an IPv6 address, as a URL writes it
    print(
        f"serving metrics of {run.id} on http://{host}:{server.server_port}/metrics"
        + (f"; pushing OTLP to {args.otlp} every {args.otlp_every:g} s" if args.otlp else ""),
        flush=True,
    )
    done.wait()
    server.shutdown()
    if provider is not None:
        provider.shutdown()
    return 0


def is_loopback(addr: str) -> bool:
    """``addr`` names loopback only: 127.0.0.0/8, ::1 (or its IPv4-mapped form), or ``localhost``."""
    if addr == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False  # a host name other than localhost, or "" (every interface)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def cmd_report(args) -> int:
    from workbench.apps.report import write_report

    print(write_report(args.run))
    return 0


def cmd_classroom(args) -> int:
    run = None
    try:
        if args.config:
            if args.run:
                raise ClassroomError("RUN and --config: give one (--config submits a new run and serves it)")
            require_port(args.port)
            run = submit(args.config, args.overrides)
            args.run = str(run.run_dir)
            print(f"classroom: submitted {run.run_dir}", flush=True)
        timer = run_for(run, args.stop_after) if run is not None else None
        try:
            return serve(args.run, root=args.run_root, port=args.port, faults=args.faults)
        finally:
            if timer is not None:
                timer.cancel()
    except ClassroomError as e:
        print(f"workbench classroom: {e}", file=sys.stderr)
        return 2
