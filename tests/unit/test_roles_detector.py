"""The detector's loop on the in-memory store: rows held past the hold time are handed back, and
only those; a PostgreSQL outage is waited out."""

from __future__ import annotations

import threading
import time
import uuid

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from chronos import codec
from chronos.adapters.memory import ManualClock, MemoryDatabase, MemoryStore
from chronos.domain.model import Row
from chronos.telemetry.metrics import DetectorTelemetry
from chronos.roles.detector import GAUGE_READER_WITHIN_MS, GAUGES_EVERY, DetectorProcess
from chronos.runtime.process import Lifecycle
from kafka_double import settings

TIMEOUT = 10.0


def detector(db: MemoryDatabase, life: Lifecycle | None = None, **env: str) -> DetectorProcess:
    s = settings(CHRONOS_HOLD_TIME_MS="5000", **env)
    node = uuid.uuid4()
    return DetectorProcess(s, life or Lifecycle(), store=MemoryStore(db, node_id=node),
                           telemetry=DetectorTelemetry(node, s))


def add_due(db: MemoryDatabase, *ids: str) -> None:
    MemoryStore(db).apply([Row(i, db.now_us() - 1_000_000, None, None, b"v", codec.encode_headers([])) for i in ids],
                          [], [])


def state(db: MemoryDatabase) -> dict[str, uuid.UUID | None]:
    """id -> the node holding it (None: waiting)."""
    return {r.id: r.readied_by for r in db.rows.values()}


def test_a_scan_hands_back_only_the_rows_held_past_the_hold_time_and_names_their_firer(caplog):
    clock = ManualClock()
    db = MemoryDatabase(clock)
    dead, alive = uuid.uuid4(), uuid.uuid4()
    add_due(db, "a", "b", "c")
    assert len(MemoryStore(db, node_id=dead).claim(2, 0)) == 2
    clock.advance(4.0)
    assert len(MemoryStore(db, node_id=alive).claim(10, 0)) == 1
    clock.advance(1.5)  # the first claim is 5.5 s old, the second 1.5 s
    caplog.set_level("WARNING", logger="chronos.detector")
    proc = detector(db)
    assert proc.scan() == 2
    assert state(db) == {"a": None, "b": None, "c": alive}
    assert [r.getMessage() for r in caplog.records] == [
        f"suspected failure of {dead}: 2 rows held past 5000 ms handed back"]
    assert proc.scan() == 0 and proc.total_reset == 2


def test_the_loop_waits_out_a_postgres_outage_and_scans_again(caplog):
    clock = ManualClock()
    db = MemoryDatabase(clock)
    add_due(db, "a")
    MemoryStore(db, node_id=uuid.uuid4()).claim(1, 0)
    clock.advance(6.0)  # claimed 6 s ago, by a firer that died since
    db.unavailable = "connection refused"
    life = Lifecycle()
    proc = detector(db, life, CHRONOS_FAILURE_DETECTION_INTERVAL_MS="10")
    caplog.set_level("WARNING", logger="chronos.detector")
    thread = threading.Thread(target=proc.run)
    thread.start()
    try:
        deadline = time.monotonic() + TIMEOUT
        while not any("postgres unavailable" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "no outage logged"
            time.sleep(0.005)
        assert state(db)["a"] is not None
        db.unavailable = None
        while state(db)["a"] is not None:
            assert time.monotonic() < deadline, "the row was not handed back"
            time.sleep(0.005)
    finally:
        life.stop()
        thread.join(TIMEOUT)
    assert not thread.is_alive()
    assert any(r.getMessage().startswith("postgres reachable again after") for r in caplog.records)


def test_the_store_gauges_are_read_once_per_scrape_interval_not_at_every_scan():
    """Each read counts the waiting rows: tens of milliseconds of PostgreSQL under load, every detector."""
    reads: list[float] = []

    class Counting(MemoryStore):
        def overview(self, hold_ms, *, exact=None):
            reads.append(time.monotonic())
            return super().overview(hold_ms, exact=exact)

    s = settings(CHRONOS_HOLD_TIME_MS="5000")
    node = uuid.uuid4()
    proc = DetectorProcess(s, Lifecycle(), store=Counting(MemoryDatabase(), node_id=node),
                           telemetry=DetectorTelemetry(node, s))
    proc.metrics.server = object()  # serving /metrics: the gauges are read
    for _ in range(3):  # three scans, a failure-detection interval apart
        proc.refresh_gauges()
    assert len(reads) == 1 and GAUGES_EVERY >= 15.0 and proc.next_gauges > reads[0] + GAUGES_EVERY - 0.1


def test_one_detector_of_a_database_reads_the_store_gauges_and_the_next_takes_over_when_it_stops_or_falls_silent(
        caplog):
    """Every detector's read would count the same rows again: the live one first by node reads them for all."""
    clock = ManualClock()
    db = MemoryDatabase(clock)
    reads: list[uuid.UUID] = []

    class Counting(MemoryStore):
        def overview(self, hold_ms, *, exact=None):
            reads.append(self.node_id)
            return super().overview(hold_ms, exact=exact)

    def serving(node: uuid.UUID) -> DetectorProcess:
        s = settings(CHRONOS_HOLD_TIME_MS="5000")
        proc = DetectorProcess(s, Lifecycle(), store=Counting(db, node_id=node), telemetry=DetectorTelemetry(node, s))
        proc.metrics.server = object()  # serving /metrics
        proc.store.announce("detector", "http", 9000, None)
        return proc

    def exported(proc: DetectorProcess) -> set[str]:
        text = generate_latest(proc.metrics.registry).decode()
        return {s.name for f in text_string_to_metric_families(text) for s in f.samples
                if s.name in ("chronos_rows_waiting", "chronos_store_gauges_timestamp_seconds")}

    def turn(*procs: DetectorProcess) -> list[uuid.UUID]:
        reads.clear()
        for proc in procs:
            proc.next_gauges = 0.0  # its next read is due
            proc.refresh_gauges()
        return list(reads)

    first, second = serving(uuid.UUID(int=1)), serving(uuid.UUID(int=2))
    caplog.set_level("INFO", logger="chronos.detector")
    assert turn(second, first) == [first.store.node_id]
    assert exported(first) == {"chronos_rows_waiting", "chronos_store_gauges_timestamp_seconds"}
    assert exported(second) == set()
    assert f"detector {first.store.node_id} reads the store gauges: this one exports none of them" in caplog.messages
    first.store.withdraw()  # it stops
    assert turn(second, first) == [second.store.node_id, first.store.node_id]  # (it reads until it stops)
    assert exported(second) == {"chronos_rows_waiting", "chronos_store_gauges_timestamp_seconds"}
    assert "reading the store gauges for the detectors of this database" in caplog.messages
    first.store.announce("detector", "http", 9000, None)  # back: its turn again
    assert turn(second, first) == [first.store.node_id] and exported(second) == set()
    clock.advance(GAUGE_READER_WITHIN_MS / 1000 - 1)
    second.store.announce("detector", "http", 9000, None)
    assert turn(second) == []
    clock.advance(2)  # the first has said nothing for longer than that: dead or cut off
    assert turn(second) == [second.store.node_id]
