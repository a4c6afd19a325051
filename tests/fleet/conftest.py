"""A fleet on this machine (kits/fleet): two Chronos hosts installed from the wheel as
docs/operations/host-install.md says, a replicated PostgreSQL (two Patroni members, etcd on a host of its
own) and the broker, each host a network namespace of its own, partitions as nftables rules.

Installing the package takes half a minute (the hosts' virtual environment is made from the wheel, psycopg's
C implementation from the wheel `make test` built), so the tests of this folder share it; each module has a fleet of its
own, and each test gets it whole again (no cut, a leader, a synchronous standby, every host's supervisord
running). Needs root, `make test`'s tools
(iproute2, nftables, etcd, the Patroni environment); without them the tests fail saying what is missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from kits.fleet import Fleet, install_chronos, require_fleet_tools


@pytest.fixture(scope="package")
def opt_dir(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The hosts' shared /opt/chronos: the package installed by the install page's own commands."""
    require_fleet_tools()
    work = tmp_path_factory.mktemp("fleet-install")
    opt = work / "opt"
    install_chronos(wheel, opt, work)
    return opt


@pytest.fixture(scope="module")
def running_fleet(opt_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A fleet for the tests of one module (a fleet starts in about 15 s once the package is installed);
    once it is closed, nothing of it may still run. One per module, because the embedded broker can lose
    track of a consumer group whose members restart (docs/explanations/embedded-broker.md, behaviour 8):
    the install tests restart the hosts' programs, the partition tests need a group that serves."""
    with Fleet(tmp_path_factory.mktemp("fleet"), opt_dir).serving() as fleet:
        yield fleet


@pytest.fixture
def fleet(running_fleet: Fleet) -> Fleet:
    """The fleet, whole again."""
    running_fleet.heal_everything()
    return running_fleet
