"""The event log: torn lines, many writers, late files, garbage, and a writer that cannot write."""

import json
import shutil
import threading

from workbench.events.reader import EventReader
from workbench.events.writer import EventWriter


def test_torn_last_line_is_read_once_complete(tmp_path):
    (tmp_path / "events").mkdir()
    path = tmp_path / "events" / "w.jsonl"
    reader = EventReader(tmp_path)
    line = json.dumps({"t": 1.0, "kind": "step", "step": 1}) + "\n"
    path.write_text(line + line[:10])
    assert [e["step"] for e in reader.poll()] == [1]
    with open(path, "a") as f:
        f.write(line[10:])
    assert [e["step"] for e in reader.poll()] == [1]
    assert reader.poll() == []


def test_many_writers_every_event_exactly_once(tmp_path):
    n_writers, n_events = 8, 500
    reader = EventReader(tmp_path)
    seen = []

    def write(i):
        w = EventWriter(tmp_path, f"writer-{i}", replica=i)
        for s in range(n_events):
            w.emit("step", step=s)
        w.close()

    threads = [threading.Thread(target=write, args=(i,)) for i in range(n_writers)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        seen.extend(reader.poll())
    for t in threads:
        t.join()
    seen.extend(reader.poll())
    keys = [(e["replica"], e["step"]) for e in seen]
    assert len(keys) == len(set(keys)) == n_writers * n_events


def test_file_that_appears_late_is_picked_up(tmp_path):
    reader = EventReader(tmp_path)
    assert reader.poll() == []
    EventWriter(tmp_path, "late").emit("start")
    assert [e["kind"] for e in reader.poll()] == ["start"]


def test_garbage_lines_are_skipped_and_counted(tmp_path):
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "x.jsonl").write_text('not json\n[1,2]\n{"t": 2, "kind": "exit"}\n')
    reader = EventReader(tmp_path)
    assert [e["kind"] for e in reader.poll()] == ["exit"]
    assert reader.skipped_lines == 2


def test_writer_survives_its_run_dir_vanishing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    w = EventWriter(run_dir, "replica-0.attempt-0")
    assert w.emit("start") is not None
    w.close()
    shutil.rmtree(run_dir)
    run_dir.mkdir()
    (run_dir / "events").write_text("a file where the directory was")
    assert w.emit("step", step=1) is None
    assert w.emit("step", step=2) is None
    (run_dir / "events").unlink()  # the directory can be made again: the kept events land, then the gap
    assert w.emit("step", step=3) is not None
    events = EventReader(run_dir).poll()
    assert [(e["kind"], e.get("step")) for e in events] == [("step", 1), ("step", 2), ("write_gap", None), ("step", 3)]
    assert (events[2]["delayed"], events[2]["lost"]) == (2, 0) and "FileExistsError" in events[2]["error"]
    err = capsys.readouterr().err
    assert err.count("is not writable") == 1  # once for the episode, not per event
    assert err.count("is writable again: 2 events written late, 0 lost") == 1


def test_a_diverged_loss_is_kept(tmp_path):
    w = EventWriter(tmp_path, "replica-0.attempt-0", replica=0)
    w.emit("step", step=1, loss=float("nan"))
    w.emit("step", step=2, loss=float("inf"))
    events = EventReader(tmp_path).poll()
    assert [e["step"] for e in events] == [1, 2]
    assert events[0]["loss"] != events[0]["loss"] and events[1]["loss"] == float("inf")
