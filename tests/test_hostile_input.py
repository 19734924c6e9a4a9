"""Hostile and malformed input: a clear error, nothing submitted, nothing left running."""

import subprocess
import sys

import pytest

import workbench as wb

from .conftest import REPO

# (overrides, the field the one-line refusal must name)
BAD_OVERRIDES = [
    (["replicas=-1"], "replicas"),
    (["replicas=1e9"], "replicas"),
    (["replicas=[1,2]"], "replicas"),
    (["replicas={a: 1}"], "replicas"),
    (["replicas=true"], "replicas"),
    (["steps=0"], "steps"),
    (["steps=abc"], "steps"),
    (["min_replicas=0"], "min_replicas"),
    (["seed=-3"], "seed"),
    (["max_restarts=-1"], "max_restarts"),
    (["relaunch_delay_s=-1"], "relaunch_delay_s"),
    (["on_state_loss=ignore"], "on_state_loss"),
    (["torchft.snapshot_every=-1"], "torchft.snapshot_every"),
    (["torchft.snapshot_every=5", "trainer=titan"], "torchft.snapshot_every"),
    (["heartbeat_s=0"], "heartbeat_s"),
    (["spares=-1"], "spares"),
    (["spares=2", "trainer=ddp-restart"], "spares"),
    (["lighthouse.heartbeat_timeout_ms=0"], "lighthouse.heartbeat_timeout_ms"),
    (["lighthouse.port=70000"], "lighthouse.port"),
    (["lighthouse.quorum_tick_ms=1"], "lighthouse.quorum_tick_ms"),
    (["torchft.timeout_s=0"], "torchft.timeout_s"),
    (["torchft.quorum_retries=-1"], "torchft.quorum_retries"),
    (["model.dim=0"], "model.dim"),
    (["model.vocab_size=3"], "model.vocab_size"),
    (["model.lr=-0.1"], "model.lr"),
    (["model.heads=3"], "heads"),
    (["name=../../etc"], "name"),
    (["name=a/b"], "name"),
    (["name="], "name"),
    (["name=" + "x" * 80], "name"),
    (["trainer=../../bin/sh"], "trainer"),
    (["cluster=local; rm -rf /"], "cluster"),
    (["faults=[{action: kill}]"], "faults.0"),
    (["faults=[{action: kill, at_step: 1, at_s: 2}]"], "faults.0"),
    (["faults=[{action: hang, at_s: 1, seconds: 0}]"], "faults.0.seconds"),
    (["faults=not-a-list"], "faults"),
    (["chaos={mtbf_s: 0}"], "chaos.mtbf_s"),
    (["chaos={mtbf_s: 5, actions: []}"], "chaos.actions"),
    (["chaos={mtbf_s: 5, bogus: 1}"], "chaos.bogus"),
    (["hang.action=reboot"], "hang.action"),
    (["slurm.nodes=0"], "slurm.nodes"),
    (["no_such_section.x=1"], "no_such_section"),
    (["model=3"], "model"),
    (["replicas"], "replicas"),
    (["=3"], "override"),
    (["titan=!!python/object/apply:os.system ['true']"], "titan"),
    (["maxtext=" + "[" * 5000 + "]" * 5000], "maxtext"),
    (["titan=" + "{a: " * 30 + "1" + "}" * 30], "titan"),
    (['slurm.sbatch_args={constraint: "h100\\nrm -rf ~"}'], "slurm.sbatch_args"),
    (['slurm.sbatch_args={"con straint": a}'], "slurm.sbatch_args"),
    (['slurm.srun_args=["--x\\ttab"]'], "slurm.srun_args"),
    (["lighthouse.bind_host=0.0.0.0"], "lighthouse.bind_host"),
    (["lighthouse.bind_host=10.0.0.1"], "lighthouse.bind_host"),
    (["faults=[{action: node_down, at_step: 3}]"], "faults[0].action"),
    (["chaos={mtbf_s: 5, actions: [slurmd_kill]}"], "chaos.actions"),
    (["maxtext=&a [" + ", ".join(["*a"] * 52) + "]"], "maxtext"),
]


