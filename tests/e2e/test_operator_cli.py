"""`chronos show|list|cancel|fire-now|reschedule` against real processes: messages sent on the input
topic, found, acted on, and the effect seen on the output topic and in the detector's metrics."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from chronos.embedded.procs import free_port
from helpers import Collector, chronos_headers, producer, send, wait_for

WEIRD = ["it's", 'say "hi"', "back\\slash", "100%", "naïve-日本-🚀"]


def cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chronos", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60)


def ok(env: dict, *args: str):
    res = cli(env, *args)
    assert res.returncode == 0, res.stdout + res.stderr
    return orjson.loads(res.stdout) if "--json" in args else res.stdout



@pytest.fixture
def stack(processes, chronos_env, broker, topics):
    port = free_port()
    consumer = processes.start("consumer")
    processes.start("firer")
    detector = processes.start("detector", CHRONOS_METRICS_PORT=str(port))
    processes.wait_for_log(consumer, "starting: node")
    processes.wait_for_log(detector, f"serving /metrics and /healthz on port {port}")
    out = Collector(broker.bootstrap_servers, [topics["output"]])
    yield chronos_env, port, out
    out.close()


def action_metric(port: int, action: str) -> tuple[float, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body = response.read().decode()
    found = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            if s.name in ("chronos_operator_actions_total", "chronos_operator_action_messages_total") \
                    and s.labels.get("action") == action:
                found[s.name] = s.value
    return found.get("chronos_operator_actions_total", 0.0), found.get("chronos_operator_action_messages_total", 0.0)


def test_find_and_act_on_waiting_messages(stack, broker, topics):
    env, port, out = stack
    p = producer(broker.bootstrap_servers)
    far = time.time() + 3600
    for i, mid in enumerate(WEIRD):
        send(p, topics["input"], f"key-{i}".encode(), f"value-{i}".encode(),
             chronos_headers(mid, far + i, [("trace", b"t-%d" % i)]))
    for i in range(30):
        send(p, topics["input"], b"bulk", b"b", chronos_headers(f"bulk-{i:02d}", far + 100 + i))
    p.flush(10)
    wait_for(lambda: len(ok(env, "list", "--json", "--limit", "100")["messages"]) == 35, what="35 stored")

    # show: every field, weird ids verbatim
    for i, mid in enumerate(WEIRD):
        shown = ok(env, "show", mid, "--json")
        assert (shown["id"], shown["state"], shown["topic"]) == (mid, "waiting", topics["output"])
        assert shown["key"]["text"] == f"key-{i}" and shown["value_size"] == len(f"value-{i}")
        assert shown["headers"][0] == ["trace", {"text": f"t-{i}", "hex": (b"t-%d" % i).hex()}]
    human = ok(env, "show", WEIRD[1])
    assert "state            waiting" in human and "'trace'" in human

    # list: filters and pages
    assert [m["id"] for m in ok(env, "list", "--json", "--key", "key-2")["messages"]] == [WEIRD[2]]
    assert [m["id"] for m in ok(env, "list", "--json", "--id-prefix", "100")["messages"]] == ["100%"]
    first = ok(env, "list", "--json", "--key", "bulk", "--limit", "20")
    second = ok(env, "list", "--json", "--key", "bulk", "--limit", "20", "--after", first["next"])
    assert [m["id"] for m in first["messages"] + second["messages"]] == [f"bulk-{i:02d}" for i in range(30)]
    assert second["next"] is None
    text = ok(env, "list", "--key", "bulk", "--limit", "5")
    assert "next page: --after " in text and "'bulk-04'" in text

    # fire-now: delivered at once, and counted in the detector's metric
    before = action_metric(port, "fire_now")
    assert ok(env, "fire-now", WEIRD[4], WEIRD[0], "--json")["changed"] == 2
    got = out.until(lambda ms: len(ms) >= 2, timeout=30)
    assert sorted(m.value for m in got) == [b"value-0", b"value-4"]
    assert wait_for(lambda: action_metric(port, "fire_now") == (before[0] + 1, before[1] + 2),
                    what="the detector exported the fire-now")

    # reschedule by filter; then cancel by filter needs --yes above the threshold
    res = ok(env, "reschedule", "--filter", "--key", "bulk", "--delay", "2h", "--json")
    assert res["changed"] == 30
    refused = cli(env, "cancel", "--filter", "--key", "bulk", "--confirm-above", "10")
    # the error in one line, after the note of a search by key without the key-search index (chronos key-search)
    note, error = refused.stderr.strip().splitlines()
    assert refused.returncode == 7 and "--yes" in error and note.startswith("note: the database has no key-search index")
    dry = ok(env, "cancel", "--filter", "--key", "bulk", "--dry-run", "--json")
    assert dry["changed"] == 30 and dry["dry_run"]
    assert ok(env, "cancel", "--filter", "--key", "bulk", "--confirm-above", "10", "--yes", "--json")["changed"] == 30
    assert ok(env, "cancel", *WEIRD[1:4], "--json")["changed"] == 3
    assert ok(env, "list", "--json")["messages"] == []
    missing = cli(env, "show", WEIRD[1])
    assert missing.returncode == 1 and "not_found" in missing.stdout


@pytest.mark.parametrize("args, code, text", [
    (["cancel", "ghost"], 6, "not in the store"),
    (["fire-now", "ghost", "--json"], 6, "not in the store"),
    (["list", "--due-before", "yesterday"], 2, "--due-before"),
    (["list", "--due-after", "2026-13-01"], 2, "--due-after"),
    (["list", "--state", "sleeping"], 2, "unknown state"),
    (["list", "--limit", "-3"], 2, "--limit"),
    (["list", "--limit", "ten"], 2, "--limit"),
    (["list", "--after", "garbage"], 2, "cursor"),
    (["list", "--key", "hex:zz"], 2, "hex"),
    (["reschedule", "x", "--delay=-5m"], 2, "negative"),
    (["reschedule", "x", "--delay", "-5m"], 2, "--delay"),
    (["list", "--bogus"], 2, "--bogus"),
    (["reschedule", "x", "--delay", "soon"], 2, "--delay"),
    (["reschedule", "x", "--at", "tomorrow-ish"], 2, "--at"),
    (["reschedule", "x"], 2, "--at or --delay"),
    (["cancel"], 2, "give the ids"),
    (["cancel", "x", "--key", "k"], 2, "--filter"),
    (["cancel", "x", "--filter", "--key", "k"], 2, "not both"),
    (["fire-now", "--filter", "--state", "nope"], 2, "unknown state"),
    (["list", "--due-after", "1h", "--due-before", "10m"], 2, "before"),
])
def test_bad_input_is_one_line_and_a_distinct_exit_code(chronos_env, monkeypatch, capsys, args, code, text):
    """In-process (`chronos.cli.main`), so the 20 cases take a second: an exception that is not one of
    Chronos's own would escape main() and fail the test, as it would print a traceback."""
    from chronos.cli import main
    for name, value in chronos_env.items():
        monkeypatch.setenv(name, value)
    try:
        returned = main(args)
    except SystemExit as exc:          # argparse's own errors
        returned = exc.code
    err = capsys.readouterr().err
    assert returned == code, (returned, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and text in lines[0], err


def test_a_bad_flag_through_the_real_command_is_one_line_without_traceback(chronos_env):
    res = cli(chronos_env, "reschedule", "x", "--delay=-5m")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "negative" in res.stderr


def test_an_in_flight_message_is_reported_and_left_to_its_firer(chronos_env):
    """A row a firer holds (here one that died holding it): the action exits 8 and changes nothing."""
    import psycopg
    from chronos import codec
    with psycopg.connect(chronos_env["CHRONOS_DATABASE_URL"], autocommit=True) as conn:
        conn.execute("INSERT INTO chronos_messages (id, deadline, readied_at, readied_by, key, value, headers) "
                     "VALUES ('held', now() + interval '1 hour', now(), gen_random_uuid(), 'k', 'v', %s)",
                     (codec.encode_headers([]),))
    for args in (["cancel", "held"], ["fire-now", "held"], ["reschedule", "held", "--delay", "1d"]):
        res = cli(chronos_env, *args)
        assert res.returncode == 8 and "in flight" in res.stderr, res.stderr
    shown = ok(chronos_env, "show", "held", "--json")
    assert shown["state"] == "in_flight" and shown["firer"]
