"""Metrics, health and status rendering: pure logic, no I/O (the HTTP side is in tests/e2e/test_operating.py)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.exposition import generate_latest

from chronos import logs

from chronos.ops import status
from chronos.telemetry import endpoints
from chronos.telemetry import metrics as telemetry
from chronos.telemetry.health import Health
from chronos.config import Settings
from chronos.errors import ConfigError
from chronos.domain.model import NodeLoad, Overview

NODE = uuid.UUID("6f1c0d3e-8d0e-4c43-9a55-1f0b8c3a2e71")


def samples(t: telemetry.Telemetry) -> dict[tuple[str, frozenset], float]:
    text = generate_latest(t.registry).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(t: telemetry.Telemetry, name: str, **labels: str) -> float:
    want = {"role": t.role, "node": t.node, **labels}
    return samples(t)[(name, frozenset(want.items()))]


# -- ports ---------------------------------------------------------------------------------------


def test_metrics_port_off_plain_and_under_supervisord():
    assert endpoints.metrics_port("firer", 0, {"CHRONOS_PROCESS_NUM": "3"}) == 0
    assert endpoints.metrics_port("firer", 9400, {}) == 9400
    assert endpoints.metrics_port("consumer", 9400, {"CHRONOS_PROCESS_NUM": "0"}) == 9400
    assert endpoints.metrics_port("consumer", 9400, {"CHRONOS_PROCESS_NUM": "1"}) == 9401
    assert endpoints.metrics_port("firer", 9400, {"CHRONOS_PROCESS_NUM": "0"}) == 9500
    assert endpoints.metrics_port("detector", 9400, {"CHRONOS_PROCESS_NUM": "2"}) == 9602


def test_metrics_port_errors():
    with pytest.raises(ConfigError, match="PROCESS_NUM"):
        endpoints.metrics_port("firer", 9400, {"CHRONOS_PROCESS_NUM": "x"})
    with pytest.raises(ConfigError, match="65535"):
        endpoints.metrics_port("detector", 65400, {"CHRONOS_PROCESS_NUM": "0"})


# -- health --------------------------------------------------------------------------------------


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_health_passes_while_starting_then_fails_on_the_stale_check_with_its_reason():
    clock = Clock()
    health = Health(10.0, clock=clock)
    seen = {"loop": 0.0, "postgres": 0.0}
    health.watch("loop", lambda: seen["loop"])
    health.watch("postgres", lambda: seen["postgres"], detail=lambda: "connection refused")
    ok, report = health.report()
    assert ok and report["status"] == "ok" and report["reason"] is None  # nothing yet, but just started

    clock.now += 5
    seen["loop"] = seen["postgres"] = clock.now
    clock.now += 9
    assert health.report()[0]

    clock.now += 2  # postgres last ok 11 s ago
    seen["loop"] = clock.now
    ok, report = health.report()
    assert not ok and report["status"] == "unhealthy"
    assert report["checks"]["loop"] == {"ok": True, "age_s": 0.0}
    assert report["checks"]["postgres"]["ok"] is False
    assert report["checks"]["postgres"]["error"] == "connection refused"
    assert report["reason"] == "postgres: last ok 11.0s ago (window 10s): connection refused"


def test_health_never_ok_after_the_window_fails():
    clock = Clock()
    health = Health(2.0, clock=clock)
    health.watch("kafka", lambda: 0.0)
    clock.now += 3
    ok, report = health.report()
    assert not ok and report["reason"] == "kafka: never ok in 3.0s (window 2s)"


def test_check_with_its_own_window():
    clock = Clock()
    health = Health(2.0, clock=clock)
    health.watch("loop", lambda: 1000.0, window_s=30.0)
    clock.now += 20
    assert health.report()[0]


def test_liveness_reports_the_processs_own_loop_alone():
    """/livez fails only when the loop stopped beating: PostgreSQL out of reach fails /healthz, not /livez."""
    t = telemetry.FirerTelemetry(NODE, Settings())
    t.health.watch("postgres", lambda: 0.0)
    t.health.clock = lambda: t.health.started + 60.0
    t.last_loop = t.health.started + 59.0
    assert not t.health_report()[0]
    ok, report = t.liveness_report()
    assert ok and set(report["checks"]) == {"loop"} and report["role"] == "firer" and report["node"] == str(NODE)
    t.last_loop = t.health.started + 45.0  # stuck for 15 s, past its 10 s window
    ok, report = t.liveness_report()
    assert not ok and report["reason"] == "loop: last ok 15.0s ago (window 10s)"


def test_loop_window_follows_a_slow_detector():
    t = telemetry.DetectorTelemetry(NODE, Settings(failure_detection_interval_ms=20000))
    window, _, _ = t.health.checks["loop"]
    assert window == 60.0
    assert telemetry.FirerTelemetry(NODE, Settings()).health.checks["loop"][0] == 10.0


# -- metrics -------------------------------------------------------------------------------------


def test_consumer_counters_are_its_running_totals_read_at_scrape_time():
    t = telemetry.ConsumerTelemetry(NODE, Settings())
    stats = {"consumed": 0, "enqueued": 0, "late": 0, "duplicates": 0}
    t.follow(lambda: stats)
    assert value(t, "chronos_messages_consumed_total") == 0
    stats.update(consumed=10, enqueued=7, late=2, duplicates=1)
    assert value(t, "chronos_messages_consumed_total") == 10
    assert value(t, "chronos_messages_enqueued_total") == 7
    assert value(t, "chronos_messages_fired_total") == 2
    assert value(t, "chronos_messages_duplicate_total") == 1
    assert value(t, "chronos_messages_cancelled_total") == 0  # a total the process does not keep reads 0
    stats.update(cancelled=3, cancelled_in_flight=1)
    assert value(t, "chronos_messages_cancelled_total") == 3
    assert value(t, "chronos_messages_cancelled_in_flight_total") == 1


def test_dead_lettered_by_reason_code_known_reasons_start_at_zero():
    t = telemetry.ConsumerTelemetry(NODE, Settings())
    assert value(t, "chronos_messages_dead_lettered_total", reason="too_late") == 0
    t.dead_lettered(["missing_deadline: no chronosDeadline header", "bad_deadline: 'x'", "bad_deadline: 'y'",
                     "new_reason"])
    assert value(t, "chronos_messages_dead_lettered_total", reason="missing_deadline") == 1
    assert value(t, "chronos_messages_dead_lettered_total", reason="bad_deadline") == 2
    assert value(t, "chronos_messages_dead_lettered_total", reason="new_reason") == 1


def test_batch_histograms_by_step():
    t = telemetry.FirerTelemetry(NODE, Settings())
    t.batch("claim", 120, 0.004)
    t.batch("claim", 0, 0.001)
    assert value(t, "chronos_batch_size_count", step="claim") == 2
    assert value(t, "chronos_batch_size_sum", step="claim") == 120
    assert value(t, "chronos_batch_size_bucket", step="claim", le="0.0") == 1
    assert value(t, "chronos_batch_duration_seconds_sum", step="claim") == pytest.approx(0.005)
    assert value(t, "chronos_batch_duration_seconds_count", step="delete") == 0
    assert value(t, "chronos_batch_duration_max_seconds", step="claim") == pytest.approx(0.004)
    assert value(t, "chronos_batch_duration_max_seconds", step="delete") == 0
    with pytest.raises(KeyError):
        t.batch("insert", 1, 0.1)  # not a firer step


def test_firer_lateness_and_timing_gauges():
    class Timing:
        latency, offset_us = 0.004, -1500

    t = telemetry.FirerTelemetry(NODE, Settings())
    held = [1, 2, 3]
    t.follow_timing(lambda: len(held), Timing())
    t.lateness.observe(-0.01)
    t.lateness.observe(0.003)
    assert value(t, "chronos_fire_lateness_seconds_count") == 2
    assert value(t, "chronos_fire_lateness_seconds_bucket", le="-0.01") == 1
    assert value(t, "chronos_fire_lateness_seconds_bucket", le="0.005") == 2
    assert value(t, "chronos_firer_outstanding_rows") == 3
    assert value(t, "chronos_firer_publish_latency_seconds") == 0.004
    assert value(t, "chronos_firer_clock_offset_seconds") == -0.0015


def test_roles_export_only_their_own_metrics_and_an_info_line():
    d = telemetry.DetectorTelemetry(NODE, Settings())
    d.follow(lambda: {"reset": 4})
    names = {name for name, _ in samples(d)}
    assert "chronos_messages_reset_total" in names
    assert "chronos_messages_consumed_total" not in names and "chronos_fire_lateness_seconds_count" not in names
    assert value(d, "chronos_info", version=telemetry.__version__, codec=__import__("chronos.codec").codec.IMPL,
                 psycopg=__import__("psycopg").pq.__impl__) == 1
    assert value(d, "chronos_healthy") == 1
    assert "process_cpu_seconds_total" in names


def _overview(at: datetime, **changes) -> Overview:
    nodes = [NodeLoad(NODE, 3, 1, 7.5, at - timedelta(seconds=2)),
             NodeLoad(uuid.UUID(int=1), 1, 0, 0.2, at + timedelta(seconds=1))]
    args = dict(at=at, first=at - timedelta(seconds=0.5), next_deadline=at + timedelta(seconds=90), waiting=12,
                estimate=-1, due=2, nodes=nodes, schedules=None)
    args.update(changes)
    return Overview.build(**args)


def test_overview_totals_and_oldest_overdue_covers_claimed_rows():
    at = datetime(2026, 11, 21, 9, 0, 5, tzinfo=timezone.utc)
    view = _overview(at)
    assert (view.waiting, view.waiting_estimated, view.in_flight, view.past_hold_time) == (12, False, 4, 1)
    assert view.oldest_overdue_s == 2.0  # a claimed row two seconds past its deadline
    assert _overview(at, first=None, nodes=[]).oldest_overdue_s is None


def test_overview_estimate_leaves_out_in_flight_rows_and_schedules():
    at = datetime(2026, 11, 21, 9, 0, 5, tzinfo=timezone.utc)
    view = _overview(at, waiting=None, estimate=2_000_000, schedules=6)
    assert view.waiting_estimated and view.waiting == 2_000_000 - 4 - 6


def test_detector_gauges_from_an_overview():
    at = datetime(2026, 11, 21, 9, 0, 5, tzinfo=timezone.utc)
    d = telemetry.DetectorTelemetry(NODE, Settings())
    d.store_gauges(_overview(at, schedules=2))
    assert value(d, "chronos_rows_waiting") == 12
    assert value(d, "chronos_rows_due") == 2
    assert value(d, "chronos_rows_in_flight") == 4
    assert value(d, "chronos_rows_past_hold_time") == 1
    assert value(d, "chronos_oldest_overdue_seconds") == 2.0
    assert value(d, "chronos_recurring_schedules") == 2


# -- status --------------------------------------------------------------------------------------


def test_status_json_and_text():
    at = datetime(2026, 11, 21, 9, 0, 5, 4000, tzinfo=timezone.utc)
    d = status.to_dict(_overview(at, schedules=2), 5000)
    assert orjson.loads(orjson.dumps(d)) == d
    assert d["at"] == "2026-11-21T09:00:05.004Z"
    assert d["in_flight_by_node"][0] == {"node": str(NODE), "rows": 3, "past_hold_time": 1, "held_for_s": 7.5}
    assert (d["waiting"], d["due_now"], d["in_flight"], d["past_hold_time"], d["recurring_schedules"]) == \
        (12, 2, 4, 1, 2)
    assert d["next_deadline"] == "2026-11-21T09:01:35.004Z" and d["next_deadline_in_s"] == 90.0
    text = status.render(d)
    assert "waiting                         12" in text
    assert "due now                          2   not claimed yet" in text
    assert "  firer 6f1c0d3e                 3   held up to 7.500s, 1 past the hold time" in text
    assert "oldest overdue              2.000s   late, not fired yet" in text
    assert "next deadline              in 1.5m   2026-11-21T09:01:35.004Z" in text
    empty = status.to_dict(_overview(at, first=None, next_deadline=None, nodes=[], waiting=0, due=0), 5000)
    assert "recurring schedules              -" in status.render(empty)
    assert "oldest overdue                   -" in status.render(empty)


# -- logs ----------------------------------------------------------------------------------------


def test_json_formatter_one_object_per_line_with_role_and_node():
    import logging
    record = logging.LogRecord("chronos.firer", logging.WARNING, __file__, 1, "held %d rows\nsecond line", (3,),
                               None)
    line = logs.JsonFormatter("firer", str(NODE)).format(record)
    assert "\n" not in line
    entry = orjson.loads(line)
    assert (entry["level"], entry["role"], entry["node"], entry["msg"]) == \
        ("warning", "firer", str(NODE), "held 3 rows\nsecond line")


def test_repeat_filter_lets_one_of_a_kind_through_then_counts():
    import logging
    quiet = logs.RepeatFilter(interval=3600)

    def record(fac: str) -> logging.LogRecord:
        return logging.LogRecord("chronos.librdkafka", logging.ERROR, __file__, 1, "%s [%s] %s",
                                 (fac, "rdkafka#producer-1", "Connect failed"), None)

    assert quiet.filter(record("FAIL"))
    assert not quiet.filter(record("FAIL"))
    assert quiet.filter(record("ERROR"))  # another kind
    chatty = logs.RepeatFilter(interval=0)
    chatty.suppressed[(logging.ERROR, "FAIL")] = 4
    again = record("FAIL")
    assert chatty.filter(again) and again.getMessage().endswith("(and 4 more like it)")


def test_parked_messages_in_status_and_the_detector_gauge():
    at = datetime(2026, 11, 21, 9, 0, 5, tzinfo=timezone.utc)
    d = status.to_dict(_overview(at, parked=3), 5000)
    assert d["parked"] == 3
    assert "parked                           3   kept in chronos_parked: see chronos parked list" in \
        status.render(d)
    assert "parked                           -" in status.render(status.to_dict(_overview(at), 5000))
    detector = telemetry.DetectorTelemetry(NODE, Settings())
    detector.store_gauges(_overview(at, parked=3))
    assert value(detector, "chronos_rows_parked") == 3


def test_firer_and_consumer_count_dead_letters_and_parked_messages():
    firer = telemetry.FirerTelemetry(NODE, Settings())
    firer.follow(lambda: {"parked": 2, "retried": 5})
    firer.dead_lettered(["too_large: x", "publish_failed: y", "publish_failed: z"])
    assert value(firer, "chronos_messages_parked_total") == 2
    assert value(firer, "chronos_messages_retried_total") == 5
    assert value(firer, "chronos_messages_dead_lettered_total", reason="publish_failed") == 2
    assert value(firer, "chronos_messages_dead_lettered_total", reason="topic_not_allowed") == 0
    consumer = telemetry.ConsumerTelemetry(NODE, Settings())
    consumer.follow(lambda: {"parked": 1, "forwarded": 4})
    assert value(consumer, "chronos_messages_parked_total") == 1
    assert value(consumer, "chronos_messages_forwarded_total") == 4
    assert value(consumer, "chronos_messages_dead_lettered_total", reason="too_large") == 0


# -- the embedded broker -------------------------------------------------------------------------

BROKER_STATS = {"pid": 321, "port": 9092, "rss_bytes": 3 * 2 ** 30, "messages": 2_160_000, "input_unread": 40,
                "exact": True, "sampled_at": 1795600000.5, "restarts": 2, "lost_input": 75, "last_restart": None,
                "warning_bytes": 2 * 2 ** 30}


def test_detector_exports_the_embedded_broker_from_the_stats_file_of_chronos_up(tmp_path):
    path = tmp_path / "broker-stats.json"
    d = telemetry.DetectorTelemetry(NODE, Settings(), environ={"CHRONOS_EMBEDDED_BROKER_STATS": str(path)})
    assert not any(name.startswith("chronos_embedded_broker") for name, _ in samples(d))  # not written yet
    path.write_bytes(orjson.dumps(BROKER_STATS))
    assert value(d, "chronos_embedded_broker_rss_bytes") == 3 * 2 ** 30
    assert value(d, "chronos_embedded_broker_messages") == 2_160_000
    assert value(d, "chronos_embedded_broker_unread_input_messages") == 40
    assert value(d, "chronos_embedded_broker_memory_warning_bytes") == 2 * 2 ** 30
    assert value(d, "chronos_embedded_broker_sampled_timestamp_seconds") == 1795600000.5
    assert value(d, "chronos_embedded_broker_restarts_total") == 2
    assert value(d, "chronos_embedded_broker_lost_input_messages_total") == 75
    plain = telemetry.DetectorTelemetry(NODE, Settings(), environ={})
    assert not any(name.startswith("chronos_embedded_broker") for name, _ in samples(plain))


def test_status_shows_the_embedded_broker(tmp_path):
    at = datetime(2026, 11, 21, 9, 0, 5, 4000, tzinfo=timezone.utc)
    d = status.to_dict(_overview(at), 5000, broker=BROKER_STATS)
    assert orjson.loads(orjson.dumps(d)) == d
    b = d["embedded_broker"]
    assert (b["rss_bytes"], b["messages"], b["input_unread"], b["restarts"], b["lost_input"]) == \
        (3 * 2 ** 30, 2_160_000, 40, 2, 75)
    text = status.render(d)
    assert "embedded broker         3,072.0 MB   pid 321, memory only, frees no message; ABOVE the warning " \
           "threshold (2,048 MB): plan a restart" in text
    assert "  messages held          2,160,000   all topics; 40 input not read yet (sampled 2026-" in text
    assert "  broker restarts                2   about 75 unread input messages lost with it" in text
    assert status.to_dict(_overview(at), 5000)["embedded_broker"] is None
    assert "embedded broker" not in status.render(status.to_dict(_overview(at), 5000))


def test_status_finds_the_stats_file_through_the_ready_file(tmp_path):
    import argparse
    stats = tmp_path / "broker-stats.json"
    stats.write_bytes(orjson.dumps({**BROKER_STATS, "pid": None}))
    ready = tmp_path / "ready.json"
    ready.write_bytes(orjson.dumps({"broker_stats_file": str(stats)}))
    args = argparse.Namespace(ready_file=str(ready), database_url=None)
    assert status.broker_stats(args, {})["messages"] == 2_160_000
    assert status.broker_stats(argparse.Namespace(ready_file=None, database_url="postgresql://x/y"), {}) is None


def test_postgres_connections_are_exported_per_server_with_their_history():
    from chronos.ports import Link
    t = telemetry.FirerTelemetry(NODE, Settings())
    claim, settle = Link(), Link()
    t.follow_postgres(lambda: [claim, settle])
    assert value(t, "chronos_postgres_connects_total") == 0
    assert not [k for k in samples(t) if k[0] == "chronos_postgres_connected"]
    claim.connected("db1:5432")
    settle.connected("db1:5432")
    assert value(t, "chronos_postgres_connected", server="db1:5432") == 2
    settle.unanswered += 1
    settle.lost()
    assert settle.connected("db2:5432") == "db1:5432"  # the server it replaces
    assert value(t, "chronos_postgres_connected", server="db1:5432") == 1
    assert value(t, "chronos_postgres_connected", server="db2:5432") == 1
    assert (value(t, "chronos_postgres_connects_total"), value(t, "chronos_postgres_server_changes_total"),
            value(t, "chronos_postgres_unanswered_total")) == (3, 1, 1)


# -- the PostgreSQL server each process uses -----------------------------------------------------

FIRER = NODE  # holds 3 rows in _overview
CONSUMER = uuid.UUID("11aa22bb-0000-4000-8000-000000000001")


def _server_view(at: datetime, **changes):
    from chronos.domain.model import ServerView, Sessions, Standby
    args = dict(at=at, server="db1:5432", address="10.0.0.1:5432", in_recovery=False, version="18.1",
                standbys=[Standby("pg2", "10.0.0.2", "streaming", "sync"), Standby("pg3", "10.0.0.3", "streaming",
                                                                                   "async")],
                processes=[Sessions("consumer", str(CONSUMER), 1, ["10.0.0.7"], at - timedelta(minutes=5), True),
                           Sessions("firer", str(FIRER), 2, ["10.0.0.8"], at - timedelta(seconds=30), True)])
    args.update(changes)
    return ServerView(**args)


def _firer_scrape(*servers: str, connects: int = 2, changes: int = 0, unanswered: int = 0) -> str:
    """A firer's real /metrics, its two stores connected to `servers`."""
    from chronos.ports import Link
    t = telemetry.FirerTelemetry(FIRER, Settings())
    links = [Link(), Link()]
    for link, server in zip(links, servers):
        link.connected(server)
    links[0].connects, links[0].server_changes, links[0].unanswered = connects - 1, changes, unanswered
    links[1].connects = 1
    t.follow_postgres(lambda: links)
    return generate_latest(t.registry).decode()


