"""Monitoring a fleet as the pages say: each host's Prometheus targets from the monitoring page's
command, run as written on each host, on a fleet whose second host runs no detector."""

from __future__ import annotations

from typing import Iterator

import pytest
import yaml

from kits.fleet import ROOT, Fleet, page_blocks
from kits.stack import http_get

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
MONITORING = ROOT / "docs" / "observability" / "dashboard-and-alerts.md"


@pytest.fixture(scope="module")
def running_fleet(opt_dir, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Two hosts of one process of every role, but no detector on the second: the layout a targets file
    written by hand for every role got wrong."""
    fleet = Fleet(tmp_path_factory.mktemp("fleet"), opt_dir)
    fleet.chronos[1].counts["detector"] = 0
    with fleet.serving() as serving:
        yield serving


def test_each_hosts_targets_are_the_programs_it_runs_and_every_one_answers_the_monitoring_host(fleet):
    (code,) = page_blocks(MONITORING, "targets")
    for host in fleet.chronos:
        # the reader's setting (Security: which ports to open to whom): the address Prometheus reaches the host at
        fleet.hosts.on(host, f"echo 'CHRONOS_METRICS_ADDRESS={host.address}' >> /etc/chronos/env")
        printed = fleet.hosts.on(host, fleet.hosts.chronos_function() + code).stdout
        listed = {(group["labels"]["program"], target) for group in yaml.safe_load(printed)
                  for target in group["targets"]}
        runs = {(program.rsplit("_", 1)[0], f"{host.address}:{host.metrics_port(program)}")
                for program in host.programs()}
        assert listed == runs, printed
        with fleet.net.inside("client"):  # where the fleet's Prometheus runs
            for _, target in sorted(listed):
                status, body = http_get(f"http://{target}/metrics", 5.0)
                assert status == 200 and b"chronos_healthy" in body, target
    assert not any(program == "detector" for program, _ in listed)  # chronos-2's: none listed, none to be down
