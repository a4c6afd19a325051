"""Bad input from producers: malformed messages mixed with valid (and unusual but valid) ones.

Every malformed message lands on the dead-letter topic with its original key, value and
headers plus a `chronosError` reason; every valid one is delivered (or, for far-future
deadlines, waits in the store); no process crashes or restarts.
"""

from __future__ import annotations

import time

import psycopg
import pytest
from confluent_kafka import Producer

from helpers import Collector

ADVANCE_S = 0.050
BIG = bytes(range(256)) * 3600  # 921,600 bytes: under the 1 MB default message.max.bytes
NOW_MS = int(time.time() * 1000)


def _ids_headers(mid: bytes | None, deadline: bytes | None) -> list:
    return [("chronosMessageId", mid), ("chronosDeadline", deadline)]


# (name, headers, value, expected chronosError reason); the key of each is b"bad-<name>"
MALFORMED = [
    ("no headers", [], b"v", "missing_id"),
    ("no id", [("chronosDeadline", str(NOW_MS).encode())], b"v", "missing_id"),
    ("empty id", _ids_headers(b"", str(NOW_MS).encode()), b"v", "empty_id"),
    ("null id", _ids_headers(None, str(NOW_MS).encode()), b"v", "empty_id"),
    ("id of 129 chars", _ids_headers(("é" * 129).encode(), str(NOW_MS).encode()), b"v", "id_too_long"),
    ("id not utf-8", _ids_headers(b"\xff\xfe\xfd", str(NOW_MS).encode()), b"v", "bad_id"),
    ("id with NUL", _ids_headers(b"a\x00b", str(NOW_MS).encode()), b"v", "bad_id"),
    ("no deadline", [("chronosMessageId", b"bad-no-deadline")], b"v", "missing_deadline"),
    ("empty deadline", _ids_headers(b"bad-empty-deadline", b""), b"v", "bad_deadline"),
    ("null deadline", _ids_headers(b"bad-null-deadline", None), b"v", "bad_deadline"),
    ("deadline not a date", _ids_headers(b"bad-words", b"tomorrow at noon"), b"v", "bad_deadline"),
    ("deadline bad offset", _ids_headers(b"bad-offset", b"2030-01-01T00:00:00+25:00"), b"v", "bad_deadline"),
    ("deadline float", _ids_headers(b"bad-float", f"{NOW_MS}.5".encode()), b"v", "bad_deadline"),
    ("deadline huge epoch", _ids_headers(b"bad-huge", b"99999999999999999999"), b"v", "bad_deadline"),
    ("deadline negative", _ids_headers(b"bad-negative", b"-1000"), b"v", "bad_deadline"),
    ("deadline Feb 30", _ids_headers(b"bad-feb30", b"2030-02-30T00:00:00Z"), b"v", "bad_deadline"),
    ("deadline year 10000", _ids_headers(b"bad-y10k", b"10000-01-01T00:00:00Z"), b"v", "bad_deadline"),
    ("deadline binary", _ids_headers(b"bad-bin-deadline", b"\x00\x9f\xff\x13"), b"v", "bad_deadline"),
    ("two deadlines", _ids_headers(b"bad-two-deadlines", str(NOW_MS).encode())
     + [("chronosDeadline", str(NOW_MS + 1000).encode())], b"v", "duplicate_header"),
    ("two ids", _ids_headers(b"bad-two-ids", str(NOW_MS).encode()) + [("chronosMessageId", b"x")], b"v",
     "duplicate_header"),
    ("topic binary", _ids_headers(b"bad-topic", str(NOW_MS).encode()) + [("chronosTopic", b"\xde\xad\x00")],
     b"v", "bad_topic"),
    ("topic not allowed", _ids_headers(b"bad-topic-2", str(NOW_MS).encode()) + [("chronosTopic", b"elsewhere")],
     b"v", "topic_not_allowed"),
    ("action binary", _ids_headers(b"bad-action", str(NOW_MS).encode()) + [("chronosAction", b"\xff\x00")],
     b"v", "bad_action"),
    ("ordering key binary", _ids_headers(b"bad-okey", str(NOW_MS).encode())
     + [("chronosOrderingKey", b"\xc3\x28")], b"v", "bad_ordering_key"),
    ("big value no id", [("chronosDeadline", str(NOW_MS).encode()), ("h", b"\x00")], BIG, "missing_id"),
    ("dst policy unknown", [("chronosMessageId", b"bad-dst"), ("chronosCron", b"30 2 * * *"),
                            ("chronosDstPolicy", b"repeated=sometimes")], b"v", "bad_cron"),
    ("dst policy without cron", _ids_headers(b"bad-dst-2", str(NOW_MS).encode())
     + [("chronosDstPolicy", b"repeated=both")], b"v", "bad_cron"),
]

WEIRD_IDS = ["it's \"quoted\"", "back\\slash\\\\", "100% %s %(id)s %%", "ünïcødé ✓ 🚀 中文",
             "'; DROP TABLE chronos_messages; --", "é" * 128, " leading and trailing ", "tab\tand\nnewline"]


def _start_all(processes) -> list:
    procs = [processes.start(role) for role in ("consumer", "firer", "detector")]
    for p in procs:
        processes.wait_for_log(p, "starting: node")
    return procs


def _iso(epoch_s: float) -> bytes:
    return (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch_s)) + f".{int(epoch_s * 1000) % 1000:03d}Z").encode()


