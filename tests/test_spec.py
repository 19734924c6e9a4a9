"""Spec validation: each bad input is refused with its field named, and nothing starts."""

import os
import shlex
import subprocess
import sys

import pytest

import workbench as wb
from workbench.spec.load import load_spec

from .conftest import REPO


@pytest.mark.parametrize(
    "overrides, field, allowed",
    [
        (["foo=1"], "foo", "unknown key"),
        (["lighthouse.bogus=3"], "lighthouse.bogus", "heartbeat_timeout_ms"),
        (["replicas=three"], "replicas", "integer"),
        (["replicas=0"], "replicas", "greater than or equal to 1"),
        (["replicas=2", "min_replicas=3"], "min_replicas", "<= replicas"),
        (
            ["trainer=pytorch-lightning"],
            "trainer",
            "'torchft-lite', 'titan', 'maxtext', 'ddp-restart' or 'titan-restart'",
        ),
        (["cluster=k8s"], "cluster", "allowed: local, slurm"),
        (["steps=-5"], "steps", "greater than or equal to 1"),
        (["model.dim=30", "model.heads=4"], "model", "multiple of heads"),
        (["relaunch=sometimes"], "relaunch", "'auto' or 'off'"),
        (["faults=[{action: kill, target: 7, at_step: 3}]"], "faults", "< replicas"),
        (['slurm.sbatch_args={constraint: "h100\\nrm -rf ~"}'], "slurm.sbatch_args", "control character"),
        (['slurm.sbatch_args={"a b": c}'], "slurm.sbatch_args", "an sbatch option name"),
        (["lighthouse.bind_host=0.0.0.0"], "lighthouse.bind_host", "not a loopback address"),
        (["torchft.rust_log=verbose"], "torchft.rust_log", "'error', 'warn', 'info', 'debug' or 'trace'"),
        (["maxtext=" + "[" * 3000 + "]" * 3000], "maxtext", "nested too deeply"),
        (["faults=[{action: explode, at_step: 3}]"], "faults.0.action", "allowed: kill, abort, hang, preempt"),
        (
            ["faults=[{action: node_down, at_step: 3}]"],
            "faults[0].action",
            "not a fault on cluster local; allowed: kill, abort, hang, preempt, straggler, freeze, lighthouse_kill",
        ),
        (
            ["faults=[{action: partition, at_step: 3}]"],
            "faults[0].action",
            "partition needs nodes in network namespaces (the dev Slurm cluster) on cluster local",
        ),
    ],
)
def test_bad_spec_names_field_and_allowed_values(overrides, field, allowed):
    with pytest.raises(wb.SpecError) as err:
        load_spec("demo", overrides)
    msg = str(err.value)
    assert field in msg and allowed in msg, msg


def test_overrides_as_strings_dict_and_kwargs_agree():
    a = load_spec("demo", ["replicas=2", "lighthouse.heartbeat_timeout_ms=500"])
    b = load_spec("demo", {"replicas": 2, "lighthouse.heartbeat_timeout_ms": 500})
    assert a == b and a.replicas == 2 and a.lighthouse.heartbeat_timeout_ms == 500


def test_unknown_config_lists_shipped_ones():
    with pytest.raises(wb.SpecError, match="shipped configs: .*demo"):
        load_spec("no-such-config")


def test_yaml_that_constructs_objects_is_refused(tmp_path):
    bad = tmp_path / "evil.yaml"
    bad.write_text("name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(wb.SpecError, match="safe loading"):
        load_spec(bad)


def test_unwritable_run_root_is_refused(tmp_path):
    """Mode 0500 for a user; for root (CI runs as root) a read-only bind mount in a private
    mount namespace, since root writes through permission bits."""
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    check = (
        f"import workbench as wb; from workbench.spec.preflight import preflight; from workbench.spec.load import load_spec\n"
        f"try:\n    preflight(load_spec('demo', ['run_root={ro}/runs']))\nexcept wb.SpecError as e:\n"
        f"    print(e)"
    )
    argv = [sys.executable, "-c", check]
    if os.geteuid() == 0:
        argv = [
            "unshare",
            "-m",
            "sh",
            "-c",
            f'mount --bind "{ro}" "{ro}" && mount -o remount,ro,bind "{ro}" && '
            + " ".join(shlex.quote(a) for a in argv),
        ]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("run_root:") and "is not writable" in out.stdout, out.stdout


def test_run_root_under_a_file_is_refused_and_nothing_starts(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(wb.SpecError, match="run_root"):
        wb.submit("demo", [f"run_root={blocker}/runs"])
    assert blocker.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_bad_spec_submits_nothing(run_root):
    with pytest.raises(wb.SpecError):
        wb.submit("demo", ["replicas=0"])
    assert not run_root.exists()