def _refusal(overrides) -> str:
    """The SpecError's message from submitting ``overrides`` over the demo; it must be one line."""
    with pytest.raises(wb.SpecError) as err:
        wb.submit("demo", overrides)
    msg = str(err.value)
    assert msg.strip() and "\n" not in msg and "Traceback" not in msg, msg
    return msg


@pytest.mark.parametrize(
    "overrides, field", BAD_OVERRIDES, ids=lambda o: " ".join(o)[:40] if isinstance(o, list) else o
)
def test_bad_override_is_refused_before_anything_exists(overrides, field, run_root):
    msg = _refusal(overrides)
    assert field in msg, f"{field!r} not named in: {msg}"
    assert not run_root.exists()


# Range and form checks on the values that leave Python as text (workbench/spec/forms.py):
# (overrides, the field the refusal names, what it says is allowed or why). Each validated before.
FORM_CHECKS = [
    # seeds: the lite trainers' batch seed overflows torch's 64 bits from seed 1.8e10 (2**40 here)
    (["seed=1099511627776"], "seed", "less than or equal to 4294967295"),
    (["chaos={mtbf_s: 5, seed: 18446744073709551616}"], "chaos.seed", "less than or equal to 4294967295"),
    # numbers JSON cannot hold (run.json would say Infinity; the drawn faults never fire)
    (["chaos={mtbf_s: 5, start_s: .inf}"], "chaos.start_s", "finite number"),
    (["faults=[{action: kill, target: 1, at_s: .inf}]"], "faults.0.at_s", "finite number"),
    (["checkpoint.every_s=.inf"], "checkpoint.every_s", "finite number"),
    # run_root: a line of the sbatch script (the log paths) and Slurm's file name patterns
    (['run_root="runs\\nrm -rf ~"'], "run_root", "one line"),
    (["run_root=/tmp/%u/runs"], "run_root", "without them"),
    # the lighthouse's --bind host:port and the URL every group dials
    (
        ["lighthouse.bind_host=127.0.0.1 --x", "lighthouse.allow_non_loopback=true"],
        "lighthouse.bind_host",
        "IP address",
    ),
    (
        ["lighthouse.bind_host=evil.example/x#", "lighthouse.allow_non_loopback=true"],
        "lighthouse.bind_host",
        "host name",
    ),
    # #SBATCH lines, sbatch --test-only arguments, SLURM_CONF
    (['slurm.partition="debug\\nrm -rf ~"'], "slurm.partition", "partition name"),
    (["slurm.partition=--wrap=id"], "slurm.partition", "partition name"),
    (["slurm.account=my account"], "slurm.account", "account name"),
    (['slurm.qos="normal\\n#SBATCH --exclusive"'], "slurm.qos", "qos name"),
    (['slurm.conf="/etc/slurm/slurm.conf\\nx"'], "slurm.conf", "one line"),
    (["slurm.time_min=1000000000"], "slurm.time_min", "less than or equal to"),
    (["slurm.nodes=10000000"], "slurm.nodes", "less than or equal to"),
    (["slurm.tasks_per_node=100000"], "slurm.tasks_per_node", "less than or equal to"),
    (["slurm.cpus_per_task=100000"], "slurm.cpus_per_task", "less than or equal to"),
    (["slurm.gpus_per_node=100000"], "slurm.gpus_per_node", "less than or equal to"),
    (["slurm.sbatch_args={output: /tmp/elsewhere}"], "slurm.sbatch_args", "sets --output already"),
    (["slurm.sbatch_args={partition: gpu}"], "slurm.sbatch_args", "set it with slurm.partition"),
    # TorchTitan: the TOML's path, OMP_NUM_THREADS, tyro flags
    (["titan.config=5"], "titan.config", "a string"),
    (['titan.config="titan-cpu-debug.toml\\nx"'], "titan.config", "one line"),
    (["titan.threads=0"], "titan.threads", "1..1024"),
    (["titan.threads=lots"], "titan.threads", "1..1024"),
    (["titan.extra_args=--foo"], "titan.extra_args", "a list"),
    (['titan.extra_args=["--x\\ny"]'], "titan.extra_args[0]", "one line"),
    (['titan.overrides={"training seq_len": 1}'], "titan.overrides", "flag name"),
    (['titan.overrides={training.seq_len: "--checkpoint.folder=/tmp/x"}'], "titan.overrides.training.seq_len", "'-'"),
    (["titan.overrides.training.seq_len=128"], "titan.overrides.training", "{section.key: value}"),
    (['titan.overrides={parallelism.degrees: ["1,2"]}'], "titan.overrides.parallelism.degrees[0]", "without ','"),
    # MaxText: key=value arguments
    (['maxtext={"base emb dim": 64}'], "maxtext", "not a MaxText config key"),
    (['maxtext={"--steps": 5}'], "maxtext", "not a MaxText config key"),
    (['maxtext.model_name="llama\\nx"'], "maxtext.model_name", "one line"),
    (["maxtext.hardware=null"], "maxtext.hardware", "a string, number, boolean"),
    (["maxtext.hardware={a: 1}"], "maxtext.hardware", "a string, number, boolean"),
    (['maxtext.ici_parallelism=["1,2"]'], "maxtext.ici_parallelism[0]", "without them"),
    (
        ["trainer=maxtext", "maxtext.base_output_directory=/tmp/x"],
        "maxtext.base_output_directory",
        "set by the workbench",
    ),
    # an environment variable of every group
    (["checksum_every=100000000"], "checksum_every", "less than or equal to"),
]


