"""The exporter's series through OpenTelemetry's SDK (its own in-memory reader), from a run directory
written by hand: the same fold as the Prometheus endpoint, collected again as the log grows."""

from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from workbench.apps import exporter
from workbench.events.writer import EventWriter
from workbench.run import rundir
from workbench.run.handle import attach
from workbench.spec.load import load_spec


def _points(reader) -> dict:
    out = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    out[(m.name, tuple(sorted(p.attributes.items())))] = p.value
    return out


def test_otel_reader_sees_steps_and_a_fault_from_the_fold(tmp_path):
    spec = load_spec("demo", ["replicas=2", "faults=[]"], run_root=str(tmp_path)).to_dict()
    run_dir = rundir.create(tmp_path, "r1", spec)
    w = EventWriter(run_dir, "replica-1.attempt-0", run="r1", replica=1, attempt=0)
    w.emit("start", trainer="torchft-lite", role="replica")
    for s in range(1, 6):
        w.emit("step", step=s, loss=2.0 / s, committed=True, participating=True, step_time_s=0.03)
    reader = InMemoryMetricReader()
    exporter.otel_meter_provider(exporter.RunCollector(attach(run_dir)), [reader], fresh_s=0.0)  # fold on every ask
    labels = (("replica", "1"), ("run", "r1"))
    first = _points(reader)
    assert first[("workbench_replica_step", labels)] == 5 and first[("workbench_replica_loss", labels)] == 0.4
    assert first[("workbench_faults", (("run", "r1"),))] == 0
    EventWriter(run_dir, "control-1", run="r1").emit("fault", action="kill", target=1, origin="api")
    second = _points(reader)
    assert second[("workbench_faults", (("run", "r1"),))] == 1
    assert second[("workbench_replica_faults", labels)] == 1
    assert second[("workbench_replica_state", (*labels[:1], ("run", "r1"), ("state", "dead")))] == 1