def test_malformed_messages_are_dead_lettered_and_valid_ones_delivered(processes, broker, topics, chronos_env):
    procs = _start_all(processes)
    collect = Collector(broker.bootstrap_servers, [topics["output"], topics["dlq"]])
    p = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5, "acks": "all"})
    where: dict[bytes, tuple[int, int]] = {}

    def send(key, value, headers) -> None:
        def done(err, msg):
            assert err is None, err
            where[msg.key()] = (msg.partition(), msg.offset())
        p.produce(topics["input"], value, key, headers=headers, on_delivery=done)
        p.poll(0)

    now = time.time()
    # valid: (key, value, headers, deadline_s or None when far in the future)
    relayed = [("trace", b"\x00\x01\xfe\xff"), ("dup", b"1"), ("dup", b"\x80garbage\xc3"), ("nullval", None),
               ("", b"empty key")]
    valid = [
        (b"ok-plain", b"plain", _ids_headers(b"ok-plain", _iso(now + 1.5)) + relayed, now + 1.5),
        (None, None, _ids_headers(b"ok-tombstone", str(int((now + 1.0) * 1000)).encode()), now + 1.0),
        (b"ok-big", BIG, _ids_headers(b"ok-big", _iso(now + 2.0)), now + 2.0),
        (b"ok-past", b"past", _ids_headers(b"ok-past", b"1990-01-01T00:00:00Z"), 631152000.0),
        (b"ok-epoch-0", b"zero", _ids_headers(b"ok-epoch-0", b"0"), 0.0),
        (b"ok-offset", b"offset", _ids_headers(b"ok-offset", time.strftime(
            "%Y-%m-%dT%H:%M:%S+02:00", time.gmtime(now + 2 + 7200)).encode()), float(int(now + 2))),
        (b"ok-space", b"space", _ids_headers(b"ok-space", time.strftime(
            "%Y-%m-%d %H:%M:%S", time.gmtime(now + 3)).encode()), float(int(now + 3))),
    ]
    for i, mid in enumerate(WEIRD_IDS):
        valid.append((f"ok-weird-{i}".encode(), mid.encode(), _ids_headers(mid.encode(), _iso(now + 6.0)), now + 6.0))
    waiting = [(b"ok-2070", b"far", _ids_headers(b"ok-2070", b"2070-01-01T00:00:00Z"), 3155760000.0),
               (b"ok-9999", b"max", _ids_headers(b"ok-9999", b"9999-12-31T23:59:59.999Z"), 253402300799.999)]

    for name, headers, value, _ in MALFORMED:
        send(f"bad-{name}".encode(), value, headers)
    for key, value, headers, _ in valid + waiting:
        send(key, value, headers)
    assert p.flush(30) == 0
    # ids with quotes, backslashes, percent signs and Unicode are stored verbatim (SQL is parameterised)
    end = time.monotonic() + 5
    while True:
        with psycopg.connect(chronos_env["CHRONOS_DATABASE_URL"]) as conn:
            stored = {r[0] for r in conn.execute("SELECT id FROM chronos_messages WHERE id = ANY(%s)", (WEIRD_IDS,))}
        if stored == set(WEIRD_IDS) or time.monotonic() > end:
            break
        time.sleep(0.1)
    assert stored == set(WEIRD_IDS)

    n_valid = len(valid)
    collect.until(lambda ms: len(collect.on(topics["dlq"])) >= len(MALFORMED)
                  and len(collect.on(topics["output"])) >= n_valid, timeout=60)
    collect.poll_for(2.0)  # anything more would be a duplicate or a misrouted message
    collect.close()

    # every malformed message: on the dead-letter topic once, byte-exact, with its reason and source
    dead = {m.key: m for m in collect.on(topics["dlq"])}
    assert len(collect.on(topics["dlq"])) == len(MALFORMED) == len(dead)
    for name, headers, value, reason in MALFORMED:
        key = f"bad-{name}".encode()
        m = dead[key]
        assert m.value == value, name
        assert m.headers[:len(headers)] == headers, name
        extra = dict(m.headers[len(headers):])
        assert set(extra) == {"chronosError", "chronosSource"}, name
        assert extra["chronosError"].decode().split(":", 1)[0] == reason, (name, extra["chronosError"])
        partition, offset = where[key]
        assert extra["chronosSource"] == f"{topics['input']}/{partition}/{offset}".encode(), name

    # every valid message: delivered once, not early, key/value/other headers byte-exact
    out = collect.on(topics["output"])
    assert len(out) == n_valid, sorted(m.key or b"" for m in out)
    by_key = {m.key: m for m in out}
    for key, value, headers, deadline in valid:
        m = by_key[key]
        assert m.value == value, key
        assert m.headers == [h for h in headers if not h[0].startswith("chronos")], key
        assert m.at >= deadline - ADVANCE_S, (key, deadline - m.at)

    # decades ahead: waiting in the store with the deadline it was given
    with psycopg.connect(chronos_env["CHRONOS_DATABASE_URL"]) as conn:
        rows = dict(conn.execute("SELECT id, extract(epoch FROM deadline)::float8 FROM chronos_messages").fetchall())
    assert rows == {"ok-2070": 3155760000.0, "ok-9999": pytest.approx(253402300799.999, abs=1e-3)}

    # nothing crashed or restarted
    for proc in procs:
        assert proc.poll() is None
        assert processes.log_of(proc).count("starting: node") == 1
        assert "Traceback" not in processes.log_of(proc)
    consumer_log = processes.log_of(procs[0])
    assert "invalid messages sent to" in consumer_log