def test_the_connections_a_process_exports_are_read_back_from_its_scrape():
    from chronos.ops import servers
    (r,) = servers.parse(_firer_scrape("db1:5432", "db2:5433", connects=4, changes=1, unanswered=2))
    assert (r.role, r.node, r.servers) == ("firer", str(FIRER), (("db1:5432", 1), ("db2:5433", 1)))
    assert (r.connects, r.connections, r.reconnects, r.server_changes, r.unanswered) == (4, 2, 2, 1, 2)
    assert not r.on("db1:5432")
    (none,) = servers.parse(_firer_scrape())
    assert none.servers == () and not none.on("db1:5432") and none.connections == 0
    assert servers.parse("process_cpu_seconds_total 1.0\n") == ()


def test_status_shows_the_server_its_standbys_and_the_processes_on_it():
    from chronos.ops import servers
    at = datetime(2026, 11, 21, 9, 0, 5, tzinfo=timezone.utc)
    gone = uuid.UUID(int=1)  # holds a row in _overview, has no session on this server
    asked = [servers.Asked("http://h:20100/metrics", True, servers.parse(_firer_scrape("db1:5432", "db1:5432"))),
             servers.Asked("http://h:20000/metrics", True, (servers.Reported("consumer", str(CONSUMER),
                                                                             (("db2:5433", 1),), 3, 1, 1),)),
             servers.Asked("http://h:20200/metrics", True, (servers.Reported("detector", "d" * 36, (), 4),)),
             servers.Asked("http://h:20101/metrics", False),
             servers.Asked("http://h:20102/metrics", True, (servers.Reported("firer", "e" * 36, (("db1:5432", 1),), 1),))]
    d = status.to_dict(_overview(at), 5000, postgres=status.postgres_dict(_server_view(at), _overview(at).by_node,
                                                                          asked))
    assert orjson.loads(orjson.dumps(d)) == d
    p = d["postgres"]
    assert (p["server"], p["address"], p["role"], p["version"]) == ("db1:5432", "10.0.0.1:5432", "primary", "18.1")
    assert p["standbys"][0] == {"name": "pg2", "client": "10.0.0.2", "state": "streaming", "sync_state": "sync"}
    assert p["processes"][1] == {"role": "firer", "node": str(FIRER), "sessions": 2, "clients": ["10.0.0.8"],
                                 "oldest_backend_start": "2026-11-21T08:59:35.000Z", "connected_for_s": 30.0,
                                 "visible": True}
    assert p["firers_not_connected"] == [{"node": str(gone), "rows": 1}]
    assert p["reported"][0] == {"url": "http://h:20100/metrics", "answered": True, "role": "firer", "node": str(FIRER),
                                "servers": {"db1:5432": 2}, "connections": 2, "reconnects": 0, "server_changes": 0,
                                "unanswered": 0, "read_only": 0, "sessions_here": 2, "apart": None}
    assert [(r["sessions_here"], r["apart"]) for r in p["reported"][1:3]] == [(1, "other_server"),
                                                                              (0, "no_connection")]
    assert p["reported"][3] == {"url": "http://h:20101/metrics", "answered": False, "role": None, "node": None}
    text = status.render(d)
    assert "postgres                   primary   db1:5432, PostgreSQL 18.1 (it says it is 10.0.0.1:5432)" in text
    assert "  standbys                       2   pg2 streaming sync; pg3 streaming async" in text
    assert "  chronos sessions               3   2 processes on this server" in text
    assert "    consumer 11aa22bb            1   from 10.0.0.7, connected for 5.0m" in text
    assert "    firer 6f1c0d3e               2   from 10.0.0.8, connected for 30.000s" in text
    assert "    firer 00000000               -   holds 1 row but has no session on this server: connected " \
           "elsewhere, or gone" in text
    assert "  processes report               4   of 5 asked, on their /metrics" in text
    assert "    firer 6f1c0d3e               2   to db1:5432; 0 reconnects, 0 server changes, 0 unanswered" in text
    assert "    consumer 11aa22bb            1   ANOTHER server than this one: db2:5433; 2 reconnects, 1 server " \
           "changes, 1 unanswered" in text
    assert "    detector dddddddd            0   no connection open; 4 reconnects" in text
    assert "    no answer                    -   http://h:20101/metrics" in text
    assert "    firer eeeeeeee               1   no session on this server: another one behind the same address: " \
           "db1:5432; 0 reconnects" in text


