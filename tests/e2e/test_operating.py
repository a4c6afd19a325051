"""Operating Chronos: /metrics and /healthz of real processes, `chronos status`, `chronos health`, JSON logs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from datetime import timezone

import orjson
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from prometheus_client.parser import text_string_to_metric_families

from chronos import codec
from chronos.embedded.postgres import EmbeddedPostgres
from chronos.embedded.procs import free_port
from chronos.domain.model import Row
from chronos.adapters.postgres.migrations import migrate
from chronos.adapters.postgres.store import Store
from helpers import Collector, chronos_headers, producer, send
from helpers import wait_for as poll


# -- helpers -------------------------------------------------------------------------------------


def get(url: str, timeout: float = 3.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    status, body = get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    return {(s.name, frozenset((k, v) for k, v in s.labels.items() if k not in ("role", "node"))): s.value
            for family in text_string_to_metric_families(body.decode()) for s in family.samples}


def metric(scraped: dict, name: str, **labels: str) -> float:
    return scraped.get((name, frozenset(labels.items())), 0.0)



def health(port: int) -> tuple[int, dict]:
    try:
        status, body = get(f"http://127.0.0.1:{port}/healthz")
    except (urllib.error.URLError, OSError):
        return 0, {}
    return status, orjson.loads(body)


def run_cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chronos", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def start_with_metrics(processes, role: str, **env: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = processes.start(role, CHRONOS_METRICS_PORT=str(port), **env)
    processes.wait_for_log(proc, f"serving /metrics and /healthz on port {port}")
    return proc, port


@pytest.fixture
def collect(broker, topics):
    c = Collector(broker.bootstrap_servers, [topics["output"], topics["dlq"]])
    yield c
    c.close()


def row(message_id: str, deadline_s: float, value: bytes = b"v") -> Row:
    return Row(message_id, int(deadline_s * 1_000_000), None, b"k", value, codec.encode_headers([]))


def insert(url: str, rows: list[Row]) -> int:
    store = Store(url)
    try:
        return store.insert(rows)
    finally:
        store.close()


# -- metrics ---------------------------------------------------------------------------------------


def test_metrics_move_as_messages_flow(processes, broker, topics, collect, chronos_env):
    url = chronos_env["CHRONOS_DATABASE_URL"]
    _, c_port = start_with_metrics(processes, "consumer")
    _, f_port = start_with_metrics(processes, "firer")
    _, d_port = start_with_metrics(processes, "detector")
    for port in (c_port, f_port, d_port):
        poll(lambda: health(port)[0] == 200, what=f"healthy on {port}")
    before = {port: scrape(port) for port in (c_port, f_port, d_port)}
    assert metric(before[c_port], "chronos_messages_consumed_total") == 0

    # a row a dead firer held for an hour: the detector hands it back, a firer fires it
    with psycopg.connect(url, autocommit=True) as conn:  # claimed from the start: no firer may take it first
        conn.execute("INSERT INTO chronos_messages (id, deadline, readied_at, readied_by, key, value, headers) "
                     "VALUES ('orphan', now() - interval '5 seconds', now() - interval '1 hour', gen_random_uuid(), "
                     "'k', 'v', %s)", (codec.encode_headers([]),))

    p = producer(broker.bootstrap_servers)
    now = time.time()
    for i in range(20):
        send(p, topics["input"], b"k", f"soon-{i}".encode(), chronos_headers(f"soon-{i}", now + 1.0 + i * 0.02))
    for i in range(2):
        send(p, topics["input"], b"k", f"late-{i}".encode(), chronos_headers(f"late-{i}", now - 30))
    for i in range(5):
        send(p, topics["input"], b"k", f"far-{i}".encode(), chronos_headers(f"far-{i}", now + 3600))
    for i in range(3):
        send(p, topics["input"], b"k", b"bad", [("chronosMessageId", f"bad-{i}".encode())])
    p.flush(10)
    collect.until(lambda ms: len(collect.on(topics["output"])) >= 23 and len(collect.on(topics["dlq"])) >= 3)

    def settled():
        now = {port: scrape(port) for port in (c_port, f_port, d_port)}
        fired = metric(now[f_port], "chronos_messages_fired_total") - metric(before[f_port],
                                                                             "chronos_messages_fired_total")
        waiting = metric(now[d_port], "chronos_rows_waiting")
        return now if fired == 21 and waiting == 5 else None

    after = poll(settled, what="firer counted 21 fired and detector saw 5 waiting")

    def delta(port: int, name: str, **labels: str) -> float:
        return metric(after[port], name, **labels) - metric(before[port], name, **labels)

    # consumer
    assert delta(c_port, "chronos_messages_consumed_total") == 30
    assert delta(c_port, "chronos_messages_enqueued_total") == 25
    assert delta(c_port, "chronos_messages_fired_total") == 2  # already late: published directly
    assert delta(c_port, "chronos_messages_dead_lettered_total", reason="missing_deadline") == 3
    assert delta(c_port, "chronos_messages_dead_lettered_total", reason="bad_deadline") == 0
    assert delta(c_port, "chronos_batch_size_sum", step="insert") == 25
    assert delta(c_port, "chronos_batch_duration_seconds_count", step="insert") >= 1
    assert delta(c_port, "chronos_batch_size_sum", step="publish") == 5
    # firer
    assert delta(f_port, "chronos_messages_claimed_total") == 21
    assert delta(f_port, "chronos_fire_lateness_seconds_count") == 21
    # never acknowledged before deadline - timing advance; 20 on time, and the orphan, 5 s late at least
    assert delta(f_port, "chronos_fire_lateness_seconds_bucket", le="-0.05") == 0
    assert delta(f_port, "chronos_fire_lateness_seconds_bucket", le="2.5") == 20
    assert delta(f_port, "chronos_fire_lateness_seconds_bucket", le="+Inf") == 21
    assert delta(f_port, "chronos_batch_size_sum", step="claim") == 21
    assert delta(f_port, "chronos_batch_size_sum", step="publish") == 21
    assert delta(f_port, "chronos_batch_size_sum", step="delete") == 21
    assert delta(f_port, "chronos_batch_duration_seconds_count", step="claim") > 1  # it polls
    assert delta(f_port, "chronos_messages_vanished_total") == 0
    assert metric(after[f_port], "chronos_firer_outstanding_rows") == 0
    assert metric(after[f_port], "chronos_firer_publish_latency_seconds") > 0
    # detector
    assert delta(d_port, "chronos_messages_reset_total") == 1
    assert metric(after[d_port], "chronos_rows_in_flight") == 0
    assert metric(after[d_port], "chronos_rows_due") == 0
    assert metric(after[d_port], "chronos_rows_past_hold_time") == 0
    for port in (c_port, f_port, d_port):
        assert metric(after[port], "chronos_healthy") == 1
    assert get(f"http://127.0.0.1:{f_port}/nothing")[0] == 404


def test_metrics_port_in_use_stops_the_process_with_a_config_error(processes):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        proc = processes.start("detector", CHRONOS_METRICS_PORT=str(taken.getsockname()[1]))
        assert proc.wait(30) == 2
    assert "cannot serve metrics on port" in processes.log_of(proc)


# -- health ----------------------------------------------------------------------------------------


def test_health_fails_when_postgres_stops_and_recovers(processes, tmp_path):
    pg = EmbeddedPostgres(tmp_path / "pg" / "data", port=free_port(), fast=True, log_path=tmp_path / "pg.log")
    pg.start()
    try:
        migrate(pg.url)
        env = {"CHRONOS_DATABASE_URL": pg.url, "CHRONOS_HEALTH_WINDOW_MS": "2000"}
        ports = {role: start_with_metrics(processes, role, **env)[1] for role in ("consumer", "firer", "detector")}
        for role, port in ports.items():
            status, report = poll(lambda: (lambda r: r if r[0] == 200 else None)(health(port)),
                                  what=f"{role} healthy")
            assert report["role"] == role and report["status"] == "ok"
            assert set(report["checks"]) == ({"loop", "postgres"} if role == "detector"
                                             else {"loop", "postgres", "kafka", "publishing"})
        ok = run_cli("health", "--url", f"http://127.0.0.1:{ports['firer']}/healthz")
        assert ok.returncode == 0 and orjson.loads(ok.stdout)["status"] == "ok"
        # every process at once, from the /metrics URLs a ready file names (as `chronos up` writes it)
        ready = tmp_path / "ready.json"
        ready.write_bytes(orjson.dumps({"metrics_urls": [f"http://127.0.0.1:{p}/metrics" for p in ports.values()]}))
        everyone = run_cli("health", "--ready-file", str(ready))
        reports = [orjson.loads(line) for line in everyone.stdout.splitlines()]
        assert everyone.returncode == 0, everyone.stderr
        assert sorted(r["role"] for r in reports) == ["consumer", "detector", "firer"]
        assert {r["status"] for r in reports} == {"ok"} and all(r["url"].endswith("/healthz") for r in reports)

        pg.stop()
        for role, port in ports.items():
            status, report = poll(lambda: (lambda r: r if r[0] == 503 else None)(health(port)),
                                  what=f"{role} unhealthy")
            assert report["status"] == "unhealthy"
            assert report["checks"]["postgres"]["ok"] is False, report
            assert "postgres" in report["reason"]
            assert report["checks"]["loop"]["ok"] is True  # it keeps running and retrying
            # so its liveness holds: a restart would not bring PostgreSQL back
            live, alive = get(f"http://127.0.0.1:{port}/livez")
            assert live == 200 and set(orjson.loads(alive)["checks"]) == {"loop"}, alive
        sick = run_cli("health", "--metrics-port", str(ports["detector"]))
        assert sick.returncode == 1 and "postgres" in orjson.loads(sick.stdout)["reason"]
        urls = ",".join(f"http://127.0.0.1:{p}/metrics" for p in ports.values())
        everyone = run_cli("health", env={"CHRONOS_CONSOLE_METRICS_URLS": urls})
        assert everyone.returncode == 1 and len(everyone.stdout.splitlines()) == 3

        pg.start()
        for role, port in ports.items():
            poll(lambda: health(port)[0] == 200, what=f"{role} healthy again")
    finally:
        processes.stop_all()
        pg.stop()


def test_health_command_without_an_answer_exits_3():
    result = run_cli("health", "--url", f"http://127.0.0.1:{free_port()}/healthz", "--timeout", "1")
    assert result.returncode == 3 and "no answer" in result.stderr
    nobody = ",".join(f"http://127.0.0.1:{free_port()}/metrics" for _ in range(2))
    result = run_cli("health", "--timeout", "1", env={"CHRONOS_CONSOLE_METRICS_URLS": nobody})
    assert result.returncode == 3 and result.stderr.count("no answer") == 2 and result.stdout == ""


# -- status ----------------------------------------------------------------------------------------


def _load_known(url: str) -> dict:
    """9 waiting (3 overdue), 6 in flight on two nodes (4 of them past the hold time), maybe a schedule."""
    fresh_node, dead_node = uuid.uuid4(), uuid.uuid4()
    now = time.time()
    rows = [row(f"future-{i}", now + 3600 * (i + 1)) for i in range(6)]
    rows += [row(f"overdue-{i}", now - 10 * (i + 1)) for i in range(3)]
    rows += [row(f"held-{i}", now + 60) for i in range(2)]
    rows += [row(f"stale-{i}", now + 120) for i in range(4)]
    assert insert(url, rows) == len(rows)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE chronos_messages SET readied_at = now(), readied_by = %s WHERE id LIKE 'held-%%'",
                     (fresh_node,))
        conn.execute("UPDATE chronos_messages SET readied_at = now() - interval '1 hour', readied_by = %s "
                     "WHERE id LIKE 'stale-%%'", (dead_node,))
        has_cron = conn.execute("SELECT EXISTS (SELECT FROM information_schema.columns WHERE "
                                "table_name = 'chronos_messages' AND column_name = 'cron')").fetchone()[0]
        if has_cron:
            insert(url, [row("every-minute", now + 30)])
            conn.execute("UPDATE chronos_messages SET cron = '* * * * *' WHERE id = 'every-minute'")
    return {"fresh": fresh_node, "dead": dead_node, "has_cron": has_cron, "now": now}


HOLD_MS = "600000"  # between the rows held just now and those held an hour ago


def test_status_json_matches_the_store(database_url):
    """The rows held a second ago stay within a hold time of ten minutes however slowly the two commands start;
    those held an hour ago are past it."""
    known = _load_known(database_url)
    result = run_cli("status", "--json", "--hold-time-ms", HOLD_MS, env={"CHRONOS_DATABASE_URL": database_url})
    assert result.returncode == 0, result.stderr
    got = orjson.loads(result.stdout)

    cron = "AND cron IS NULL" if known["has_cron"] else ""
    with psycopg.connect(database_url, autocommit=True) as conn:
        def one(sql: str):
            return conn.execute(sql).fetchone()[0]
        waiting = one(f"SELECT count(*) FROM chronos_messages WHERE readied_at IS NULL {cron}")
        due = one(f"SELECT count(*) FROM chronos_messages WHERE readied_at IS NULL {cron} AND deadline <= now()")
        in_flight = one("SELECT count(*) FROM chronos_messages WHERE readied_at IS NOT NULL")
        past_hold = one("SELECT count(*) FROM chronos_messages WHERE readied_at < now() - interval '600 seconds'")
        oldest = one(f"SELECT extract(epoch FROM now() - min(deadline))::float8 FROM chronos_messages "
                     f"WHERE deadline <= now() {cron}")
        next_deadline = one(f"SELECT min(deadline) FROM chronos_messages WHERE readied_at IS NULL {cron} "
                            f"AND deadline > now()")
    assert (waiting, due, in_flight, past_hold) == (9, 3, 6, 4)  # the load is what the test thinks it is
    assert got["waiting"] == waiting and got["waiting_estimated"] is False
    assert got["due_now"] == due
    assert got["in_flight"] == in_flight
    assert got["past_hold_time"] == past_hold
    assert got["hold_time_ms"] == int(HOLD_MS)
    assert got["in_flight_by_node"][0]["node"] == str(known["dead"])
    assert [(n["rows"], n["past_hold_time"]) for n in got["in_flight_by_node"]] == [(4, 4), (2, 0)]
    assert got["in_flight_by_node"][0]["held_for_s"] >= 3600
    assert abs(got["oldest_overdue_s"] - oldest) < 5 and got["oldest_overdue_s"] >= 30
    assert got["next_deadline"] == next_deadline.astimezone(timezone.utc).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")
    assert 3590 <= got["next_deadline_in_s"] <= 3600
    assert got["recurring_schedules"] == (1 if known["has_cron"] else None)

    text = run_cli("status", "--database-url", database_url, "--hold-time-ms", HOLD_MS)
    assert text.returncode == 0, text.stderr
    assert "waiting                          9" in text.stdout
    assert "past hold time                   4   suspected failures (hold time 600,000 ms)" in text.stdout
    assert f"  firer {str(known['dead'])[:8]}                 4" in text.stdout


@pytest.mark.parametrize("stop_with", [signal.SIGINT, signal.SIGTERM])
def test_status_watch_refreshes_as_json_lines(database_url, stop_with):
    _load_known(database_url)
    # started with SIGINT ignored, as in a shell's background job: Ctrl-C and SIGTERM still end the watch
    proc = subprocess.Popen([sys.executable, "-m", "chronos", "status", "--json", "--watch", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "CHRONOS_DATABASE_URL": database_url},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        first = orjson.loads(proc.stdout.readline())
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("DELETE FROM chronos_messages WHERE id LIKE 'future-%'")
        second = poll(lambda: (lambda d: d if d["waiting"] == 3 else None)(orjson.loads(proc.stdout.readline())),
                      what="a refresh that sees the deletion")
        assert first["waiting"] == 9 and second["due_now"] == 3
    finally:
        proc.send_signal(stop_with)
        _, err = proc.communicate(timeout=30)  # drains the pipes, so a full one cannot block its exit
        assert proc.returncode == 0, err.decode()


def test_status_of_an_unreachable_database_exits_3():
    result = run_cli("status", "--database-url", f"postgresql://postgres@127.0.0.1:{free_port()}/x")
    assert result.returncode == 3 and "cannot connect" in result.stderr


def test_status_shows_the_server_and_which_server_each_process_uses(processes, chronos_env, tmp_path):
    """A consumer and a detector on the store's server, a firer on another (as on an old primary after a
    failover), a firer that died holding rows, and a /metrics URL nobody answers."""
    url = chronos_env["CHRONOS_DATABASE_URL"]
    other = EmbeddedPostgres(tmp_path / "pg2" / "data", port=free_port(), fast=True, log_path=tmp_path / "pg2.log")
    other.start()
    try:
        migrate(other.url)
        ports = {"consumer": start_with_metrics(processes, "consumer")[1],
                 "detector": start_with_metrics(processes, "detector")[1],
                 "firer": start_with_metrics(processes, "firer", CHRONOS_DATABASE_URL=other.url)[1]}
        for role, port in ports.items():  # /healthz passes while starting: wait for the connection itself
            poll(lambda: any(name == "chronos_postgres_connected" for name, _ in scrape(port)),
                 what=f"{role} connected")
        gone = uuid.uuid4()
        assert insert(url, [row(f"held-{i}", time.time() + 60) for i in range(2)]) == 2
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE chronos_messages SET readied_at = now(), readied_by = %s", (gone,))
            version = conn.execute("SHOW server_version").fetchone()[0]
        here, there = f"127.0.0.1:{conninfo_to_dict(url)['port']}", f"127.0.0.1:{other.port}"
        silent = f"http://127.0.0.1:{free_port()}/metrics"
        urls = ",".join([f"http://127.0.0.1:{port}/metrics" for port in ports.values()] + [silent])

        result = run_cli("status", "--json", "--database-url", url, "--console-metrics-urls", urls)
        assert result.returncode == 0, result.stderr
        p = orjson.loads(result.stdout)["postgres"]
        assert (p["server"], p["address"], p["role"], p["version"], p["standbys"]) == \
            (here, here, "primary", version, [])
        assert sorted((s["role"], s["visible"], s["clients"]) for s in p["processes"]) == \
            [("consumer", True, ["127.0.0.1"]), ("detector", True, ["127.0.0.1"])]
        assert p["firers_not_connected"] == [{"node": str(gone), "rows": 2}]
        reported = {r["role"]: r for r in p["reported"] if r["answered"]}
        assert reported["consumer"]["apart"] is None and reported["consumer"]["sessions_here"] >= 1
        assert reported["detector"]["apart"] is None and list(reported["detector"]["servers"]) == [here]
        assert reported["firer"]["apart"] == "other_server" and list(reported["firer"]["servers"]) == [there]
        assert reported["firer"]["sessions_here"] == 0
        assert [r["url"] for r in p["reported"] if not r["answered"]] == [silent]

        text = run_cli("status", "--database-url", url, "--console-metrics-urls", urls)
        assert text.returncode == 0, text.stderr
        lines = text.stdout.splitlines()
        assert f"postgres                   primary   {here}, PostgreSQL {version}" in lines
        assert "  standbys                       0" in lines
        assert f"    firer {str(gone)[:8]}               -   holds 2 rows but has no session on this server: " \
               f"connected elsewhere, or gone" in lines
        firer = next(line for line in lines if line.startswith(f"    firer {reported['firer']['node'][:8]}"))
        assert f"ANOTHER server than this one: {there}; " in firer
        assert f"    no answer                    -   {silent}" in lines
    finally:
        processes.stop_all()
        other.stop()


# -- logs ------------------------------------------------------------------------------------------


def test_json_logs_parse(processes, broker, topics, collect):
    procs = [processes.start(role, CHRONOS_LOG_FORMAT="json") for role in ("consumer", "firer", "detector")]
    for proc in procs:
        processes.wait_for_log(proc, "starting: node")
    p = producer(broker.bootstrap_servers)
    send(p, topics["input"], b"k", b"v", chronos_headers("ok", time.time() + 0.5))
    send(p, topics["input"], b"k", b"bad", [("chronosMessageId", b"bad")])  # a warning line
    p.flush(10)
    collect.until(lambda ms: len(ms) >= 2)
    processes.stop_all()
    for role, proc in zip(("consumer", "firer", "detector"), procs):
        lines = processes.log_of(proc).splitlines()
        assert len(lines) >= 3
        entries = [orjson.loads(line) for line in lines]  # every line is one JSON object
        nodes = {e["node"] for e in entries}
        assert len(nodes) == 1 and uuid.UUID(nodes.pop())
        assert {e["role"] for e in entries} == {role}
        assert all(e["level"] in ("debug", "info", "warning", "error") and e["msg"] and e["ts"] for e in entries)
        assert any(e["msg"].startswith(f"{role} stopped after") for e in entries)
        if role == "consumer":
            assert any(e["level"] == "warning" and "invalid messages sent to" in e["msg"] for e in entries)


def test_json_logs_stay_json_and_quiet_while_kafka_is_down(processes):
    proc = processes.start("firer", CHRONOS_LOG_FORMAT="json",
                           CHRONOS_KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{free_port()}")
    processes.wait_for_log(proc, "kafka unavailable")
    time.sleep(3)  # librdkafka retries every few ms to 1 s: a flood would show in this time
    processes.stop_all()
    entries = [orjson.loads(line) for line in processes.log_of(proc).splitlines()]
    assert sum(1 for e in entries if e["msg"].startswith("kafka unavailable")) == 1
    librdkafka = [e for e in entries if e["logger"] == "chronos.librdkafka"]
    assert 1 <= len(librdkafka) <= 3, librdkafka
