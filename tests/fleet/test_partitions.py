"""Real network partitions under load on the fleet (two Chronos hosts, one process of every role each, 300
msg/s): packets dropped silently by nftables, the host on the wrong side running on. Each time nothing
acknowledged is lost or published early, no program needs supervisord to restart it, and what the
scenario is about holds: a promotion that firing follows within seconds, a cut-off host whose work the
other host takes over within the hold time and the group's session timeout, a host that reaches only
Kafka giving up its partitions, the broker's host cut off and firing resuming at the heal.

The cuts here are shorter than the benchmark's 60 s (`python -m benchmarks.fleet`, whose figures
docs/operations/failure-behaviour.md shows), long enough for what they test: a primary's host cut off
past Patroni's TTL, the others past the hold time and the session timeout several times over."""

from __future__ import annotations

import pytest

from kits.fleet.scenarios import host_cut, kafka_cut, primary_cut

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(600)]

RATE = 300
HOLD_S = 5.0              # the hosts' CHRONOS_HOLD_TIME_MS (the default)
SESSION_S = 2.0           # the consumer group's session timeout (the embedded broker's profile)
TAKEOVER_S = HOLD_S + SESSION_S + 4.0  # the other host serves a cut-off host's work within this (and a scrape)
DB_TIMEOUT_S = 5.0        # CHRONOS_DATABASE_TIMEOUT_MS: a write under way when the cut began gives up only then
RESUME_S = 10.0           # firing resumes this soon after the promotion at the latest (the benchmark's target is 5 s)
PUBLISH_AGAIN_S = 5.0     # the firers publish again this soon after the broker's host is back


def verdict(report, row) -> None:
    assert report.lost == [], report.line()
    assert report.early == [], report.line()
    assert report.unexplained == [], (report.line(), report.unexplained[:5])
    assert row["republished_after_heal"] == 0, row
    assert row["restarted_programs"] == {}, row  # every program rode the fault out by itself


def test_the_primarys_host_cut_off_a_standby_takes_over_and_the_old_primary_rejoins(fleet, fault_report):
    standby = fleet.db.sync_standby()
    report, row = primary_cut(fleet, cut_s=32.0, rate=RATE)
    fault_report(report)
    verdict(report, row)
    assert row["new_primary"] == standby  # in synchronous mode only the synchronous standby may take over
    assert row["pause_ended_after_promotion_s"] is not None and row["pause_ended_after_promotion_s"] < RESUME_S, row
    assert row["old_primary_rejoined_after_heal_s"] is not None, row  # demoted, then a standby again


def test_a_chronos_host_cut_off_its_work_goes_to_the_other_and_it_rejoins(fleet, fault_report):
    report, row = host_cut(fleet, cut_s=15.0, rate=RATE, peers="all")
    fault_report(report)
    verdict(report, row)
    # its partitions (the group) and its claimed rows (the detector) served by the other host in time
    assert row["max_lateness_during_fault_s"] < TAKEOVER_S, row
    # the one alert rule that sees a host nobody can scrape (its programs' own health is missing, not failing)
    assert "pending" in (row["alerts"] or {}).get("ChronosTargetDown", {}), row["alerts"]
    health = row["health"]
    for program in ("consumer_00", "firer_00", "detector_00"):
        changes = health[f"chronos-1/{program}"]
        assert changes[0][1] == "unreachable" and changes[-1][1] == "ok", (program, changes)  # back by itself


def test_the_kafka_host_cut_off_firing_resumes_at_the_heal(fleet, fault_report):
    report, row = kafka_cut(fleet, cut_s=14.0, rate=RATE)
    fault_report(report)
    verdict(report, row)
    # the firers publish again as soon as the broker is back (0.04 s in the runs measured); the reader's own
    # deliveries resume only when its client has reconnected (13.4-13.7 s after a 14 s cut), so they bound nothing
    assert row["published_again_after_heal_s"] is not None and row["published_again_after_heal_s"] < PUBLISH_AGAIN_S, row
    for host in ("chronos-1", "chronos-2"):
        words = [word for _, word in row["health"][f"{host}/firer_00"]]
        assert any("kafka" in word for word in words) and words[-1] == "ok", (host, words)  # loud, then well


def test_a_chronos_host_cut_off_from_postgresql_gives_up_its_partitions(fleet, fault_report):
    """Kafka still reachable: its consumer, unable to store anything, leaves the group once the hold time
    is over (and the write under way has given up), since the other host's consumer commits: that one
    takes its partitions; it rejoins after the heal."""
    report, row = host_cut(fleet, cut_s=20.0, rate=RATE, peers="db")
    fault_report(report)
    verdict(report, row)
    assert row["max_lateness_during_fault_s"] < TAKEOVER_S + DB_TIMEOUT_S, row  # was the whole cut
    signs = row["first_log_lines"]
    assert signs["left consumer group"][1] == "chronos-1/consumer_00", signs
    assert "rejoining consumer group" in signs, signs
    words = [word for _, word in row["health"]["chronos-1/consumer_00"]]
    assert "failing: postgres" in words and words[-1] == "ok", words  # says what it cannot reach
