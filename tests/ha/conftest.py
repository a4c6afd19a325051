"""A replicated PostgreSQL (etcd and two Patroni members, synchronous replication) for the tests of this folder.

Starting one takes several seconds, so the tests share it; each test gets it healthy again
(every member running, a leader, a synchronous standby that streams), whatever the test before did to
it. Needs `make patroni` (Debian's etcd, the Patroni virtual environment); without it the tests fail
with that hint.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from chronos.embedded.patroni import ReplicatedPostgres
from chronos.runtime import orphans


@pytest.fixture(scope="package")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicatedPostgres]:
    """The cluster (fsync off); once it stops, nothing of it may still run."""
    workdir = tmp_path_factory.mktemp("ha")
    kit = ReplicatedPostgres(workdir, members=2, fast=True)
    kit.start()
    yield kit
    kit.stop()
    left = orphans.leftovers(workdir)
    assert not left, f"processes of the cluster outlive its stop: {', '.join(map(str, left))}"


@pytest.fixture
def cluster(replicated: ReplicatedPostgres) -> ReplicatedPostgres:
    """The cluster, healthy: hung members thawed, dead ones started, a synchronous standby streaming."""
    replicated.heal(timeout=60)
    return replicated
