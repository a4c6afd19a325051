"""Chronos under load on the replicated PostgreSQL, two processes of every role (`chronos up` with the
cluster's multi-host URL), through the failures production meets: the primary's node dies, a planned
switchover, the primary hangs past Patroni's TTL and comes back. Each time: nothing acknowledged is lost
or published early, firing resumes within seconds of the new primary's promotion (a hung primary
included: every statement has a deadline), and no process needs supervisord to restart it.
The figures of every scenario, with the standby's death, the whole cluster down and a frozen firer,
come from `python -m benchmarks.ha` (docs/operations/postgresql-ha.md)."""

from __future__ import annotations

import time

import pytest

from kits.faults import Scenario
from kits.verdicts import Report, resumed
from kits.stack import layout_args
from helpers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.faults]

RATE = 200          # messages per second
RESUME_S = 10.0     # firing resumes this soon after the promotion at the latest (the benchmark's target is 5 s)
PROGRAMS = ("consumer_00", "consumer_01", "firer_00", "firer_01", "detector_00", "detector_01")


def scenario(name: str, tmp_path, cluster) -> Scenario:
    return Scenario(name, tmp_path / "stack", *layout_args(2, 2, 2), "--database-url", cluster.url, "--no-console",
                    rate=RATE, hold_s=5.0)


def connected(sc: Scenario) -> None:
    """Wait for every process to be at work on the primary (the fault is to happen to the server they use:
    on a busy machine Patroni itself may still be electing the first leader when the stack starts)."""
    at_work = ("firing from the store", "consuming ", "watching for rows")
    wait_for(lambda: all(any(line in sc.stack.log(name) for line in at_work) for name in PROGRAMS), 90,
             "every process connected to the primary")


def check(sc: Scenario, report: Report, fault_at: float, promoted_at: float) -> float:
    """The verdict every scenario shares; returns when firing resumed."""
    assert report.lost == [], report.line()
    assert report.early == [], report.line()
    assert report.unexplained == [], report.line()
    resume, _ = resumed(sc, fault_at)
    assert resume is not None, report.line()
    assert resume - promoted_at < RESUME_S, (resume - promoted_at, report.line())
    for name in PROGRAMS:  # every process rode the fault out by itself
        log = sc.stack.log(name)
        assert log.count("starting: node") == 1, (name, log[-3000:])
    return resume


def test_the_primary_node_dies_and_a_standby_takes_over(cluster, tmp_path, fault_report):
    with scenario("HA a: primary's node killed", tmp_path, cluster) as sc:
        time.sleep(4)
        connected(sc)
        old, standby = cluster.wait_leader().name, cluster.wait_sync_standby()
        fault_at = time.time()
        cluster.kill(old)
        new = cluster.wait_leader(not_name=old, timeout=90)
        assert new.name == standby  # in synchronous mode only the synchronous standby may take over
        sc.fault(f"primary {old} killed", fault_at, end=new.at)
        time.sleep(5)
        report = sc.finish(window_explains=True)
        fault_report(report)
        check(sc, report, fault_at, new.at)
        assert any("another server than before" in sc.stack.log(name) for name in PROGRAMS)


def test_a_switchover_moves_the_stack_to_the_new_primary(cluster, tmp_path, fault_report):
    with scenario("HA b: switchover", tmp_path, cluster) as sc:
        time.sleep(4)
        connected(sc)
        old = cluster.wait_leader().name
        fault_at = time.time()
        new = cluster.switchover()
        assert new.name != old
        sc.fault(f"switchover {old} -> {new.name}", fault_at, end=new.at)
        time.sleep(4)
        report = sc.finish(window_explains=True)
        fault_report(report)
        check(sc, report, fault_at, new.at)


def test_a_hung_primary_is_given_up_and_its_writes_after_the_promotion_never_count(cluster, tmp_path, fault_report):
    """The primary's node frozen (SIGSTOP: its connections stay open, nothing answers) for longer than
    Patroni needs to promote the standby, and until firing has resumed on the new primary (a few seconds
    more), then thawed, when Patroni demotes it. Commits the old one took after the promotion never reach
    the new one, and none was acknowledged: nothing is lost."""
    with scenario("HA d: primary hung", tmp_path, cluster) as sc:
        time.sleep(4)
        connected(sc)
        old = cluster.wait_leader().name
        fault_at = time.time()
        cluster.freeze(old)
        new = cluster.wait_leader(not_name=old, timeout=90)
        # nothing is fired while the primary hangs: a delivery after the promotion is firing resumed
        first = wait_for(lambda: min((t for times in list(sc.reader.arrivals.values()) for t in times if t > new.at),
                                     default=None), 90, "firing resumed on the new primary")
        time.sleep(max(0.0, first + 4.0 - time.time()))
        thawed_at = time.time()
        cluster.thaw(old)
        sc.fault(f"primary {old} frozen {thawed_at - fault_at:.0f} s", fault_at, end=thawed_at)
        time.sleep(5)
        report = sc.finish(window_explains=True)
        fault_report(report)
        resume = check(sc, report, fault_at, new.at)
        assert resume < thawed_at - 3, "firing waited for the hung primary to come back"
        logs = "".join(sc.stack.log(name) for name in PROGRAMS)
        assert "did not answer within" in logs, logs[-3000:]
