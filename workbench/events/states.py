"""The sets of string values in the event log, and the states the run-state fold derives from it.

Each set is a ``StrEnum`` whose members carry what they mean (``meaning``) and, where the
code decides by it, the property it decides by (``ended``, ``replica_state``, ``in_events``).
A member equals its plain string (``ReplicaState.DEAD == "dead"``), so events, the fold
(``workbench.state.fold``) and the views keep their strings; ``tests/test_event_schema.py``
holds these sets equal to the ones that code uses, and ``docs/events.md`` is written from them
(``python -m workbench.events.markdown``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self


class Described(StrEnum):
    """A string value and what it means (``meaning``); the sets below with no other property derive from it."""

    meaning: str

    def __new__(cls, value: str, meaning: str) -> Self:
        member = str.__new__(cls, value)
        member._value_ = value
        member.meaning = meaning
        return member


class ReplicaState(StrEnum):
    """A replica group's state, from the events of that group: the fold's ``ReplicaView.state``, a tile's colour."""

    meaning: str
    ended: bool  # its process is gone: no heartbeat age, and a controller ``hang`` no longer applies

    def __new__(cls, value: str, meaning: str, ended: bool = False) -> ReplicaState:
        member = str.__new__(cls, value)
        member._value_ = value
        member.meaning, member.ended = meaning, ended
        return member

    PENDING = "pending", "submitted (or planned), no `start` yet"
    STARTING = "starting", "`start`/`phase` of the current attempt, no step yet"
    PARTICIPATING = "participating", "committed steps"
    HEALING = "healing", "a `heal`, or a step with `participating=false`, not yet followed by a committed step"
    HUNG = (
        "hung",
        (
            "a fault whose kind pauses the process (`hang`), or the controller's `hang` event, and no progress since: "
            "no `resume`, the step has not advanced, `seconds` not passed"
        ),
    )
    DEAD = (
        "dead",
        "a fault whose kind ends the process, an `exit` with reason `error`, or a controller `job` event that "
        "ended unclean; stays dead until a newer attempt starts (late events of the dead attempt are ignored)",
        True,
    )
    FINISHED = "finished", "`exit` with reason `completed`", True
    STOPPED = "stopped", "`exit` with reason `stopped` or `preempted` (a preemption the workbench did not inject)", True


class RunStatus(StrEnum):
    """A run's state (the fold's ``RunState.state``); the ended ones are what ``run_end``'s (and ``sweep_end``'s)
    ``state`` says."""

    meaning: str
    ended: bool

    def __new__(cls, value: str, meaning: str, ended: bool = False) -> RunStatus:
        member = str.__new__(cls, value)
        member._value_ = value
        member.meaning, member.ended = meaning, ended
        return member

    PENDING = "pending", "no `start` yet"
    STARTING = "starting", "a `start`, no `step` yet"
    RUNNING = "running", "a `step`, no `run_end` yet"
    COMPLETED = "completed", "`run_end`: every group ended, and one of them completed", True
    FAILED = (
        "failed",
        "`run_end`: every group failed or exhausted `max_restarts`, or the controller failed (a `run_end` without "
        "a state reads as this)",
        True,
    )
    STOPPED = "stopped", "`run_end`: stopped on request (or by a stop that found the controller gone)", True


class RunEndReason(Described):
    """The reasons in ``run_end``'s ``reason`` that a reader can act on; any other reason is prose for a person."""

    RUN_ROOT_UNWRITABLE = (
        "run_root_unwritable",
        "`failed`: the controller's event log took no write for the spec's `unwritable_timeout_s` (a full disk, a "
        "quota, a file system gone read-only), so the controller stopped every group; `since` and `error` say "
        "from when and why (`workbench/controller/unwritable.py`)",
    )
    STATE_LOST = (
        "state_lost",
        "every replica group died with no live peer holding the model state (the run's `state_lost` event: the "
        "step, and whether it resumed from durable state, went on from scratch or failed; "
        "`workbench/controller/total_loss.py`)",
    )


class ExitReason(StrEnum):
    """Why a replica's process ended (``exit``'s ``reason``), and the state the fold gives its group for it."""

    meaning: str
    replica_state: ReplicaState

    def __new__(cls, value: str, meaning: str, replica_state: ReplicaState) -> ExitReason:
        member = str.__new__(cls, value)
        member._value_ = value
        member.meaning, member.replica_state = meaning, replica_state
        return member

    COMPLETED = "completed", "it reached the last step", ReplicaState.FINISHED
    PREEMPTED = (
        "preempted",
        "the scheduler's preemption signal (after an injected `preempt` the group is already dead: the fault ends "
        "its attempt)",
        ReplicaState.STOPPED,
    )
    STOPPED = "stopped", "a planned stop (the run's, or a spare's that was never assigned)", ReplicaState.STOPPED
    ERROR = "error", "it failed (`error` says how); any other reason counts as this one", ReplicaState.DEAD


