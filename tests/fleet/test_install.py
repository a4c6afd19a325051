"""The production pages, run as written on the fleet's hosts: the install page's commands (the fleet
installs and starts every host with them; here its checks), and the scaling page's way to change a role's
count on a host."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

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


def _processes() -> dict[int, tuple[bytes, bytes]]:
    """Every process of the machine: pid -> (command line, environment), NUL-separated as /proc gives them."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = ((entry / "cmdline").read_bytes(), (entry / "environ").read_bytes())
            except OSError:
                continue  # ended since the listing
    return found


def test_the_install_pages_function_shows_no_secret_on_any_command_line(fleet):
    """The install page's `chronos` function hands /etc/chronos/env to the command in its environment: while a
    command runs through it, no process of the machine has a secret of the file (the console token, with spaces
    in it) or a database password on its command line, and the command's environment holds the token whole."""
    host = fleet.chronos[0]
    hidden = [s.encode() for s in (fleet.hosts.console_token, fleet.db.passwords["app"], fleet.db.passwords["owner"])]
    command = b"/opt/chronos/venv/bin/chronos\0tail\0--timeout"
    shown, ran = [], {}
    with ThreadPoolExecutor(max_workers=1) as pool:
        done = pool.submit(fleet.hosts.on, host, fleet.hosts.chronos_function() + "chronos tail --timeout 3")
        while not done.done():
            for pid, (cmdline, environ) in _processes().items():
                shown += [(pid, cmdline) for secret in hidden if secret in cmdline]
                if command in cmdline:
                    ran[pid] = environ.split(b"\0")
            wait([done], timeout=0.05)
        done.result()
    assert not shown, shown
    assert ran, "the command was never seen running"
    token = f"CHRONOS_CONSOLE_TOKEN={fleet.hosts.console_token}".encode()
    assert all(token in environ for environ in ran.values()), ran


def test_a_message_through_a_host_with_the_install_pages_commands(fleet):
    (code,) = page_blocks(ROOT / "docs" / "operations" / "host-install.md", "message")
    done = fleet.hosts.on(fleet.chronos[1], fleet.hosts.chronos_function() + code, timeout=90)
    assert "key='hello' value='world'" in done.stdout, done.stdout + done.stderr
    assert '"status":"ok"' in done.stdout.replace(" ", "") and '"role":"firer"' in done.stdout.replace(" ", "")


def test_a_roles_count_on_a_host_changes_as_the_scaling_page_says(fleet):
    """Firers to 0 on one host and back to 1, with the page's commands: supervisord reads the counts when
    it starts, so the page changes the environment file and restarts it through systemd (the host's stand-in
    for it, kits/fleet/hosts.py); the other host fires meanwhile."""
    host = fleet.chronos[0]
    to_zero, back = page_blocks(SCALING, "scale")
    fleet.hosts.run_block(host, to_zero)
    status = fleet.hosts.supervisorctl(host, "status", check=False)
    assert "firer" not in status and "consumer:consumer_00" in status, status
    fleet.hosts.run_block(host, back)
    assert re.search(r"^firer:firer_00\s+RUNNING", fleet.hosts.supervisorctl(host, "status", check=False), re.M)


def test_the_restore_pages_stop_rewind_start_and_the_restarts_of_other_pages_run_as_written(fleet):
    """Stop all on every host, the consumer group moved back by `chronos rewind` to the page's moment, start
    all (Backups and restore); a role's restart (Upgrades); every program's restart (TLS and SASL)."""
    ops = ROOT / "docs" / "operations"
    (stop,) = page_blocks(ops / "backups.md", "backup stop")
    (settings,) = page_blocks(ops / "backups.md", "restore settings")
    (rewind,) = page_blocks(ops / "backups.md", "backup rewind")
    (start,) = page_blocks(ops / "backups.md", "backup start")
    (restart,) = page_blocks(ops / "upgrading.md", "restart role")
    (restart_all,) = page_blocks(ops / "tls-and-sasl.md", "restart host")
    for host in fleet.chronos:
        fleet.hosts.leave_group_one_at_a_time(host)  # the embedded broker's need, not the page's
        fleet.hosts.run_block(host, stop)
        status = fleet.hosts.supervisorctl(host, "status", check=False)
        assert len(re.findall(r"\bSTOPPED\b", status)) == 3, status
    host = fleet.chronos[1]
    # the input topic is younger than the page's moment: every partition goes back to its start
    moved = fleet.hosts.run_block(host, f"{settings}\n{rewind}", timeout=120)
    assert moved.startswith("group chronos on chronos.input moved to 2026-11-26T06:14:13Z:"), moved
    partitions = re.findall(r"^  partition (\d+): (\S+) -> (\d+)$", moved, re.M)
    assert partitions and all(now == "0" for _, _, now in partitions), moved
    assert any(was not in ("-", "0") for _, was, _ in partitions), moved  # the messages sent before were read
    firer_starts = host.log("firer_00").count("starting: node")
    for h in fleet.chronos:
        fleet.hosts.run_block(h, start, timeout=90)
    for h in fleet.chronos:
        wait_for(lambda: len(re.findall(r"\bRUNNING\b", fleet.hosts.supervisorctl(h, "status", check=False))) == 3,
                 timeout=30, what="every program running again")
    wait_for(lambda: host.log("firer_00").count("starting: node") == firer_starts + 1, timeout=30,
             what="the firer started again")
    fleet.hosts.run_block(host, restart)
    wait_for(lambda: host.log("firer_00").count("starting: node") == firer_starts + 2, timeout=30,
             what="the firer restarted")
    consumer_starts = host.log("consumer_00").count("starting: node")
    fleet.hosts.run_block(host, restart_all)
    wait_for(lambda: host.log("firer_00").count("starting: node") == firer_starts + 3
             and host.log("consumer_00").count("starting: node") == consumer_starts + 1, timeout=30,
             what="every program restarted")