@pytest.mark.parametrize(
    "overrides, field, allowed", FORM_CHECKS, ids=lambda o: " ".join(o)[:50] if isinstance(o, list) else ""
)
def test_a_value_that_leaves_python_as_text_is_refused_naming_the_field(overrides, field, allowed, run_root):
    msg = _refusal(overrides)
    assert field + ":" in msg and allowed in msg, msg
    assert not run_root.exists()


def test_values_at_the_edge_of_each_form_still_validate():
    """What the checks must keep: the largest seed, names and paths as clusters and configs write them."""
    spec = wb.load_spec(
        "demo",
        {
            "seed": 2**32 - 1,
            "chaos": {"mtbf_s": 5, "seed": 2**32 - 1},
            "run_root": "/tmp/my runs/exp-1.2",
            "lighthouse.bind_host": "localhost",
            "slurm.partition": "gpu,debug_2",
            "slurm.account": "my-project.1",
            "slurm.qos": "normal",
            "slurm.conf": "~/slurm/slurm.conf",
            "slurm.sbatch_args": {"constraint": "h100&ib", "gres": "gpu:8", "time-min": "30"},
            "slurm.srun_args": ["--container-image=nvcr.io/nvidia/pytorch:25.01-py3", "--mpi=pmix"],
            "slurm.setup": ["module load cuda/12.4 && echo $SLURM_JOB_ID"],
            "titan": {
                "config": "/home/me/titan-8b.toml",
                "threads": 4,
                "overrides": {
                    "parallelism.data_parallel_shard_degree": -1,
                    "optimizer.eps": "-1e-8",
                    "hf_assets_path": "/data/Llama-3.1-8B",
                    "training.mixed_precision_param": "float32",
                    "checkpoint.enable": False,
                    "job.subcommands": ["activation-checkpoint:none"],
                    "validator.freq": None,
                },
                "extra_args": ["--training.steps", "5"],
            },
            "maxtext": {"model_name": "llama3.1-8b", "ici_fsdp_parallelism": -1, "data_sharding": ["data", "fsdp"]},
        },
    )
    assert spec.seed == 2**32 - 1 and spec.lighthouse.bind_host == "localhost"
    assert wb.load_spec("demo", ["lighthouse.bind_host=::1"]).lighthouse.bind_host == "::1"
    maxtext = wb.load_spec("maxtext-cpu-tiny", {"maxtext.hardware": "cpu", "maxtext.log_period": 5})
    assert maxtext.maxtext["hardware"] == "cpu"


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