def test_status_says_what_a_role_may_not_see_and_when_no_process_is_asked():
    from chronos.domain.model import Sessions, Standby
    at = datetime(2026, 11, 21, 9, 0, 5, tzinfo=timezone.utc)
    view = _server_view(at, standbys=[Standby("pg2", None, None, None)], address=None,
                        processes=[Sessions("firer", str(FIRER), 2, [], None, False)])
    d = status.to_dict(_overview(at), 5000, postgres=status.postgres_dict(view, []))
    assert d["postgres"]["reported"] is None and d["postgres"]["standbys"][0]["state"] is None
    text = status.render(d)
    assert "postgres                   primary   db1:5432, PostgreSQL 18.1\n" in text
    assert "  standbys                       1   their state is not visible to this role (pg_read_all_stats " \
           "shows it)" in text
    assert "    firer 6f1c0d3e               2   another role's: its address and start are not visible to this " \
           "role" in text
    assert "  processes report               -   no /metrics URLs known (no process said in PostgreSQL where it " \
           "serves them, none in CHRONOS_CONSOLE_METRICS_URLS)" in text
    assert "postgres" not in status.render(status.to_dict(_overview(at), 5000))


def test_postgres_is_unreached_from_a_statement_given_up_until_one_is_answered():
    """A hung server fails the health check at the statement's deadline, not a health window later."""
    from types import SimpleNamespace

    from chronos.ports import Link
    claim, settle = SimpleNamespace(last_ok=100.0, link=Link()), SimpleNamespace(last_ok=104.0, link=Link())
    assert telemetry.postgres_reached(claim, settle) == 104.0
    settle.link.unanswered_at = 109.0  # the settler's delete was given up; the claimer has not noticed yet
    assert telemetry.postgres_reached(claim, settle) == 100.0
    claim.link.unanswered_at = 109.5
    assert telemetry.postgres_reached(claim, settle) == 0.0  # neither reached it since: unhealthy now
    settle.last_ok = 112.0  # answered on a new connection
    assert telemetry.postgres_reached(claim, settle) == 112.0


