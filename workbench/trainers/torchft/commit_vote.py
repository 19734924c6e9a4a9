"""The commit vote of a replica group of one rank, answered in process.

torchft's ``Manager.should_commit`` sends the rank's vote to its group's
ManagerServer over gRPC, and the server answers once every rank of the group
has voted: commit iff none voted no. It has no other effect: the server keeps
only the votes of the round in progress (torchft ``src/manager.rs``,
``should_commit``; the step is not checked). The vote across replica groups
is not this one: a group whose peer died learns it from its failed all-reduce
(``Manager.report_error``) and votes no itself.

A torchft-lite group has one rank, so the server's answer is that rank's own
vote, after a round trip through two tokio runtimes on loopback: 1.09 ms of a
25 ms step (median, 3 groups on this 2-core machine; ``bench/stepcost.py``'s
``commit_vote`` phase), about 4 % of the step on the critical path of every
group. ``LocalVoteClient`` answers it in process; ``torchft.local_commit_vote:
false`` keeps torchft's round trip. Measured paired (bench/stepcost.py, 5
repetitions of 16 s, 3 groups, fault-free, load 1.5-3.8): the phase fell to
0.26 ms, samples/s rose by 5.2 % (median; pairs 3.5, -2.6, 5.2, 5.4, 6.4 %)
and CPU per group-step fell by 4.7 %. In a full ``make bench`` at load
2.9-3.9 the same pairs read 0.2 % (-11.6, 25.3, -5.5, 0.2, 7.3 %; the phase
0.27 ms): there the saving is within the machine's noise.
``Manager.should_commit`` still computes the vote (participants, errors,
a pending heal) and logs the commit record as before.
"""

from __future__ import annotations

from workbench.trainers.compat import torchft_compat


class LocalVoteClient:
    """Wraps a Manager's ManagerClient; ``should_commit`` returns the rank's own vote."""

    def __init__(self, client) -> None:
        self._client = client

    def should_commit(self, rank: int, step: int, should_commit: bool, timeout=None) -> bool:
        return bool(should_commit)

    def __getattr__(self, name):
        return getattr(self._client, name)


def install(manager, world_size: int) -> None:
    if world_size != 1:
        raise ValueError(f"a local commit vote is only the group's vote with one rank, not {world_size}")
    torchft_compat.replace_client(manager, LocalVoteClient)
