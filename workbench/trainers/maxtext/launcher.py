"""MaxText's child process: ``.venv-maxtext/bin/python launcher.py KEY=VALUE...``, or a warm standby of it.

It runs in .venv-maxtext, which cannot import workbench (hence its own PR_SET_PDEATHSIG, not kit.die_with_parent):
tie the child's life to the wrapper, leave SIGUSR2 to it, report its start-up phases and compile-cache hits/misses,
give JAX's preemption service a coordinator, install the workbench's test hook when asked
(WORKBENCH_TEST_RAISE_AT_STEP), then run MaxText's trainer. That coordinator serves this one process:
it listens on 127.0.0.1 (JAX's default bind address is [::], every interface). In a job of several
processes, JAX's gloo listens on the address gethostname() resolves to (127.0.0.1 here; on the dev cluster's
namespaced nodes their own address, but only through the hosts file slurmd's mount namespace shows, and on a
real cluster whatever its resolver says); JAX has no setting for it, so its CPU backend factory is registered
again with the node's own address given to gloo (jaxlib's make_gloo_tcp_collectives takes it).

Phases: one ``WORKBENCH {"phase": P, "at": T, ...}`` line each on stderr, ``T`` on this clock: ``interpreter_up``
(this file's first line), ``imports_done`` (jax and MaxText's trainer imported: 0.8 s + 4.2 s of the 8 s from a
kill to the first step, measured on this machine's two cores), ``backend_ready`` (the first ``xla_bridge.backends()``
returned), ``compiled`` (the first ``Lowered.compile`` returned: MaxText compiles its train step ahead of time; with
the compile-cache hits and misses so far and the seconds of tracing, lowering and backend compiles). In a job of
several CPU processes every process writes its compiles to the cache, not process 0 only
(:func:`_cache_on_every_process`).

The standby (``launcher.py --standby SOCKET KEEPER_PID READY``, started by :mod:`.standby`): a one-shot fork server. It
listens on SOCKET (bound before the imports, so an attempt that comes early waits for it instead of starting cold),
imports jax and MaxText's trainer *without initialising a JAX backend*, then takes one request: the attempt's argv
and environment, and its console pipe (SCM_RIGHTS). It checks that it may fork (one thread, no backend, the
listener closed: JAX is not fork-safe once its backend exists; numpy's OpenBLAS pool is the one thread an import
starts, and ``OPENBLAS_NUM_THREADS=1`` keeps it from starting), forks, answers the child's PID, waits, and answers its
exit code. The child becomes the attempt's MaxText process as a cold launch would, with ``imports_done`` reported
``warm``. The wrapper's end is the connection's end: the standby then SIGKILLs the child (which dies with the
standby in turn: PR_SET_PDEATHSIG). An unclaimed standby exits when KEEPER_PID (the run's controller, or a spare
job's wrapper: :mod:`.spare`) does. It says it has imported by creating the file READY.

[2] Once it has forked, the standby ignores SIGTERM, SIGINT and SIGUSR2: inside a Slurm job (a spare's) every
process of the step gets the signal that cancels or preempts it, and a standby that died of it would take its
child along (PR_SET_PDEATHSIG) before MaxText's preemption save. The child sets its own (``become``).
"""

import time

T0 = time.time()
import atexit  # noqa: E402
import ctypes  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import runpy  # noqa: E402
import select  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402

sys.path[0] = ""  # as under ``python -c``: this file's folder must not shadow MaxText's modules
ENV0 = dict(os.environ)  # as started: the imports set some (TF_CPP_MIN_LOG_LEVEL)
_COUNTS = {"compile_cache_hits": 0, "compile_cache_misses": 0, "trace_s": 0.0, "lower_s": 0.0, "backend_compile_s": 0.0}
_DURATIONS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
    "/jax/core/compile/backend_compile_duration": "backend_compile_s",
}
ENV_MUST_MATCH = ("JAX_", "XLA_", "TF_", "LIBTPU_")  # read at import: a standby's must be the attempt's


def mark(phase: str, at: float | None = None, **fields) -> None:
    print("WORKBENCH " + json.dumps({"phase": phase, "at": at or time.time(), **fields}), file=sys.stderr, flush=True)