def test_the_detector_exports_every_operator_action_from_zero_the_parked_ones_included():
    """An alert or a dashboard on the parked messages' replays and drops sees them before the first one."""
    d = telemetry.DetectorTelemetry(NODE, Settings())
    d.actions = {"cancel": (2, 5)}
    taken = {s.labels["action"]: s.value for f in text_string_to_metric_families(generate_latest(d.registry).decode())
             if f.name == "chronos_operator_actions" for s in f.samples if s.name.endswith("_total")}
    assert taken == {"cancel": 2.0, "fire_now": 0.0, "reschedule": 0.0, "replay_parked": 0.0, "drop_parked": 0.0}


# -- cells ---------------------------------------------------------------------------------------

CELLS = (("a", "postgresql://db-a/chronos"), ("b", "postgresql://db-b/chronos"))


def test_a_firer_or_detector_of_a_cell_labels_every_series_with_it_and_says_it_in_its_health():
    for role in (telemetry.FirerTelemetry, telemetry.DetectorTelemetry):
        t = role(NODE, Settings(cells=CELLS, cell="b", database_url=CELLS[1][1]))
        text = generate_latest(t.exposed()).decode()
        series = [s for family in text_string_to_metric_families(text) for s in family.samples]
        assert series and all(s.labels.get("cell") == "b" for s in series)
        # as many series as without cells: one label more, no series more
        alone = role(NODE, Settings())
        assert len(series) == len([s for family in text_string_to_metric_families(
            generate_latest(alone.exposed()).decode()) for s in family.samples])
        assert t.health_report()[1]["cell"] == "b" and "cell" not in alone.health_report()[1]
    # without cells, and for a consumer (which serves every cell), no cell label
    consumer = telemetry.ConsumerTelemetry(NODE, Settings(cells=CELLS))
    assert consumer.exposed() is consumer.registry and "cell" not in consumer.health_report()[1]


