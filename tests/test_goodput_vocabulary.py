"""The badput breakdown in both vocabularies: the workbench's causes and ml-goodput-measurement's
``BadputType`` (names from its ``goodput_utils.BadputType``, written out here by hand)."""

import math

import pytest

from workbench import analysis
from workbench.spec.load import load_spec

from .test_recovery_timeline import hand_log

# ml-goodput-measurement 0.2.x, goodput_utils.BadputType, in enum order.
LIBRARY_BADPUT_TYPES = [
    "TPU_INITIALIZATION",
    "TRAINING_PREP",
    "PROGRAM_STARTUP",
    "DATA_LOADING_SYNC",
    "DATA_LOADING_ASYNC",
    "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME",
    "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME",
    "WASTED_PROGRESS_FROM_DISRUPTION",
    "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION",
    "CUSTOM_BADPUT_EVENTS",
    "OTHER",
]


def test_a_runs_badput_keeps_its_total_in_both_vocabularies(tmp_path):
    events = hand_log(tmp_path)
    result = analysis.goodput(events, load_spec(trainer="torchft-lite", replicas=3))
    total = sum(result["badput_s"].values())
    assert total > 1.0  # the hand log's three kills, a hang and a lighthouse kill cost something
    by_cause = analysis.badput_vocabularies(result)
    assert sorted(by_cause["cause"]) == sorted(analysis.BADPUT_PARTS)
    assert math.isclose(by_cause["seconds"].sum(), total, rel_tol=1e-12)
    assert math.isclose(by_cause["share"].sum(), 1.0, rel_tol=1e-12)
    by_type = analysis.badput_by_type(result)
    assert list(by_type.index) == LIBRARY_BADPUT_TYPES
    assert math.isclose(by_type["seconds"].sum(), total, rel_tol=1e-12)
    assert by_type["seconds"].astype(bool).sum() >= 3  # spread over several types, not lumped in one


@pytest.mark.parametrize("cause", analysis.BADPUT_PARTS)
def test_each_workbench_cause_lands_in_exactly_one_library_type(cause):
    result = {"badput_s": {c: (7.0 if c == cause else 0.0) for c in analysis.BADPUT_PARTS}}
    by_type = analysis.badput_by_type(result)
    landed = by_type[by_type["seconds"] != 0]
    assert len(landed) == 1 and landed["seconds"].iloc[0] == 7.0
    assert landed.index[0] in LIBRARY_BADPUT_TYPES and landed["causes"].iloc[0].split(", ").count(cause) == 1


def test_the_library_types_the_workbench_has_no_cause_for_are_listed_empty():
    by_type = analysis.badput_by_type({"badput_s": {c: 1.0 for c in analysis.BADPUT_PARTS}})
    for name in (
        "TPU_INITIALIZATION",
        "TRAINING_PREP",
        "DATA_LOADING_SYNC",
        "DATA_LOADING_ASYNC",
        "CUSTOM_BADPUT_EVENTS",
    ):
        assert by_type.loc[name, "seconds"] == 0.0 and by_type.loc[name, "causes"] == ""
    assert set(by_type.loc["PROGRAM_STARTUP", "causes"].split(", ")) == {"startup", "restart"}
