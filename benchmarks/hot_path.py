"""The consumer's and the firer's batch paths, per message, as the micro benchmarks and a CPU
instruction count measure them (docs/benchmarks/hot-path.md).

- consumer: a poll's `confluent_kafka.Message`s (headers in librdkafka's list, as consumed) →
  `sort_batch` → `Store.apply`, which COPYs the rows into a real PostgreSQL;
- firer: claimed rows → the sender (`take_claimed`, `publish_due`, one `send()` per row, the
  delivery reports) → the acknowledged rows handed to the settler → the delete's parameters. The
  producer is a stand-in that acknowledges every publish at the next `poll()`: what is measured is
  Chronos's own Python, not librdkafka's.

Instructions are counted with callgrind (the machine is shared, so wall-clock times vary; the
instructions a pass executes do not): `python -m benchmarks.hot_path instructions consumer
--database-url URL` runs the path under callgrind twice, with few and with many batches, and
prints the difference per message, so that start-up and imports cancel out.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from typing import Any, Callable

from confluent_kafka import Message

from chronos import codec
from chronos.adapters.kafka.clients import Producer
from chronos.adapters.postgres.arrays import claimed_params
from chronos.adapters.postgres.store import Store
from chronos.domain.intake import Rules
from chronos.domain.model import Claimed
from chronos.roles.consumer import CANCEL, INSERT, REPLACE, sort_batch
from chronos.runtime.process import tune_gc

BATCH = 2000
RULES = Rules(timing_advance_us=50_000, output_topic="chronos.output", allowed_topics=re.compile("chronos.output"))
VALUE = b"x" * 100
# What a typical input message carries besides its id and deadline: two of the application's headers.
APP_HEADERS = [(b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
               (b"content-type", b"application/json")]


def input_messages(n: int = BATCH) -> list[Message]:
    """`n` consumed messages, each with its own id and a deadline an hour ahead, as the consumer
    reads them (the headers still in librdkafka's list)."""
    from chronos.codec import librdkafka
    from tests.rdkafka_raw import header_list
    deadline_ms = str(int(time.time() * 1000) + 3_600_000).encode()
    run = uuid.uuid4().hex[:8]
    messages = []
    for i in range(n):
        msg = Message(topic="chronos.input", partition=i % 4, offset=i, key=b"key-%d" % i, value=VALUE)
        headers = [(b"chronosMessageId", f"order-{run}-{i:08d}".encode()), (b"chronosDeadline", deadline_ms),
                   *APP_HEADERS]
        ctypes.c_void_p.from_address(id(msg) + librdkafka.C_HEADERS_OFFSET).value = header_list(headers)
        messages.append(msg)
    return messages


def consumer_pass(store: Store, messages: list[Message]) -> int:
    """One poll's batch through the consumer's path to PostgreSQL (as `ConsumerProcess.write` does
    it); the table is emptied first, so every pass inserts all its rows."""
    store._c().execute("TRUNCATE chronos_messages")
    batch = sort_batch(messages, time.time_ns() // 1000, RULES)
    inserted = store.apply(batch.of(INSERT), batch.of(REPLACE), batch.of(CANCEL))[0]
    assert inserted == len(messages), inserted
    return inserted


def claimed_rows(n: int = BATCH) -> list[Claimed]:
    """`n` rows as a claim returns them, all due now."""
    headers = codec.encode_headers([(k.decode(), v) for k, v in APP_HEADERS])
    now_us, readied = time.time_ns() // 1000 - 1000, datetime.now(timezone.utc)
    return [Claimed(f"order-{i:08d}", now_us, None, b"key-%d" % i, VALUE, headers, readied, seq=i,
                    ctid=f"(0,{i + 1})") for i in range(n)]


class NullProducer:
    """A producer that acknowledges every publish at the next `poll()` (Chronos's Python only)."""

    # the Kafka adapter's own `send` (its queue-full and refusal handling), around this `produce`
    send = Producer.send

    def __init__(self) -> None:
        self.reports: list[Callable] = []

    def produce(self, topic: str, value: Any = None, key: Any = None, *, on_delivery: Callable | None = None,
                headers: Any = None) -> None:
        if on_delivery is not None:
            self.reports.append(on_delivery)

    def poll(self, timeout: float = -1) -> int:
        reports, self.reports = self.reports, []
        for report in reports:
            report(None, None)
        return len(reports)

    def flush(self, timeout: float = -1) -> int:
        self.poll(0)
        return 0

    def purge(self, *args: Any, **kwargs: Any) -> None:
        self.reports = []


def firer() -> Any:
    """A firer's sender on the null producer (its claimer and settler are never started)."""
    from chronos import config
    from chronos.adapters.kafka.clients import OutageLog
    from chronos.adapters.memory import MemoryDatabase, MemoryStore
    from chronos.telemetry.metrics import FirerTelemetry
    from chronos.roles.firer import FirerProcess
    from chronos.runtime.process import Lifecycle
    settings = config.load(environ={"CHRONOS_DATABASE_URL": "postgresql://unused@127.0.0.1:1/unused",
                                    "CHRONOS_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "CHRONOS_METRICS_PORT": "0"},
                           default_ready_file=False)
    db, node, producer = MemoryDatabase(), uuid.uuid4(), NullProducer()
    return FirerProcess(settings, Lifecycle(), stores=lambda: MemoryStore(db, node_id=node),
                        producers=lambda: (producer, OutageLog("bench")),
                        telemetry=FirerTelemetry(node, settings))


def firer_pass(proc: Any, rows: list[Claimed]) -> int:
    """One claim's rows through the sender to the delete's parameters: published, their
    acknowledgements taken, handed to the settler, which builds its delete."""
    proc.sender.inbox.put((time.monotonic(), rows))  # as the claimer hands them over: with their claim's time
    proc.sender.take_claimed()
    proc.sender.publish_due()
    proc.slot.producer.poll(0)
    proc.sender.hand_over()
    acked = proc.settler.inbox.get_nowait().acked
    params = claimed_params(acked, proc.settler.store.node_id)
    assert len(acked) == len(rows) and params["ids"], len(acked)
    return len(acked)


def _run(path: str, batches: int, database_url: str | None) -> None:
    tune_gc()  # as a role's process runs
    if path == "consumer":
        assert database_url, "the consumer's path needs --database-url"
        store = Store(database_url, node_id=uuid.uuid4(), hot_path=True)
        messages = input_messages()
        consumer_pass(store, messages)  # warm: connection, prepared statements, caches
        for _ in range(batches):
            consumer_pass(store, messages)
        store.close()
    else:
        proc = firer()
        rows = claimed_rows()
        firer_pass(proc, rows)
        for _ in range(batches):
            firer_pass(proc, rows)


def instructions(path: str, database_url: str | None, few: int = 1, many: int = 6) -> float:
    """Instructions per message of `path` (callgrind): (many batches - few batches) / messages."""
    counts = []
    for batches in (few, many):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out", sys.executable, "-m",
                   "benchmarks.hot_path", "run", path, "--batches", str(batches)]
            if database_url:
                cmd += ["--database-url", database_url]
            done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
            if done.returncode != 0:
                raise SystemExit(f"callgrind run failed:\n{done.stderr[-3000:]}")
            found = re.search(r"Collected : (\d+)", done.stderr)
            assert found, done.stderr[-2000:]
            counts.append(int(found.group(1)))
    return (counts[1] - counts[0]) / ((many - few) * BATCH)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hot_path", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["run", "instructions"])
    parser.add_argument("path", choices=["consumer", "firer"])
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--database-url")
    args = parser.parse_args(argv)
    if args.what == "run":
        _run(args.path, args.batches, args.database_url)
    else:
        per = instructions(args.path, args.database_url)
        print(f"{args.path} ({codec.IMPL} codec): {per:,.0f} instructions per message")


if __name__ == "__main__":
    main()