def test_a_consumer_of_cells_says_which_cell_it_holds_paused_and_each_cells_connections():
    from chronos.ops import servers
    from chronos.ports import Link
    t = telemetry.ConsumerTelemetry(NODE, Settings(cells=CELLS))
    down = {"b"}
    t.follow_cells(["a", "b"], lambda cell: cell in down)
    links = {"a": Link(), "b": Link()}
    links["a"].connected("db-a:5432")
    links["b"].connected("db-b:5432")
    links["b"].unanswered = 2
    t.follow_postgres(lambda: list(links.values()), cells=lambda: {cell: [link] for cell, link in links.items()})
    assert (value(t, "chronos_consumer_cell_paused", cell="a"), value(t, "chronos_consumer_cell_paused", cell="b")) \
        == (0, 1)
    down.clear()
    assert value(t, "chronos_consumer_cell_paused", cell="b") == 0
    assert value(t, "chronos_postgres_unanswered_total", cell="b") == 2
    assert value(t, "chronos_postgres_connected", cell="a", server="db-a:5432") == 1
    # status and the console read a consumer's connections back whole
    (r,) = servers.parse(generate_latest(t.registry).decode())
    assert (r.servers, r.connects, r.unanswered) == ((("db-a:5432", 1), ("db-b:5432", 1)), 2, 2)


def test_a_consumer_of_cells_checks_each_cells_postgresql_for_its_health():
    t = telemetry.ConsumerTelemetry(NODE, Settings(cells=CELLS))
    clock = Clock()
    t.health = Health(10.0, clock=clock)
    t.watch_postgres({"a": lambda: 1000.0, "b": lambda: 1010.0})
    clock.now += 15
    ok, report = t.health_report()
    assert not ok and report["reason"] == "postgres of cell a: last ok 15.0s ago (window 10s)"
    assert report["checks"]["postgres of cell b"] == {"ok": True, "age_s": 5.0}
