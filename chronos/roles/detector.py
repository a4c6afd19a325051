"""`chronos detector`: hands back rows a firer claimed and did not fire within the hold time.

Every failure-detection interval it reads the rows readied longer ago than the hold time,
then resets exactly those whose readied_at/readied_by are still what it read, so a row a
firer deleted or a peer re-claimed in between is left alone. Two detectors at once are safe.
"""

from __future__ import annotations

import collections
import logging
import time
import uuid
from typing import Callable, Mapping

from chronos.config import Settings
from chronos.errors import StoreRejected, StoreUnavailable
from chronos.logs import Throttle
from chronos.telemetry.endpoints import ANNOUNCE_EVERY_S
from chronos.telemetry.metrics import DetectorTelemetry, postgres_reached
from chronos.runtime.process import Lifecycle
from chronos.runtime.backoff import POSTGRES_RETRY_CAP_S, Outage
from chronos.ports import DetectStore

log = logging.getLogger("chronos.detector")

# seconds between reads of the store gauges (waiting, due, held) when serving metrics: about one
# scrape interval. A read counts the waiting rows off the due index (exactly, below a million), and
# under load that is tens of milliseconds of PostgreSQL: at 10,000 msg/s with 60,000 rows waiting,
# 60-130 ms a read (the waiting count and the in-flight one), in the one detector that reads them.
GAUGES_EVERY = 15.0
# The detectors that said where they serve /metrics (chronos_processes, every ANNOUNCE_EVERY_S) within this
# long are live: the first of them by node reads the store gauges for all. A detector that stops takes its
# row away, and the next one reads at its next turn; one that dies hands the turn on once its row is this old.
GAUGE_READER_WITHIN_MS = int(2 * ANNOUNCE_EVERY_S * 1000)


def suspected_nodes(reset_by: list[uuid.UUID]) -> list[tuple[uuid.UUID, int]]:
    """(node, rows reset) per suspected node, most rows first."""
    return collections.Counter(reset_by).most_common()


class DetectorProcess:
    """The detector's loop: scan for rows held past the hold time, hand them back, refresh the gauges."""

    def __init__(self, settings: Settings, life: Lifecycle, *, store: DetectStore, telemetry: DetectorTelemetry,
                 action_totals: Callable[[], Mapping[str, tuple[int, int]]] = dict):
        """`action_totals` reads the operators' action totals for their counters (none by default)."""
        self.settings, self.life = settings, life
        self.store = store
        self.action_totals = action_totals
        self.outage = Outage(log, cap=POSTGRES_RETRY_CAP_S)
        self.throttle = Throttle(log)
        self.total_reset = 0
        self.metrics = telemetry
        self.metrics.follow(lambda: {"reset": self.total_reset})
        self.metrics.follow_postgres(lambda: [self.store.link])
        self.next_gauges = 0.0
        self.gauges_by: uuid.UUID | None = None  # the detector that read the store gauges last time (None: this one)

    def run(self) -> None:
        interval = self.settings.failure_detection_interval_ms / 1000.0
        log.info("watching for rows held longer than %d ms, every %d ms", self.settings.hold_time_ms,
                 self.settings.failure_detection_interval_ms)
        self.metrics.serve(postgres=lambda: postgres_reached(self.store))
        try:
            while self.life.running:
                self.metrics.beat()
                try:
                    started = time.perf_counter()
                    self.metrics.batch("scan", self.scan(), time.perf_counter() - started)
                    self.refresh_gauges()
                    self.metrics.announce(self.store, time.monotonic())
                    self.outage.ok()
                    delay = interval
                except StoreUnavailable as exc:
                    delay = self.outage.failed(exc)
                self.life.sleep(delay)
        finally:
            log.info("stopping: reset %d rows in all", self.total_reset)
            self.metrics.withdraw(self.store)
            self.metrics.close()
            self.store.close()

    def scan(self) -> int:
        stale = self.store.find_stale(self.settings.hold_time_ms)
        if not stale:
            return 0
        reset_by = self.store.reset_stale(stale)
        for node, count in suspected_nodes(reset_by):
            log.warning("suspected failure of %s: %d rows held past %d ms handed back", node, count,
                        self.settings.hold_time_ms)
        self.total_reset += len(reset_by)
        return len(reset_by)

    def refresh_gauges(self) -> None:
        """Read waiting, due and held counts from the store for the gauges, now and then. One detector of a
        database reads them (`gauge_reader`): under load a read costs PostgreSQL tens of milliseconds, and
        every other detector's would be the same counts. The others export none, and the alert rules and
        dashboards take the one there is (`max by (cell)`)."""
        now = time.monotonic()
        if not self.metrics.serving or now < self.next_gauges:
            return
        self.next_gauges = now + GAUGES_EVERY
        try:
            if self.another_reads_gauges():
                self.metrics.withhold_store_gauges()
            else:
                self.metrics.store_gauges(self.store.overview(self.settings.hold_time_ms))
                self.metrics.throttled_gauges(self.store.throttled(self.settings.output_topic))
            self.metrics.actions = self.action_totals()  # cheap, and counters: every detector exports them
        except StoreRejected as exc:  # a gauge is not worth stopping the detector for
            self.throttle.warning("gauges", "cannot read the store gauges: %s", exc)

    def another_reads_gauges(self) -> bool:
        """Whether another live detector comes first (`DetectStore.gauge_reader`); said in the log when that
        changes. Where the store cannot say, this one reads."""
        try:
            first = self.store.gauge_reader(GAUGE_READER_WITHIN_MS)
        except StoreRejected:
            first = None
        me = uuid.UUID(self.metrics.node)
        by = first if first is not None and first < me else None
        if by != self.gauges_by:
            if by is None:
                log.info("reading the store gauges for the detectors of this database")
            else:
                log.info("detector %s reads the store gauges: this one exports none of them", by)
        self.gauges_by = by
        return by is not None
