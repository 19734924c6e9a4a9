"""The event log's schema holds the code: every kind emitted is in it, every kind in it is emitted, the calls write
the required fields, the fold's states are its enums, docs/events.md is what it renders, and the events layer
imports nothing above it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.events import schema
from workbench.events.kinds import Kind
from workbench.events.states import CheckpointState, ExitReason, FaultOrigin, ReplicaState, RunStatus

ROOT = Path(__file__).resolve().parent.parent
TORCHFT_LOGS = ROOT / "workbench" / "trainers" / "torchft" / "logs.py"


def _emits(*dirs: str) -> list[tuple[str, ast.Call]]:
    """Every ``<x>.emit("<kind>", ...)`` call with a literal kind under ``dirs``: (where, call)."""
    found = []
    for d in dirs:
        for path in sorted((ROOT / d).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "emit"
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)
                ):
                    found.append((f"{path.relative_to(ROOT)}:{node.lineno}", node))
    return found


def _torchft_log_kinds() -> set[str]:
    """The kinds ``TorchftLogHandler`` emits by name: the values of its ``LOGGERS`` table."""
    for node in ast.walk(ast.parse(TORCHFT_LOGS.read_text())):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "LOGGERS" for t in node.targets):
            return set(ast.literal_eval(node.value).values())
    raise AssertionError(f"no LOGGERS table in {TORCHFT_LOGS}")


def test_every_kind_the_code_emits_is_in_the_schema():
    emitted = {(where, call.args[0].value) for where, call in _emits("workbench", "bench")}
    unknown = sorted((where, kind) for where, kind in emitted if kind not in set(Kind))
    assert unknown == []
    assert _torchft_log_kinds() <= set(Kind)


def test_every_kind_in_the_schema_is_emitted():
    emitted = {call.args[0].value for _, call in _emits("workbench")} | _torchft_log_kinds()
    assert sorted(set(Kind) - emitted) == []


def test_each_call_that_names_all_its_fields_writes_the_required_ones():
    missing = []
    for where, call in _emits("workbench"):
        names = {kw.arg for kw in call.keywords if kw.arg}
        splats = [kw.value for kw in call.keywords if kw.arg is None]
        if any(not isinstance(s, ast.Dict) or None in s.keys for s in splats):
            continue  # fields from a variable: not known here
        names |= {k.value for s in splats for k in s.keys if isinstance(k, ast.Constant)}
        kind = Kind(call.args[0].value)
        if not set(kind.required_fields) <= names:
            missing.append((where, kind.value, sorted(set(kind.required_fields) - names)))
    assert missing == []


def test_a_kind_s_fields_are_named_once_and_its_notes_are_sentences():
    for kind in Kind:
        names = [f.name for f in kind.fields]
        assert len(names) == len(set(names)), kind
        assert kind.writers and kind.summary, kind
        assert not kind.notes or kind.notes.endswith("."), kind


def test_docs_events_md_is_the_schema_rendered():
    assert schema.DOC.read_text() == schema.render(), "run: python -m workbench.events.schema --markdown"


def test_the_check_fails_on_a_stale_document(tmp_path, capsys):
    doc = tmp_path / "events.md"
    doc.write_text("# an older schema\n")
    assert schema.main(["--check", "--path", str(doc)]) == 1
    assert schema.main(["--markdown", "--path", str(doc)]) == 0
    assert schema.main(["--check", "--path", str(doc)]) == 0


def test_the_fold_s_replica_states_are_the_enum():
    from workbench.faults import kinds as faultkinds
    from workbench.state.replica import REPLICA_STATES
    from workbench.state.run_status import TERMINAL

    assert REPLICA_STATES == tuple(sorted(ReplicaState, key=REPLICA_STATES.index))
    assert set(REPLICA_STATES) == set(ReplicaState)
    assert set(TERMINAL) == {s for s in RunStatus if s.ended}
    after = {k.state_after or "dead" for k in faultkinds.KINDS.values() if k.ends_process}
    after |= {k.state_after or "hung" for k in faultkinds.KINDS.values() if k.pauses_process}
    assert after <= set(ReplicaState)


@pytest.mark.parametrize("reason", list(ExitReason))
def test_an_exit_reason_gives_the_group_its_state(reason):
    from workbench.state.fold import RunState

    state = RunState(replicas=1)
    state.apply(
        [
            {"t": 1.0, "kind": "start", "replica": 0, "attempt": 0, "role": "replica", "pid": 1, "host": "h"},
            {"t": 2.0, "kind": "exit", "replica": 0, "attempt": 0, "reason": reason.value, "step": 0},
        ]
    )
    view = state.replicas[0]
    assert view.state == reason.replica_state
    assert (view.heartbeat_age(3.0) is None) == reason.replica_state.ended


def test_the_run_states_are_the_fold_s():
    from workbench.state.run_status import run_state

    assert run_state(None, False, False) == RunStatus.PENDING
    assert run_state(None, True, False) == RunStatus.STARTING
    assert run_state(None, True, True) == RunStatus.RUNNING
    assert run_state({}, True, True) == RunStatus.FAILED


def test_the_checkpoint_verdicts_are_the_ledger_s():
    from workbench.state.checkpoints import CheckpointLedger

    verdicts = set(CheckpointLedger().status({})) - {"last_durable"}
    assert verdicts | {"durable", "started"} == set(CheckpointState)
    assert {s for s in CheckpointState if s.in_events} == {CheckpointState.STARTED}


def test_fault_origins_are_the_injector_s():
    """A fault's ``action`` is a name from the fault-kind table, which the injector checks (``faultkinds.require``);
    the schema points at that table rather than copying it, so a new kind is one row in ``faults/kinds.py``."""
    from workbench.faults import inject

    assert set(inject.ORIGINS) == set(FaultOrigin)


def test_the_events_layer_imports_nothing_above_it():
    code = (
        "import sys, workbench\n"
        "before = set(sys.modules)\n"
        "import workbench.events.writer, workbench.events.reader, workbench.events.schema\n"
        "print(sorted(m for m in set(sys.modules) - before if not m.startswith(('workbench.events', 'orjson'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    imported = [
        m
        for m in ast.literal_eval(out)
        if m.startswith("workbench") or m.split(".")[0] in ("pandas", "psutil", "numpy")
    ]
    assert imported == []
