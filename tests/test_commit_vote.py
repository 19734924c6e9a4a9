"""The in-process commit vote of a one-rank group is the answer torchft's own server gives.

``trainers/commit_vote.py`` skips the gRPC round trip of ``should_commit`` for a
torchft-lite group. This asks a real torchft ManagerServer of a one-rank group
(with a real lighthouse) the same votes, in an order a training loop can
produce (a step voted down, the same step again, a heal's jump ahead), and
checks that both answer alike: if a torchft release made the server's vote
depend on anything else (the step, an earlier round), this fails.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from workbench.trainers.torchft.commit_vote import LocalVoteClient, install


def test_local_vote_answers_as_torchfts_server_for_one_rank():
    from torchft._torchft import LighthouseServer, ManagerClient, ManagerServer

    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1)
    server = None
    try:
        server = ManagerServer(
            replica_id="replica_0",
            lighthouse_addr=lighthouse.address(),
            hostname="127.0.0.1",
            bind="127.0.0.1:0",
            store_addr="127.0.0.1:1",
            world_size=1,
            heartbeat_interval=timedelta(milliseconds=100),
            connect_timeout=timedelta(seconds=10),
            quorum_retries=0,
        )
        client = ManagerClient(server.address(), connect_timeout=timedelta(seconds=10))
        local = LocalVoteClient(client)
        timeout = timedelta(seconds=10)
        rounds = [(0, True), (1, True), (2, False), (2, True), (3, False), (40, True), (41, True)]
        server_says = [client.should_commit(0, step, vote, timeout) for step, vote in rounds]
        local_says = [local.should_commit(0, step, vote, timeout) for step, vote in rounds]
        assert server_says == [vote for _, vote in rounds]
        assert local_says == server_says
    finally:
        if server is not None:
            server.shutdown()
        lighthouse.shutdown()


def test_a_group_of_more_than_one_rank_keeps_torchfts_vote():
    class Manager:
        _client = object()

    manager = Manager()
    with pytest.raises(ValueError, match="one rank, not 2"):
        install(manager, world_size=2)
    install(manager, world_size=1)
    assert isinstance(manager._client, LocalVoteClient)
