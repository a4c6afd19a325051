"""Header names the Python client cannot express, sent through librdkafka's C API to a running
consumer: they are dead-lettered with a reason, the messages around them flow, nothing exits.

Before the raw header reader, the name b"\\xff\\xfe" made the consumer exit with SystemError on
every start (so nothing behind it in the partition was ever read), and b"chronosDeadline\\0copy"
was read as a second chronosDeadline.
"""

from __future__ import annotations

import time

from helpers import Collector, iso
from rdkafka_raw import RawProducer


def test_bad_header_names_are_dead_lettered_and_the_partition_flows(processes, broker, topics):
    consumer = processes.start("consumer")
    firer = processes.start("firer")
    processes.wait_for_log(consumer, "starting: node")
    processes.wait_for_log(firer, "starting: node")

    now = time.time()
    late = iso(now - 1).encode()
    soon = iso(now + 1.5).encode()

    def ids(mid: str, deadline: bytes) -> list:
        return [(b"chronosMessageId", mid.encode()), (b"chronosDeadline", deadline)]

    valid = {b"ok-first": ids("ok-first", soon) + [(b"trace", b"\x00\xff")]}
    bad = {
        b"bad-utf8": (ids("bad-utf8", late) + [(b"\xff\xfe", b"x"), (b"after", None)],
                      [("chronosMessageId", b"bad-utf8"), ("chronosDeadline", late), ("\\xff\\xfe", b"x"),
                       ("after", None)], "is not valid UTF-8"),
        b"bad-nul": ([(b"a\x00b", b"1")] + ids("bad-nul", late),
                     [("a\\x00b", b"1"), ("chronosMessageId", b"bad-nul"), ("chronosDeadline", late)], "contains NUL"),
        b"bad-copy": (ids("bad-copy", soon) + [(b"chronosDeadline\x00copy", soon)],
                      [("chronosMessageId", b"bad-copy"), ("chronosDeadline", soon),
                       ("chronosDeadline\\x00copy", soon)], "contains NUL"),
    }
    after = {f"ok-{i}".encode(): ids(f"ok-{i}", late if i % 2 else soon) + [(b"n", str(i).encode())]
             for i in range(6)}
    raw = RawProducer(broker.bootstrap_servers)
    try:
        order = [(b"ok-first", valid[b"ok-first"])] + [(k, h) for k, (h, _, _) in bad.items()] + list(after.items())
        for key, headers in order:  # one partition: every valid message after the bad ones waits on them
            raw.produce(topics["input"], key, b"value of " + key, headers, partition=0)
        reports = raw.flush()
    finally:
        raw.close()
    assert [err for err, _, _ in reports] == [0] * len(order)
    offsets = {key: offset for (key, _), (_, _, offset) in zip(order, reports)}
    valid.update(after)

    collect = Collector(broker.bootstrap_servers, [topics["output"], topics["dlq"]])
    collect.until(lambda _: len(collect.on(topics["dlq"])) >= len(bad) and len(collect.on(topics["output"])) >= len(valid),
                  timeout=60)
    collect.poll_for(1.0)  # anything more would be a duplicate
    collect.close()

    out = collect.on(topics["output"])
    assert sorted(m.key for m in out) == sorted(valid)
    for m in out:
        assert m.value == b"value of " + m.key
        assert m.headers == [(k.decode(), v) for k, v in valid[m.key] if not k.startswith(b"chronos")]

    dead = collect.on(topics["dlq"])
    assert sorted(m.key for m in dead) == sorted(bad)
    for m in dead:
        _, carried, says = bad[m.key]
        assert m.value == b"value of " + m.key
        assert m.headers[:-2] == carried
        (error_name, error), (source_name, source) = m.headers[-2:]
        assert (error_name, source_name) == ("chronosError", "chronosSource")
        assert error.decode().startswith("bad_header_name: header name") and says in error.decode()
        assert source == f"{topics['input']}/0/{offsets[m.key]}".encode()

    assert consumer.poll() is None and firer.poll() is None
    log = processes.log_of(consumer)
    assert log.count("starting: node") == 1 and "Traceback" not in log
    assert "turned off" not in log and "Message.headers()" not in log  # the raw path stayed on
    assert "invalid messages sent to" in log and "bad_header_name" in log
