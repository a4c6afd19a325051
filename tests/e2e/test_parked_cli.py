"""`chronos parked list|show|replay|drop` as a subprocess, against the real PostgreSQL and the real broker:
a message the firer parked, refused again by a replay, then replayed by the failure page's own block as
it is written, byte for byte, and counted in the detector's metrics; drops, the allow-list, confirmation
and bad input."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import psycopg
import pytest

from chronos import codec
from chronos.adapters.kafka.admin import create_topics
from chronos.adapters.postgres.store import Store
from chronos.domain.model import Parked, Row
from chronos.embedded.procs import free_port

from kits.fleet import page_blocks
from kits.stack import clean_env
from helpers import Collector, wait_for
from test_operator_cli import action_metric

ROOT = Path(__file__).resolve().parents[2]
FAILURE_PAGE = ROOT / "docs" / "operations" / "failure-behaviour.md"
HEADERS = [("trace", b"\x00\xfft"), ("trace", None), ("note", "naïve".encode())]


def cli(env: dict, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chronos", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **env}, timeout=90)


def ok(env: dict, *args: str):
    done = cli(env, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return orjson.loads(done.stdout) if "--json" in args else done.stdout


def parked_rows(url: str) -> dict[int, tuple]:
    with psycopg.connect(url) as conn:
        return {r[0]: r[1:] for r in conn.execute("SELECT id, message_id, topic, reason FROM chronos_parked")}


def park(url: str, *messages: Parked) -> list[int]:
    before = set(parked_rows(url))
    store = Store(url)
    try:
        store.park(list(messages))
    finally:
        store.close()
    return sorted(set(parked_rows(url)) - before)


def test_a_message_the_firer_parked_is_refused_again_then_replayed_as_the_page_says(processes, chronos_env,
                                                                                   broker, topics, tmp_path):
    env, url = chronos_env, chronos_env["CHRONOS_DATABASE_URL"]
    huge = b"x" * 1_500_000
    store = Store(url)
    try:  # stored fine in PostgreSQL, over the producer's 1 MB message.max.bytes, and due
        assert store.insert([Row("huge", int((time.time() - 1) * 1_000_000), None, b"big-key", huge,
                                 codec.encode_headers(HEADERS))]) == 1
    finally:
        store.close()
    port = free_port()
    processes.start("firer")
    detector = processes.start("detector", CHRONOS_METRICS_PORT=str(port))
    processes.wait_for_log(detector, f"serving /metrics and /healthz on port {port}")
    wait_for(lambda: parked_rows(url), what="the message parked by the firer")

    (listed,) = ok(env, "parked", "list", "--json")["parked"]
    number = listed["number"]
    assert (listed["message_id"], listed["source"], listed["topic"], listed["value_size"]) == \
        ("huge", "store/huge", topics["output"], len(huge))
    assert listed["reason"].startswith("too_large: MSG_SIZE_TOO_LARGE")
    assert listed["headers"][0] == ["trace", {"text": None, "hex": "00ff74"}]
    shown = ok(env, "parked", "show", str(number), "--save-value", str(tmp_path / "value"))
    assert f"number           #{number}" in shown and "reason           too_large:" in shown
    assert "value saved to" in shown and (tmp_path / "value").read_bytes() == huge
    assert ok(env, "parked", "list", "--reason", "publish_failed") == "no parked messages match\n"

    # the producer's limit is still 1 MB: Kafka refuses it again, and it stays parked with the new reason
    refused = cli(env, "parked", "replay", str(number))
    assert refused.returncode == 9, refused.stdout + refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith("chronos parked: 1 stay parked: Kafka refused 1")
    assert "1 refused by Kafka, left parked" in refused.stdout
    ((_, _, reason),) = parked_rows(url).values()
    assert reason.startswith("too_large: MSG_SIZE_TOO_LARGE") and reason.endswith(f"(replay to {topics['output']})")

    # the failure page's block as it is written, in a directory whose ready file names this test's services
    (block,) = page_blocks(FAILURE_PAGE, "parked replay")
    home = tmp_path / "operator"
    (home / ".chronos").mkdir(parents=True)
    (home / ".chronos" / "ready.json").write_bytes(orjson.dumps({
        "database_url": url, "bootstrap_servers": broker.bootstrap_servers, "input_topic": topics["input"],
        "output_topic": topics["output"], "dlq_topic": topics["dlq"]}))
    collect = Collector(broker.bootstrap_servers, [topics["output"]])
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=home, capture_output=True, text=True,
                          env=clean_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"),
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"1 would be replayed to their topics: #{number}" in done.stdout
    assert f"1 replayed to their topics: #{number}" in done.stdout
    (got,) = collect.until(lambda ms: len(ms) >= 1, timeout=30)
    collect.poll_for(0.5)
    collect.close()
    assert len(collect.messages) == 1
    assert (got.key, got.value, got.headers) == (b"big-key", huge, HEADERS)
    assert parked_rows(url) == {}
    # counted like every operator's action, and exported by the detector
    assert wait_for(lambda: action_metric(port, "replay_parked") == (2.0, 1.0), what="the replays in the metrics")


def test_drop_the_allow_list_and_confirmation(chronos_env, broker, topics):
    env, url = chronos_env, chronos_env["CHRONOS_DATABASE_URL"]
    other = f"other-{topics['output']}"
    create_topics(broker.bootstrap_servers, {other: 1})

    def pm(mid: str | None, topic: str, reason: str) -> Parked:
        return Parked(mid, f"{topics['input']}/0/1", topic, None, b"k", b"v", codec.encode_headers([]), reason)
    elsewhere, lost, *invalid = park(url, pm("elsewhere", "not.allowed", "too_large: x"),
                                     pm("lost", topics["output"], "too_large: x"),
                                     *(pm(None, topics["dlq"], "missing_id: no id; dead-letter topic: too large")
                                       for _ in range(3)))

    # another topic than the output and dead-letter topics only where the allow-list allows it
    refused = cli(env, "parked", "replay", str(lost), "--to", other)
    assert refused.returncode == 2 and "CHRONOS_ALLOWED_TOPICS" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    left = cli(env, "parked", "replay", str(elsewhere))
    assert left.returncode == 9 and "CHRONOS_ALLOWED_TOPICS does not allow the topic" in left.stdout
    allowed = {**env, "CHRONOS_ALLOWED_TOPICS": "other-.*"}
    assert ok(allowed, "parked", "replay", str(lost), "--to", other, "--json")["changed"] == 1
    collect = Collector(broker.bootstrap_servers, [other])
    (got,) = collect.until(lambda ms: len(ms) >= 1, timeout=30)
    collect.close()
    assert (got.key, got.value) == (b"k", b"v")

    # drops: a dry run, confirmation above the threshold, unknown numbers
    dry = ok(env, "parked", "drop", "--filter", "--reason", "missing_id", "--dry-run", "--json")
    assert (dry["changed"], dry["sample"]) == (3, invalid)
    unconfirmed = cli(env, "parked", "drop", "--filter", "--reason", "missing_id", "--confirm-above", "2")
    assert unconfirmed.returncode == 7 and "--yes" in unconfirmed.stderr
    assert ok(env, "parked", "drop", "--filter", "--reason", "missing_id", "--confirm-above", "2", "--yes") == \
        f"3 dropped: {', '.join(f'#{n}' for n in invalid)}\n"
    unknown = cli(env, "parked", "drop", str(elsewhere), "999999")
    assert unknown.returncode == 6 and "#999999" in unknown.stderr and "1 dropped" in unknown.stdout
    assert parked_rows(url) == {}
    with psycopg.connect(url) as conn:
        totals = dict(conn.execute("SELECT action, messages FROM chronos_actions").fetchall())
    assert totals == {"replay_parked": 1, "drop_parked": 4}


def test_a_replay_kafka_cannot_be_reached_for_changes_nothing(chronos_env, topics):
    url, out = chronos_env["CHRONOS_DATABASE_URL"], topics["output"]
    (number,) = park(url, Parked("m", "store/m", out, None, b"k", b"v", codec.encode_headers([]), "too_large: x"))
    done = cli(chronos_env, "parked", "replay", str(number), "--kafka-bootstrap-servers", f"127.0.0.1:{free_port()}",
               "--timeout", "1")
    assert done.returncode == 3 and "cannot reach Kafka" in done.stderr.strip().splitlines()[-1], done.stderr
    assert parked_rows(url) == {number: ("m", out, "too_large: x")}


@pytest.mark.parametrize("args, code, text", [
    (["parked", "show", "x"], 2, "is not the number of a parked message"),
    (["parked", "show", "0"], 2, "is not the number of a parked message"),
    (["parked", "show", "424242"], 1, ""),
    (["parked", "replay"], 2, "give the numbers of the parked messages to replay"),
    (["parked", "drop", "1", "--reason", "too_large"], 2, "--filter"),
    (["parked", "drop", "1", "--filter", "--reason", "too_large"], 2, "not both"),
    (["parked", "replay", "1", "--timeout", "0"], 2, "--timeout"),
    (["parked", "list", "--parked-after", "tomorrow"], 2, "--parked-after"),
    (["parked", "list", "--parked-after=-1h", "--parked-before=-2h"], 2, "before"),
    (["parked", "list", "--reason", "too large"], 2, "a reason's code"),
    (["parked", "list", "--limit", "0"], 2, "--limit"),
    (["parked", "list", "--before", "soon"], 2, "not the number"),
    (["parked", "list", "--id-prefix", ""], 2, "--id-prefix"),
    (["parked", "purge"], 2, "invalid choice"),
])
def test_bad_input_is_one_line_and_a_distinct_exit_code(chronos_env, monkeypatch, capsys, args, code, text):
    """In-process (`chronos.cli.main`), as tests/e2e/test_operator_cli.py does: an exception that is not
    one of Chronos's own would escape main() and fail the test."""
    from chronos.cli import main
    for name, value in chronos_env.items():
        monkeypatch.setenv(name, value)
    try:
        returned = main(args)
    except SystemExit as exc:          # argparse's own errors
        returned = exc.code
    out, err = capsys.readouterr()
    assert returned == code, (returned, out, err)
    if text:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and text in lines[0], err
    else:
        assert out == "#424242: not_found\n" and err == ""
