"""A replicated PostgreSQL (etcd and two Patroni members, synchronous replication) per test module.

Starting one takes several seconds, so the tests of a module share it; each test gets it healthy again
(every member running, a leader, a synchronous standby that streams), whatever the test before did to
it. Needs `make patroni` (Debian's etcd, the Patroni virtual environment); without it the tests fail
with that hint.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from chronos.embedded.patroni import ReplicatedPostgres
from chronos.runtime import orphans


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicatedPostgres]:
    """The module's cluster (fsync off); once it stops, nothing of it may still run."""
    workdir = tmp_path_factory.mktemp("ha")
    kit = ReplicatedPostgres(workdir, members=2, fast=True)
    kit.start()
    yield kit
    kit.stop()
    left = orphans.leftovers(workdir)
    assert not left, f"processes of the cluster outlive its stop: {', '.join(map(str, left))}"


@pytest.fixture
def cluster(replicated: ReplicatedPostgres) -> ReplicatedPostgres:
    """The module's cluster, healthy: hung members thawed, dead ones started, a synchronous standby streaming."""
    for member in replicated.members:
        replicated.thaw(member.name)
        if member.patroni_pid is None:
            replicated.restart(member.name)
    replicated.wait_sync_standby(timeout=60)
    return replicated
