"""MaxText's child process: ``.venv-maxtext/bin/python launcher.py KEY=VALUE...``.

It runs in .venv-maxtext, which cannot import workbench (hence its own PR_SET_PDEATHSIG, not kit.die_with_parent):
tie the child's life to the wrapper, leave SIGUSR2 to it, report compile-cache hits/misses, give JAX's
preemption service a coordinator, install the workbench's test hook when asked (WORKBENCH_TEST_RAISE_AT_STEP), then
run MaxText's trainer. That coordinator serves this one process:
it listens on 127.0.0.1 (JAX's default bind address is [::], every interface). In a job of several
processes, JAX's gloo listens on the address gethostname() resolves to (127.0.0.1 here; on the dev cluster's
namespaced nodes their own address, but only through the hosts file slurmd's mount namespace shows, and on a
real cluster whatever its resolver says); JAX has no setting for it, so its CPU backend factory is registered
again with the node's own address given to gloo (jaxlib's make_gloo_tcp_collectives takes it).
"""

import ctypes
import json
import os
import runpy
import signal
import socket
import sys

sys.path[0] = ""  # as under ``python -c``: this file's folder must not shadow MaxText's modules
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # Slurm signals every task; the wrapper forwards SIGTERM
if os.getppid() != int(os.environ["WORKBENCH_WRAPPER_PID"]):
    sys.exit("workbench: wrapper died before MaxText started")
import jax
from jax import monitoring


def _on_event(name, **_):
    if name in ("/jax/compilation_cache/cache_hits", "/jax/compilation_cache/cache_misses"):
        print("WORKBENCH " + json.dumps({"compile_cache": name.rsplit("_", 1)[-1]}), flush=True)


monitoring.register_event_listener(_on_event)
if os.environ.get("WORKBENCH_COORDINATOR_PORT"):
    _initialize = jax.distributed.initialize

    def _initialize_on_job_port(coordinator_address=None, *args, **kwargs):
        if coordinator_address:
            coordinator_address = coordinator_address.rsplit(":", 1)[0] + ":" + os.environ["WORKBENCH_COORDINATOR_PORT"]
        return _initialize(coordinator_address, *args, **kwargs)

    jax.distributed.initialize = _initialize_on_job_port
if os.environ.get("WORKBENCH_GLOO_HOSTNAME"):
    from jax._src import config as jax_config
    from jax._src import distributed, xla_bridge
    from jax._src.lib import _jax

    def _cpu_client():
        collectives = None
        if distributed.global_state.client is not None and jax_config.cpu_collectives_implementation.value == "gloo":
            collectives = _jax.make_gloo_tcp_collectives(
                distributed_client=distributed.global_state.client, hostname=os.environ["WORKBENCH_GLOO_HOSTNAME"]
            )
        return xla_bridge.make_cpu_client(collectives)

    xla_bridge.register_backend_factory("cpu", _cpu_client, priority=0, fail_quietly=False)
if os.environ.get("WORKBENCH_LOCAL_COORDINATOR") == "1":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=1,
        process_id=0,
        coordinator_bind_address=f"127.0.0.1:{port}",
    )


def _raise_at_step(name, *args, **kwargs):
    """The workbench's test hook (``workbench/trainers/raise_hook.py``, which this process cannot import): MaxText
    opens ``jax.profiler.StepTraceAnnotation("train", step_num=step)`` for each step; at step N (N steps done),
    on the hook's attempt, replica and rank, raise instead."""
    step, env = kwargs.get("step_num"), os.environ
    rank, replica, attempt = (
        int(env.get(k, "0")) for k in ("WORKBENCH_RANK", "WORKBENCH_REPLICA", "WORKBENCH_ATTEMPT")
    )
    if (
        name == "train"
        and step == int(env["WORKBENCH_TEST_RAISE_AT_STEP"])
        and attempt == int(env.get("WORKBENCH_TEST_RAISE_ATTEMPT") or 0)
        and all(
            not env.get(var) or int(env[var]) == value
            for var, value in (("WORKBENCH_TEST_RAISE_REPLICA", replica), ("WORKBENCH_TEST_RAISE_RANK", rank))
        )
    ):
        raise RuntimeError(
            f"workbench test hook: raised at step {step} (replica {replica}, rank {rank}, attempt {attempt})"
        )
    return _step_annotation(name, *args, **kwargs)


if os.environ.get("WORKBENCH_TEST_RAISE_AT_STEP"):
    _step_annotation = jax.profiler.StepTraceAnnotation
    jax.profiler.StepTraceAnnotation = _raise_at_step
runpy.run_module(os.environ["WORKBENCH_MAXTEXT_MODULE"], run_name="__main__", alter_sys=True)
