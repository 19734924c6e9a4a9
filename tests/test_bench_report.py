"""A full ``make bench`` rebuilds docs/benchmarks.md; the sections it did not measure (figures taken by hand,
between ``<!-- bench.NAME -->`` markers) must survive it, each where it stood."""

from pathlib import Path

from bench.__main__ import _keep_unwritten_sections


def _section(name: str, body: str) -> str:
    return f"<!-- bench.{name}: begin -->\n## {name}\n\n{body}\n<!-- bench.{name}: end -->\n"


def test_a_full_run_keeps_the_hand_measured_sections_in_their_places(tmp_path: Path):
    before = "# Benchmarks\n\nold body\n\n" + "\n".join(
        [
            _section("hand_first", "by hand, 1"),
            _section("forkserver", "old fork figures"),
            _section("slurm_recovery", "by hand, 2"),
            _section("stall_sweep", "by hand, 3"),
            _section("slurm", "old slurm figures"),
        ]
    )
    out = tmp_path / "benchmarks.md"
    out.write_text(
        "# Benchmarks\n\nnew body\n\n"
        + "\n".join([_section("forkserver", "new fork figures"), _section("slurm", "new slurm figures")])
    )

    _keep_unwritten_sections(out, before)

    text = out.read_text()
    order = ["hand_first", "forkserver", "slurm_recovery", "stall_sweep", "slurm"]
    positions = [text.index(f"<!-- bench.{name}: begin -->") for name in order]
    assert positions == sorted(positions), text
    assert "new body" in text and "new fork figures" in text and "new slurm figures" in text
    assert "old fork figures" not in text and "old slurm figures" not in text
    for n in (1, 2, 3):
        assert text.count(f"by hand, {n}") == 1
    assert "\n\n\n" not in text


def test_a_report_without_old_sections_is_left_as_written(tmp_path: Path):
    out = tmp_path / "benchmarks.md"
    written = "# Benchmarks\n\nnew body\n\n" + _section("slurm", "new")
    out.write_text(written)

    _keep_unwritten_sections(out, "# Benchmarks\n\nold body\n")

    assert out.read_text() == written
