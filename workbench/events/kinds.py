"""Every kind of event, with who writes it and its fields: the event log's schema.

The kinds are ``StrEnum`` members: ``Kind.STEP == "step"``, so code that compares
``e["kind"] == "step"`` and writers that emit ``"step"`` need not import this module.
``tests/test_event_schema.py`` holds the code to it: every ``emit("…")`` literal of the
package is a :class:`Kind`, every :class:`Kind` is emitted somewhere, and each call that
names all its fields names the required ones.
"""

from __future__ import annotations

from enum import StrEnum

from workbench.events import end_fields, states
from workbench.events.fields import Field, optional, required
from workbench.events.layout import ANY_WRITER, Writer

TORCHFT_RECORD = (  # what every torchft structured-log record carries (workbench/trainers/torchft/logs.py)
    optional("replica_id", "torchft's replica id"),
    optional("rank", "the rank that logged it"),
    optional("torchft_job_id", "torchft's `JOB_ID` (`unknown` unless set)"),
)


class Kind(StrEnum):
    """A kind of event: who writes it (``writers``), what it says (``summary``), its ``fields``
    beyond :data:`~workbench.events.fields.COMMON_FIELDS`, and ``notes`` on how readers use it."""

    writers: tuple[Writer, ...]
    summary: str
    fields: tuple[Field, ...]
    notes: str

    def __new__(cls, value: str, writers: tuple[Writer, ...], summary: str, *fields: Field | str) -> Kind:
        member = str.__new__(cls, value)
        member._value_ = value
        member.writers, member.summary = writers, summary
        member.fields = tuple(f for f in fields if isinstance(f, Field))
        member.notes = " ".join(f for f in fields if isinstance(f, str))
        return member

    @property
    def required_fields(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if f.required)

    START = (
        "start",
        (Writer.REPLICA, Writer.CONTROLLER, Writer.SWEEP),
        "a process began",
        required("role", "what the process is", states.Role),
        optional("trainer", "the trainer's name, as the spec's `trainer` spells it (the controller: the spec's)"),
        optional("world_size", "processes in the replica group"),
        optional(
            "pid_start",
            "seconds from boot to the process's start, which proves later that `pid` is still that process "
            "(added by the writer; `workbench/cluster/procs.py`; a value above 1e9 is the wall-clock time older "
            "workbenches wrote)",
        ),
        optional("node", "Slurm's node name, or the host (`workbench/state/nodes.py`)"),
        optional("address", "the one address its listeners bind"),
        optional("job_id", "the scheduler's job id (Slurm's, or submitit's local one)"),
        optional("task", "TorchTitan over N nodes: this process's task, 0..N-1 (0: the group's first or only one)"),
        optional("tasks", "TorchTitan: N"),
        optional("from_spare", "the hot spare this attempt was"),
        optional("rank", "ddp-restart, titan-restart: the rank"),
        optional("launcher_pid", "ddp-restart, titan-restart: its launcher's process"),
        optional("checkpoint_dir", "MaxText: the checkpoint directory"),
        optional("coordinator", "MaxText: the JAX coordinator's address"),
        optional("nodes", "MaxText: the nodes of its layout"),
        optional("cluster", "the controller: its backend (`local`, `slurm`)"),
        optional("points", "the sweep controller: the sweep's points"),
        optional("max_parallel", "the sweep controller: unfinished runs at a time"),
        optional("resumed", "the sweep controller: points already submitted when it (re)started"),
    )
    PHASE = (
        "phase",
        (Writer.REPLICA, Writer.SPARE),
        "a milestone of a process's start or stop",
        required("phase", "which milestone", states.Phase),
        optional("seconds", "since the process started (a spare's `model_ready`: since it was assigned)"),
        optional("checkpoint_address", "`model_ready`, `manager_ready`: where it serves heals from"),
        optional("from_spare", "`imports_done` of a spare that became this attempt"),
        optional("maxtext_pid", "`launched`: MaxText's process"),
        optional("warm", "forked warm: a TorchTitan rank, MaxText from a standby; `spare_ready`: imports done"),
        optional("task", "`spare_ready` of a TorchTitan spare: which task says it (the spare is ready at task 0's)"),
        optional("standby", "`launched`: why MaxText started cold although standbys are on"),
        optional("from_step", "`restored`: the step it restored (0: nothing to restore)"),
        optional("path", "`restored` (ddp-restart, titan-restart): the checkpoint read"),
        optional("load_s", "`restored` (ddp-restart, titan-restart): seconds to load it"),
        optional("step", "`first_step`: MaxText's step"),
        optional("compile_cache_hits", "`first_step`, `compiled`: MaxText's compilation cache hits"),
        optional("compile_cache_misses", "`first_step`: its misses"),
        optional("signal", "`stopping`: the signal's name"),
    )
    HEARTBEAT = (
        "heartbeat",
        (Writer.REPLICA,),
        "the process is alive between steps (lets a grid show age while a step is slow)",
        required("step", "its current step"),
        optional("waiting", "`sync`: waiting for its peers in a semi-synchronous sync, not flagged as a hang"),
    )
    STEP = (
        "step",
        (Writer.REPLICA,),
        "one training step",
        required("step", "the manager step after this iteration; the committed step number when `committed`"),
        optional("loss", "the loss (NaN or infinite when it diverged)"),
        optional("local_loss", "TorchTitan: this replica's own loss"),
        optional("committed", "whether the step committed (absent: true)"),
        optional("participating", "whether this replica took part (false: it is healing)"),
        optional("participants", "replica groups in the quorum"),
        optional("quorum_id", "torchft's quorum"),
        optional("step_time_s", "seconds this step took"),
        optional(
            "comm_s",
            "torchft-lite: seconds of the step in its gradient allreduce, waiting for its peers included "
            "(the straggler score's own time is `step_time_s` less this)",
        ),
        optional("tokens_per_s", "throughput"),
        optional("mem_gb", "peak accelerator memory"),
        optional("batch_seed", "the seed of the step's batch"),
        optional("weights", "checksum of the weights, every `checksum_every` steps"),
        optional("healed", "TorchTitan: the step healed first"),
        optional("titan_step", "TorchTitan's own step counter"),
        optional("grad_norm", "TorchTitan: the gradient norm"),
        optional(
            "t_<phase>_s",
            "torchft-lite with `torchft.step_timing: true`: seconds per phase (zero_grad, forward, backward, "
            "allreduce, quorum_wait, optimizer_step, commit_vote, inner_step, quorum_rtt, workbench; "
            "`bench/stepcost.py`)",
        ),
    )
    SYNC = (
        "sync",
        (Writer.REPLICA,),
        "one synchronisation of a semi-synchronous `ft.algorithm` (torchft-lite; `workbench/trainers/lite/semi_sync.py`)",
        optional("step", "torchft's step: the committed syncs so far"),
        optional("sync_index", "this attempt's count"),
        optional("algorithm", "`ft.algorithm`: `localsgd`, `diloco` or `streaming_diloco`"),
        optional("fragment", "DiLoCo's fragment; `null` for localsgd"),
        optional("committed", "whether the sync committed"),
        optional("participants", "replica groups in the quorum"),
        optional("quorum_id", "torchft's quorum"),
        optional(
            "bytes",
            "measured through the process group's all-reduce, twice the payload: a ring all-reduce sends and "
            "receives it",
        ),
        optional("allreduces", "calls: one per parameter tensor, or one per bucket with `ft.bucket_cap_mb`"),
        optional("seconds", "DiLoCo: the time the loop was blocked in the sync; localsgd: the sync's length"),
        optional("t_quorum_s", "DiLoCo: waiting for the quorum"),
        optional("t_prepare_s", "DiLoCo: waiting for the all-reduce"),
        optional("t_perform_s", "DiLoCo: the vote and the outer step"),
        optional("t_vote_s", "DiLoCo: `should_commit`, inside `t_perform_s`"),
        optional("train_step", "the inner (training) step"),
        optional("weights", "checksum of the weights after the sync"),
        optional("join", "true for the sync a new attempt heals in before its first inner step"),
        optional("early", "true when `ft.catch_up` ended the window early"),
    )
    QUORUM = (
        "quorum",
        (Writer.REPLICA,),
        "torchft formed a quorum (its `torchft_quorums` logger, through `workbench/trainers/torchft/logs.py`; "
        "`t` is the record's time)",
        optional("quorum_id", "torchft's quorum"),
        optional("step", "the max step in the quorum"),
        *TORCHFT_RECORD,
    )
    COMMIT = (
        "commit",
        (Writer.REPLICA,),
        "one `should_commit` vote (torchft's `torchft_commits` logger)",
        optional("quorum_id", "torchft's quorum"),
        optional("step", "the step voted on: a committed `step` event `s` has the commit record `s - 1`"),
        optional("commit_result", "the vote's outcome"),
        *TORCHFT_RECORD,
        "torchft-lite and TorchTitan take the `step` event's `committed` and `quorum_id` from this record "
        "(torchft-lite with `torchft.structured_logs: false` writes none of `quorum`, `commit`, `torchft_error` "
        "and computes them by hand).",
    )
    TORCHFT_ERROR = (
        "torchft_error",
        (Writer.REPLICA,),
        "a torchft process group aborted on error (torchft's `torchft_errors` logger)",
        optional("error", "`process_group_abort`"),
        optional("uuid", "torchft's id of the error"),
        *TORCHFT_RECORD,
    )
    HEAL = (
        "heal",
        (Writer.REPLICA,),
        "the group received the live state from a peer",
        optional("step", "the step healed to"),
        optional("seconds", "the transfer"),
        optional("bytes", "the state's size"),
        optional(
            "from_address",
            "the source's checkpoint server, or `pg://host/replica_N` for the process-group transport (the "
            "dashboard names the replica that announced that address in its `model_ready` phase)",
        ),
        optional("src_rank", "torchft-lite: the serving rank (TorchTitan: `from_rank`)"),
        optional("served_from", "the peer's address as routed"),
        optional("local_address", "this side's address for that route"),
        optional("interface", "this side's network interface for it"),
        optional("bytes_per_s", "the transfer's rate"),
        optional("transport", "torchft-lite: `pg` or `http`"),
        optional("wait_s", "torchft-lite: until the serving side's first byte (it stages its state at its quorum)"),
        optional("transfer_s", "torchft-lite: the rest"),
        optional("weights", "checksum of the weights received"),
        optional("apply_seconds", "TorchTitan: applying the state"),
        optional("titan_step", "TorchTitan's own step counter"),
        optional("forward_weights", "TorchTitan: checksum of the weights the next forward uses"),
        optional("error", "TorchTitan: the heal failed"),
    )
    CHECKPOINT = (
        "checkpoint",
        (Writer.REPLICA,),
        "a save",
        required("step", "the step saved"),
        required("durable", "committed to storage"),
        optional("path", "where"),
        optional("seconds", "the save's length"),
        optional("bytes", "its size"),
        optional("state", "announced before the write (ddp-restart, titan-restart)", [states.CheckpointState.STARTED]),
        optional("held", "with `state=started`: it found its arm file and holds the save for an armed fault"),
        optional("late", "MaxText: a durable save its attempt was killed before recording, recorded by the next"),
    )
    EXIT = ("exit", (Writer.REPLICA, Writer.SPARE), "the process ends", *end_fields.EXIT)
    SUBMIT = (
        "submit",
        (Writer.CONTROLLER, Writer.SWEEP),
        "a job was submitted (the sweep controller: a point's run)",
        optional("replica", "the group"),
        optional("attempt", "its attempt"),
        optional("job_id", "the scheduler's job id"),
        optional("spare", "a hot spare's job (no `replica`)"),
        optional("point", "the sweep controller: the point's index"),
        optional("run_id", "the sweep controller: the point's run"),
        optional("run_dir", "the sweep controller: its directory (the only link from a point to its run)"),
        optional("params", "the sweep controller: the point's parameters"),
    )
    JOB = ("job", (Writer.CONTROLLER,), "the controller saw a replica's job end", *end_fields.JOB)
    RESTART = (
        "restart",
        (Writer.CONTROLLER,),
        "the controller relaunches a group (or assigns it a hot spare)",
        required("replica", "the group"),
        required("attempt", "the new attempt"),
        required("reason", "why"),
        required("from_step", "the run's max step then"),
        optional("spare", "the spare that takes over"),
        optional("job_id", "the spare's job, the group's next attempt"),
    )
    FAULT = (
        "fault",
        (Writer.CONTROL, Writer.CONTROLLER),
        "a fault was injected (or undone: `action=resume`)",
        required(
            "action",
            "the fault kind: a name from the table of fault kinds (`workbench/faults/kinds.py`, which says what "
            "each kind does and on which backends; `workbench kill --help` lists them), or `resume`",
        ),
        required("origin", "who asked", states.FaultOrigin),
        optional("target", "the replica group, or `lighthouse`"),
        optional("attempt", "the target's attempt"),
        optional("pid", "the process signalled"),
        optional("seconds", "how long (`hang` and the machine-level kinds)"),
        optional("node", "a node or link fault's node"),
        optional("cgroup", "a cgroup fault's cgroup"),
        optional("pids", "the processes it confined"),
        optional("share", "`straggler`: the CPU share"),
        optional("undo_helper", "the detached helper that undoes it after `seconds`"),
        optional("resumed", "`resume`: the kind undone"),
        optional("<trigger>_step", "a fired armed kind: `checkpoint_step`, `allreduce_step`"),
        optional("armed_t", "a fired armed kind: when it was armed"),
    )
    ARMED = (
        "armed",
        (Writer.CONTROL, Writer.CONTROLLER),
        "a triggered fault kind waits for its target's trigger: a save it marks `held` or a `held` event "
        "(`workbench/faults/armed.py`)",
        required("action", "the fault kind"),
        required("target", "the replica group"),
        required("origin", "who asked", states.FaultOrigin),
        required("trigger", "`checkpoint` or `allreduce`"),
    )
    HELD = (
        "held",
        (Writer.REPLICA,),
        "the group found an armed `kill_in_allreduce` and waits before joining an all-reduce its peers are in "
        "(torchft-lite; `workbench/trainers/torchft/collective_failure.py`)",
        required("trigger", "`allreduce`"),
        required("step", "torchft's step"),
        optional("released", "true when it goes on without the kill"),
        optional("seconds", "with `released`: how long it waited"),
    )
    LIGHTHOUSE = (
        "lighthouse",
        (Writer.CONTROLLER,),
        "the torchft lighthouse went up or down",
        required("state", "its state", states.LighthouseState),
        required("address", "its address"),
        required("pid", "its process (the event's `pid`, not the controller's)"),
        optional("pid_start", "`up`: its start (with `host`: its identity)"),
        optional("returncode", "`down`: its exit status"),
    )
    HANG = (
        "hang",
        (Writer.CONTROLLER,),
        "the hang detector found a group without progress",
        required("target", "the group"),
        required("attempt", "its attempt"),
        required("step", "its last step"),
        required("seconds_without_progress", "since its last progress"),
        required("timeout_s", "the hang detector's window"),
    )
    NODE_HEALTH = (
        "node_health",
        (Writer.CONTROLLER,),
        "one node's health, sampled by the controller (`workbench/controller/nodehealth.py`)",
        required("node", "the node"),
        required("cpu_percent", "its processes' CPU, percent of one core"),
        required("rss_bytes", "their resident memory"),
        required("mem_share", "its share of the machine's memory"),
        optional("net_sent_bytes", "the node's link counter, where it has one"),
        optional("net_received_bytes", "the node's link counter"),
        optional("net_sent_bps", "its rate since the last sample"),
        optional("net_received_bps", "its rate"),
        optional("gpu_util_percent", "NVIDIA or AMD, where a library sees a device"),
        optional("gpu_mem_bytes", "its memory used"),
        optional(
            "groups",
            "per replica group with processes there: `replica`, `attempt` (its current one) and `rss_bytes`, "
            "its processes' resident memory (the group tile's memory on CPU)",
        ),
    )
    RUN_END = (
        "run_end",
        (Writer.CONTROLLER, Writer.CONTROL),
        "the run ended (a control writer's: it stopped a run whose controller was gone)",
        required("state", "how", [s for s in states.RunStatus if s.ended]),
        required("reason", "why: prose for a person, or one a reader can act on", states.RunEndReason),
        optional("steps", "the controller's: the run's max step"),
        optional("not_signalled", "the control writer's: processes it could not prove were the run's"),
        optional("since", "with `run_root_unwritable`: the `t` of the controller's first event not written"),
        optional("error", "with `since`: the last error an append met"),
        "A controller that cannot write its `run_end` leaves it in a few words as the symlink `run_end.unwritten` "
        "in the run directory, which `Run.controller_gone` reads (`workbench/run/unwritten_end.py`).",
    )
    POINT_ERROR = (
        "point_error",
        (Writer.SWEEP,),
        "a sweep point could not be submitted",
        required("point", "the point's index"),
        required("message", "the error"),
    )
    SWEEP_END = (
        "sweep_end",
        (Writer.SWEEP, Writer.CONTROL),
        "the sweep ended",
        required("state", "how", [s for s in states.RunStatus if s.ended]),
        required("reason", "why"),
        optional("points", "the sweep controller's: each point's run state"),
    )
    WRITE_GAP = (
        "write_gap",
        ANY_WRITER,
        "the writer could not append to its file for a while, and now can (`workbench/events/writer.py`)",
        required("since", "the `t` of the first event it could not write"),
        required("delayed", "events written late, just before this one, each with its own `t`"),
        required("lost", "events never written: beyond its in-memory backlog, or a half line whose file was replaced"),
        required("error", "the first error"),
        "Every other event of the writer is in its file whole and once; the fold counts these (`write_gaps`).",
    )
    WARNING = (
        "warning",
        ANY_WRITER,
        "something a person should read",
        required("message", "what"),
        optional("replica", "the controller's: the group it is about"),
        optional("failed_rank", "ddp-restart's and titan-restart's launcher: the rank that failed"),
        optional("exitcode", "ddp-restart's launcher: its exit code"),
        optional("processes", "a restart baseline's launcher: how each worker ended, in order (as `exit`'s)"),
        optional("first_failed", "a restart baseline's launcher: the rank of the first worker that ended unclean"),
    )
    STACKS = (
        "stacks",
        (Writer.CONTROLLER, Writer.CONTROL),
        "the stacks of a group's processes (or the controller's), sampled with py-spy",
        *end_fields.STACKS,
    )
    STATE_LOST = (
        "state_lost",
        (Writer.CONTROLLER,),
        "every replica group ended with no live peer to heal from: the model state in memory is gone",
        *end_fields.STATE_LOST,
    )
