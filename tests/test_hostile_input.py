"""Hostile and malformed input: a clear error, nothing submitted, nothing left running."""

import subprocess
import sys

import pytest

import workbench as wb

from .conftest import REPO

BAD_OVERRIDES = [
    ["replicas=-1"],
    ["replicas=1e9"],
    ["replicas=[1,2]"],
    ["replicas={a: 1}"],
    ["replicas=true"],
    ["steps=0"],
    ["steps=abc"],
    ["min_replicas=0"],
    ["seed=-3"],
    ["max_restarts=-1"],
    ["relaunch_delay_s=-1"],
    ["heartbeat_s=0"],
    ["spares=-1"],
    ["spares=2", "trainer=maxtext"],
    ["lighthouse.heartbeat_timeout_ms=0"],
    ["lighthouse.port=70000"],
    ["lighthouse.quorum_tick_ms=1"],
    ["torchft.timeout_s=0"],
    ["torchft.quorum_retries=-1"],
    ["model.dim=0"],
    ["model.vocab_size=3"],
    ["model.lr=-0.1"],
    ["model.heads=3"],
    ["name=../../etc"],
    ["name=a/b"],
    ["name="],
    ["name=" + "x" * 80],
    ["trainer=../../bin/sh"],
    ["cluster=local; rm -rf /"],
    ["faults=[{action: kill}]"],
    ["faults=[{action: kill, at_step: 1, at_s: 2}]"],
    ["faults=[{action: hang, at_s: 1, seconds: 0}]"],
    ["faults=not-a-list"],
    ["chaos={mtbf_s: 0}"],
    ["chaos={mtbf_s: 5, actions: []}"],
    ["chaos={mtbf_s: 5, bogus: 1}"],
    ["hang.action=reboot"],
    ["slurm.nodes=0"],
    ["no_such_section.x=1"],
    ["model=3"],
    ["replicas"],
    ["=3"],
    ["titan=!!python/object/apply:os.system ['true']"],
    ["maxtext=" + "[" * 5000 + "]" * 5000],
    ["titan=" + "{a: " * 30 + "1" + "}" * 30],
    ['slurm.sbatch_args={constraint: "h100\\nrm -rf ~"}'],
    ['slurm.sbatch_args={"con straint": a}'],
    ['slurm.srun_args=["--x\\ttab"]'],
    ["lighthouse.bind_host=0.0.0.0"],
    ["lighthouse.bind_host=10.0.0.1"],
    ["faults=[{action: node_down, at_step: 3}]"],
    ["chaos={mtbf_s: 5, actions: [slurmd_kill]}"],
    [
        "maxtext=&a [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a, *a]"
    ],
]


@pytest.mark.parametrize("overrides", BAD_OVERRIDES, ids=lambda o: " ".join(o)[:40])
def test_bad_override_is_refused_before_anything_exists(overrides, run_root):
    with pytest.raises(wb.SpecError) as err:
        wb.submit("demo", overrides)
    assert str(err.value).strip() and "Traceback" not in str(err.value)
    assert not run_root.exists()


@pytest.mark.parametrize(
    "text, needle",
    [
        ("name: !!python/object/apply:os.system ['echo pwned']\n", "safe loading"),
        ("a: &x [1, 2]\nb: *x\n" + "".join(f"c{i}: *x\n" for i in range(60)), "aliases"),
        ("- just\n- a list\n", "top level must be a mapping"),
        ("replicas: [unclosed\n", "not valid YAML"),
        ("\x00\x01binary", "not valid YAML"),
    ],
)
def test_hostile_yaml_files(tmp_path, text, needle):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(wb.SpecError, match=needle):
        wb.load_spec(bad)


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "workbench.apps.cli", *args], capture_output=True, text=True, cwd=REPO, timeout=120
    )


@pytest.mark.parametrize(
    "args",
    [
        ("submit", "demo", "replicas=0"),
        ("submit", "no-such-config"),
        ("validate", "demo", "bogus=1"),
        ("status", "/"),
        ("status", "/nonexistent/run"),
        ("kill", "/tmp", "--replica", "1"),
        ("metrics", "/etc"),
        ("stop", "/nonexistent"),
    ],
)
def test_bad_cli_arguments_fail_with_one_line(args, run_root, tmp_path):
    out = _cli(*args)
    assert out.returncode != 0
    lines = [l for l in out.stderr.strip().splitlines() if l]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert not run_root.exists()


def test_kill_on_a_finished_or_unknown_replica_is_refused(tmp_path):
    from workbench.run import rundir

    run_dir = rundir.create(tmp_path, "fake", wb.load_spec("demo").to_dict())
    run = wb.attach(run_dir)
    with pytest.raises(wb.FaultError, match="replica"):
        run.kill(replica=7)
    with pytest.raises(wb.FaultError, match="no live process"):
        run.kill(replica=1)
    with pytest.raises(wb.FaultError, match="how"):
        run.kill(replica=1, how="explode")