def prepare() -> float:
    """Import jax and MaxText's trainer (``WORKBENCH_MAXTEXT_PRELOAD``: a module whose import runs nothing) and
    install the reporting hooks; no JAX backend is initialised. Seconds since the interpreter started."""
    import importlib

    import jax
    from jax import monitoring
    from jax._src import xla_bridge

    def on_event(name, **_):
        if name in ("/jax/compilation_cache/cache_hits", "/jax/compilation_cache/cache_misses"):
            _COUNTS["compile_" + name.rsplit("/", 1)[-1]] += 1
            print("WORKBENCH " + json.dumps({"compile_cache": name.rsplit("_", 1)[-1]}), flush=True)

    def on_duration(name, seconds, **_):
        if name in _DURATIONS:
            _COUNTS[_DURATIONS[name]] += seconds

    monitoring.register_event_listener(on_event)
    monitoring.register_event_duration_secs_listener(on_duration)
    backends = xla_bridge.backends

    def backends_reported():
        first = not xla_bridge.backends_are_initialized()
        out = backends()
        if first:
            mark("backend_ready", devices=sum(len(b.devices()) for b in out.values()))
        return out

    xla_bridge.backends = backends_reported
    compile_ = jax.stages.Lowered.compile

    def compile_reported(self, *args, **kwargs):
        out = compile_(self, *args, **kwargs)
        if jax.stages.Lowered.compile is compile_reported:
            jax.stages.Lowered.compile = compile_
            mark("compiled", **{k: round(v, 3) for k, v in _COUNTS.items()})
        return out

    jax.stages.Lowered.compile = compile_reported
    if os.environ.get("WORKBENCH_MAXTEXT_PRELOAD"):
        importlib.import_module(os.environ["WORKBENCH_MAXTEXT_PRELOAD"])
    return time.time() - T0


def become(parent: int) -> None:
    """Set this process up as the attempt's MaxText process (its parent is ``parent``) and run MaxText's trainer."""
    import jax

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # Slurm signals every task; the wrapper forwards SIGTERM
    if os.getppid() != parent:
        sys.exit("workbench: wrapper died before MaxText started")
    if os.environ.get("WORKBENCH_COORDINATOR_PORT"):
        _initialize = jax.distributed.initialize

        def _initialize_on_job_port(coordinator_address=None, *args, **kwargs):
            if coordinator_address:
                port = os.environ["WORKBENCH_COORDINATOR_PORT"]
                coordinator_address = coordinator_address.rsplit(":", 1)[0] + ":" + port
            return _initialize(coordinator_address, *args, **kwargs)

        jax.distributed.initialize = _initialize_on_job_port
    if os.environ.get("WORKBENCH_GLOO_HOSTNAME"):
        from jax._src import config as jax_config
        from jax._src import distributed, xla_bridge
        from jax._src.lib import _jax

        def _cpu_client():
            collectives = None
            if (
                distributed.global_state.client is not None
                and jax_config.cpu_collectives_implementation.value == "gloo"
            ):
                collectives = _jax.make_gloo_tcp_collectives(
                    distributed_client=distributed.global_state.client, hostname=os.environ["WORKBENCH_GLOO_HOSTNAME"]
                )
            return xla_bridge.make_cpu_client(collectives)

        xla_bridge.register_backend_factory("cpu", _cpu_client, priority=0, fail_quietly=False)
    _cache_on_every_process()
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
    if os.environ.get("WORKBENCH_TEST_RAISE_AT_STEP"):
        global _step_annotation
        _step_annotation = jax.profiler.StepTraceAnnotation
        jax.profiler.StepTraceAnnotation = _raise_at_step
    runpy.run_module(os.environ["WORKBENCH_MAXTEXT_MODULE"], run_name="__main__", alter_sys=True)