class JobState(Described):
    """The controller's ``job`` event's ``state``: what it saw of the scheduler's job."""

    ENDED = "ended", "the job is gone; `clean` says whether its own `exit` said completed"


class CheckpointState(StrEnum):
    """A save's state: ``started`` is written in a ``checkpoint`` event; the others are the fold's verdicts
    (``workbench.state.checkpoints``), from a writer that announces its saves (ddp-restart)."""

    meaning: str
    in_events: bool  # a writer writes it in ``checkpoint``'s ``state``; else the fold says it

    def __new__(cls, value: str, meaning: str, in_events: bool = False) -> CheckpointState:
        member = str.__new__(cls, value)
        member._value_ = value
        member.meaning, member.in_events = meaning, in_events
        return member

    STARTED = "started", "announced before the writer writes it (`durable=false`)", True
    DURABLE = (
        "durable",
        (
            "committed: its `durable` event came (and, for the last one, its commit marker, the committed file name, "
            "is on disk)"
        ),
    )
    WRITING = "writing", "started; its attempt is still alive and has not stepped since"
    SKIPPED = "skipped", "started, and the same attempt stepped on without committing it"
    INCOMPLETE = "incomplete", "started, and its attempt ended (killed mid-save) without the commit"


class LighthouseState(Described):
    """The torchft lighthouse, as the controller reports it (``lighthouse``'s ``state``)."""

    UP = "up", "(re)started; the event carries its identity (`pid`, `host`, `pid_start`)"
    DOWN = "down", "the controller found it gone (`returncode`) and restarts it after `restart_delay_s`"


class NodeState(Described):
    """A node of a run as the fold sees it (``workbench.state.nodes``)."""

    UP = "up", "no node fault, or its `resume` came"
    DOWN = "down", "a node fault (`node_down`, `slurmd_kill`), not yet resumed: every group with a part there is hit"


class Role(Described):
    """What a process is, in its ``start`` event's ``role``."""

    REPLICA = "replica", "a replica group's process (its first or only task)"
    TASK = "task", "TorchTitan over several nodes: the group's process on another node (placement only)"
    CONTROLLER = "controller", "the run controller"
    SWEEP_CONTROLLER = "sweep-controller", "a sweep's controller"


class Phase(Described):
    """A milestone of a process's start or stop (``phase``'s ``phase``)."""

    INTERPRETER_UP = "interpreter_up", "MaxText: its interpreter runs the launcher (`at`: on its clock; `warm`: forked)"
    IMPORTS_DONE = "imports_done", "the trainer's imports are done (MaxText: `warm`; `imported_s` the standby's)"
    BACKEND_READY = "backend_ready", "MaxText: JAX's backend is initialised (`devices`)"
    COMPILED = "compiled", "MaxText: train step compiled (`compile_cache_*`; `trace_s`, `lower_s`, `backend_compile_s`)"
    MODEL_READY = "model_ready", "model and optimizer built; `checkpoint_address` is where it serves heals from"
    SPARE_READY = "spare_ready", "a hot spare has built everything but its Manager and waits to be assigned"
    CONFIG_PARSED = "config_parsed", "TorchTitan: its config is parsed (tyro over the flags, the config function)"
    DISTRIBUTED_READY = (
        "distributed_ready",
        "TorchTitan: the group's store rendezvous, process group and torchft Manager are up",
    )
    MODEL_BUILT = "model_built", "TorchTitan: the model is built, parallelised and initialised (before its optimizer)"
    MANAGER_READY = (
        "manager_ready",
        "TorchTitan: the whole trainer is built (optimizer, dataloader, checkpointer; `checkpoint_address`)",
    )
    QUORUM_DONE = "quorum_done", "TorchTitan: the attempt's first quorum returned, before its first forward"
    LAUNCHED = "launched", "MaxText: its training process started (`maxtext_pid`)"
    RESTORED = "restored", "restored from a checkpoint (`from_step`; the fold counts the steps lost since)"
    FIRST_STEP = "first_step", "MaxText: the first step, after compiling (`compile_cache_hits`, `compile_cache_misses`)"
    STOPPING = "stopping", "MaxText: a stop signal arrived (`signal`)"


class FaultOrigin(Described):
    """Who asked for a fault (``fault``'s and ``armed``'s ``origin``)."""

    API = "api", "`Run.kill`/`Run.fault` from Python (a notebook)"
    CLI = "cli", "`workbench kill`"
    BUTTON = "button", "the dashboard's fault menu"
    SCHEDULE = "schedule", "the spec's `faults`, fired by the controller; also a timed fault's undo (`resume`)"
    WATCHDOG = "watchdog", "the hang watchdog's kill (`hang.action: kill`)"
