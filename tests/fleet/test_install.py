"""The production pages, run as written on the fleet's hosts: the install page's commands (the fleet
installs and starts every host with them; here its checks), and the scaling page's way to change a role's
count on a host."""

from __future__ import annotations

import re

import pytest

from kits.fleet import ROOT, page_blocks
from helpers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
SCALING = ROOT / "docs" / "operations" / "scaling.md"


def test_every_host_runs_the_install_pages_checks(fleet):
    (code,) = page_blocks(ROOT / "docs" / "operations" / "host-install.md", "check")
    for host in fleet.chronos:
        out = fleet.hosts.on(host, code).stdout
        assert re.search(r"^consumer:consumer_00\s+RUNNING", out, re.M), out
        assert re.search(r"^firer:firer_00\s+RUNNING", out, re.M), out
        assert re.search(r"^detector:detector_00\s+RUNNING", out, re.M), out
        assert "waiting" in out  # chronos status


def test_a_message_through_a_host_with_the_install_pages_commands(fleet):
    (code,) = page_blocks(ROOT / "docs" / "operations" / "host-install.md", "message")
    done = fleet.hosts.on(fleet.chronos[1], fleet.hosts.chronos_function() + code, timeout=90)
    assert "key='hello' value='world'" in done.stdout, done.stdout + done.stderr
    assert '"status":"ok"' in done.stdout.replace(" ", "") and '"role":"firer"' in done.stdout.replace(" ", "")


def test_a_roles_count_on_a_host_changes_as_the_scaling_page_says(fleet):
    """Firers to 0 on one host and back to 1, with the page's commands: supervisord reads the counts when
    it starts, so the page changes the environment file and restarts it; the other host fires meanwhile."""
    host = fleet.chronos[0]
    to_zero, back = page_blocks(SCALING, "scale")
    fleet.hosts.on(host, fleet.hosts.chronos_function() + to_zero)
    assert host.supervisord is not None
    assert host.supervisord.wait(60) == 0  # the page's shutdown ends the supervisord the start block ran
    host.counts["firer"] = 0
    fleet.hosts.start(host)
    fleet.hosts.wait_started(host)
    status = fleet.hosts.supervisorctl(host, "status", check=False)
    assert "firer" not in status and "consumer:consumer_00" in status, status
    fleet.hosts.on(host, fleet.hosts.chronos_function() + back)
    assert host.supervisord.wait(60) == 0
    host.counts["firer"] = 1
    fleet.hosts.start(host)
    fleet.hosts.wait_started(host)
    wait_for(lambda: re.search(r"^firer:firer_00\s+RUNNING", fleet.hosts.supervisorctl(host, "status", check=False), re.M),
             timeout=30, what="the firer back")


def test_the_restore_pages_stop_rewind_start_and_the_upgrade_pages_restart_run_as_written(fleet):
    """Stop all on every host, the consumer group moved back by `chronos rewind`, start all (Backups and
    restore); a role's restart (Upgrades)."""
    ops = ROOT / "docs" / "operations"
    (stop,) = page_blocks(ops / "backups.md", "backup stop")
    (rewind,) = page_blocks(ops / "backups.md", "backup rewind")
    (start,) = page_blocks(ops / "backups.md", "backup start")
    (restart,) = page_blocks(ops / "upgrading.md", "restart role")
    for host in fleet.chronos:
        fleet.hosts.leave_group_one_at_a_time(host)  # the embedded broker's need, not the page's
        fleet.hosts.on(host, fleet.hosts.chronos_function() + stop)
        status = fleet.hosts.supervisorctl(host, "status", check=False)
        assert len(re.findall(r"\bSTOPPED\b", status)) == 3, status
    host = fleet.chronos[1]
    # the input topic is younger than the page's moment: every partition goes back to its start
    moved = fleet.hosts.on(host, fleet.hosts.chronos_function() + rewind, timeout=120).stdout
    assert moved.startswith("group chronos on chronos.input moved to 2026-11-26T06:14:13Z:"), moved
    partitions = re.findall(r"^  partition (\d+): (\S+) -> (\d+)$", moved, re.M)
    assert partitions and all(now == "0" for _, _, now in partitions), moved
    assert any(was not in ("-", "0") for _, was, _ in partitions), moved  # the messages sent before were read
    firer_starts = host.log("firer_00").count("starting: node")
    for h in fleet.chronos:
        fleet.hosts.on(h, fleet.hosts.chronos_function() + start, timeout=90)
    for h in fleet.chronos:
        wait_for(lambda: len(re.findall(r"\bRUNNING\b", fleet.hosts.supervisorctl(h, "status", check=False))) == 3,
                 timeout=30, what="every program running again")
    wait_for(lambda: host.log("firer_00").count("starting: node") == firer_starts + 1, timeout=30,
             what="the firer started again")
    fleet.hosts.on(host, fleet.hosts.chronos_function() + restart)
    wait_for(lambda: host.log("firer_00").count("starting: node") == firer_starts + 2, timeout=30,
             what="the firer restarted")