def _cache_on_every_process() -> None:
    """Let every process of a CPU job write its compiles to the persistent cache, not process 0 only.

    JAX writes only from process 0 (``compiler._cache_write``), so that processes sharing a key do not race on one
    file. On CPU the key differs per process (its topology's fingerprint, ``cache_key._hash_accelerator_config``), so
    no other process ever read process 0's entries: process 1 of a two-node job compiled everything afresh at each
    restart (measured on the dev cluster: no hit, 5.9 s of backend compiles, process 0 waiting for it at the first
    step). Its own keys are its own files (written under the cache's file lock). A JAX without these names: as before
    (``tests/test_maxtext_slurm.py`` then fails on process 1's hits)."""
    import jax
    from jax._src import compilation_cache, compiler, distributed

    write = getattr(compiler, "_cache_write", None)
    if write is None or not hasattr(compilation_cache, "put_executable_and_time"):
        return

    def _cache_write(cache_key, compile_time_secs, module_name, backend, executable):
        if distributed.global_state.process_id == 0 or backend.platform != "cpu":
            return write(cache_key, compile_time_secs, module_name, backend, executable)
        if compile_time_secs >= jax.config.jax_persistent_cache_min_compile_time_secs:
            compilation_cache.put_executable_and_time(
                cache_key, module_name, executable, backend, int(compile_time_secs)
            )

    compiler._cache_write = _cache_write


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


def fork_safety() -> str | None:
    """None if this process may fork a child that goes on running JAX; else what makes it unsafe."""
    from jax._src import xla_bridge

    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        return f"{threads} threads"
    if xla_bridge.backends_are_initialized():
        return "a JAX backend is initialised"
    return None


def _send(conn: socket.socket, obj: dict) -> None:
    conn.sendall(json.dumps(obj).encode() + b"\n")


def standby(path: str, keeper: int, ready_file: str) -> None:
    """The one-shot fork server (see the module's docstring)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    folder = os.open(os.path.dirname(path), os.O_PATH)  # an address holds 107 bytes: standby.through_fd
    listener.bind(f"/proc/self/fd/{folder}/{os.path.basename(path)}")
    os.close(folder)
    listener.listen(1)
    keeper_fd = os.pidfd_open(keeper)
    imported_s = prepare()
    open(ready_file, "w").close()
    while True:
        ready, _, _ = select.select([listener, keeper_fd], [], [])
        if keeper_fd in ready:
            os.unlink(path)
            os._exit(0)
        conn, _ = listener.accept()
        break
    os.unlink(path)
    listener.close()
    os.close(keeper_fd)
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 1)
    while not data.endswith(b"\n"):
        chunk = conn.recv(1 << 20)
        if not chunk:
            os._exit(0)
        data += chunk
    request = json.loads(data)
    env = request["env"]
    drift = [k for k in set(env) | set(ENV0) if k.startswith(ENV_MUST_MATCH) and env.get(k) != ENV0.get(k)]
    why = f"environment differs: {', '.join(sorted(drift))}" if drift else fork_safety()
    if why or len(fds) != 1:
        _send(conn, {"error": why or "no console pipe"})
        os._exit(0)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(conn, fds[0], request["argv"], env, imported_s)
    os.close(fds[0])
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):  # what stops the job is MaxText's to take [2]
        signal.signal(sig, signal.SIG_IGN)
    _send(conn, {"pid": pid})
    child_fd = os.pidfd_open(pid)
    ready, _, _ = select.select([conn, child_fd], [], [])
    if child_fd not in ready and not conn.recv(1):  # the wrapper is gone: so is its MaxText
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    try:
        _send(conn, {"returncode": os.waitstatus_to_exitcode(status)})
    except OSError:
        pass
    os._exit(0)


def _child(conn: socket.socket, console: int, argv: list[str], env: dict, imported_s: float) -> None:
    code = 1
    try:
        conn.close()
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(console, 1)
        os.dup2(console, 2)
        os.closerange(3, 1 << 16)
        set_by_imports = {k: v for k, v in os.environ.items() if ENV0.get(k) != v}
        os.environ.clear()
        os.environ.update({**env, **set_by_imports})
        sys.argv = [__file__, *argv]
        random.seed()
        sys.modules["numpy"].random.seed()
        mark("interpreter_up", warm=True)
        mark("imports_done", warm=True, imported_s=round(imported_s, 3))
        become(os.getppid())
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--standby"]:
        standby(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # before the imports: die with the wrapper
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        mark("interpreter_up", at=T0)
        prepare()
        mark("imports_done", warm=False)
        become(int(os.environ["WORKBENCH_WRAPPER_PID"]))
