"""What an operator sees of a running process: its role's Prometheus metrics and its health.

Every process has a `Telemetry` of its role: a registry of the role's metrics, all labelled
with the role and the node id (and, for a firer or a detector of a deployment with cells, with the one
cell it serves: one label more per series, no series more; a consumer serves every cell and labels by cell
only what it has per cell), and a `Health` record (chronos.telemetry.health) of when the process
last ran its loop, reached PostgreSQL and reached Kafka. With `CHRONOS_METRICS_PORT` set
(chronos.telemetry.endpoints), a `MetricsServer` (chronos.telemetry.http) serves `/metrics` and `/healthz`.

The hot path stays cheap: the message counters are the processes' own running totals, read
at scrape time; histograms are observed once per batch, the fire lateness histogram included
(each message's lateness counted in its bucket, then one increment per bucket touched).
"""

from __future__ import annotations

import bisect
import collections
import functools
import logging
import os
import time
import uuid
from typing import Any, Callable, Iterable, Mapping

import psycopg
from prometheus_client import (CollectorRegistry, Counter, Gauge, GCCollector, Histogram, Info, PlatformCollector,
                               ProcessCollector, disable_created_metrics)
from prometheus_client.core import GaugeMetricFamily

from chronos import __version__, codec
from chronos.config import Settings
from chronos.domain.reasons import CONSUMER_REASONS, FIRER_REASONS, code_of
from chronos.adapters.kafka.brokerstats import STATS_ENV
from chronos.errors import ConfigError, StoreRejected, StoreUnavailable
from chronos.telemetry.collectors import (ActionTotals, EmbeddedBroker, PostgresLinks, ProducerReplacements,
                                         Totals)
from chronos.telemetry.endpoints import ANNOUNCE_EVERY_S, WILDCARDS, metrics_port
from chronos.telemetry.health import Health, KafkaProbe
from chronos.telemetry.http import CellLabelled, MetricsServer
from chronos.telemetry.lag import PartitionLag
from chronos.telemetry import webconfig

log = logging.getLogger("chronos.metrics")

# `_created` series only double the output; rate() does not need them.
disable_created_metrics()

SIZE_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Negative: published early, within the timing advance.
LATENESS_BUCKETS = (-0.05, -0.025, -0.01, -0.005, 0.0, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0)

PARKED = ("chronos_messages_parked_total", "messages neither their destination nor the dead-letter topic accepted, "
          "kept in the chronos_parked table")


def postgres_reached(*stores: Any) -> float:
    """When the process last reached PostgreSQL, for its health (`time.monotonic()`): the latest statement
    any of its stores had answered, but never before a statement one of them gave up after it (a hung
    server fails the health check at the statement's deadline, not a health window later)."""
    return max((store.last_ok if store.last_ok >= store.link.unanswered_at else 0.0) for store in stores)


class Telemetry:
    """One process's metrics, health record and HTTP server. Subclassed once per role."""

    role = "process"
    steps: tuple[str, ...] = ()
    # the process's running totals (its `stats`) that are exported as counters: key -> (name, help)
    totals: dict[str, tuple[str, str]] = {}

    def __init__(self, node_id: uuid.UUID | str, settings: Settings, environ: Mapping[str, str] | None = None):
        self.node = str(node_id)
        self.settings = settings
        # the one cell a firer or a detector serves (with cells); a consumer serves every cell
        self.cell = settings.cell if settings.cells and self.role != "consumer" else None
        self.port = metrics_port(self.role, settings.metrics_port, environ)
        self.registry = CollectorRegistry()
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            collector(registry=self.registry)
        Info("chronos", "Chronos version and header codec of this process",
             ("role", "node"), registry=self.registry).labels(self.role, self.node).info(
            {"version": __version__, "codec": codec.IMPL, "psycopg": psycopg.pq.__impl__})
        self.health = Health(settings.health_window_ms / 1000.0)
        self.last_loop = time.monotonic()
        self.health.watch("loop", lambda: self.last_loop, window_s=max(self.health.window, 3 * self.loop_period()))
        size = Histogram("chronos_batch_size", "rows or messages per batch of a step (claim, insert, publish, ...)",
                         ("role", "node", "step"), buckets=SIZE_BUCKETS, registry=self.registry)
        duration = Histogram("chronos_batch_duration_seconds", "time one batch of a step took",
                             ("role", "node", "step"), buckets=DURATION_BUCKETS, registry=self.registry)
        # The slowest batch is what an operator (and the day-in-the-life benchmark) asks about; the
        # histogram only bounds it by a bucket.
        slowest = Gauge("chronos_batch_duration_max_seconds", "the slowest batch of a step since the process started",
                        ("role", "node", "step"), registry=self.registry)
        self._steps = {s: (size.labels(self.role, self.node, s), duration.labels(self.role, self.node, s),
                           slowest.labels(self.role, self.node, s)) for s in self.steps}
        self._slowest = dict.fromkeys(self.steps, 0.0)
        self.healthy = self.gauge("chronos_healthy", "1 when /healthz would answer 200, else 0")
        self.healthy.set_function(lambda: 1.0 if self.health_report()[0] else 0.0)
        self.probe: KafkaProbe | None = None
        self.server: MetricsServer | None = None
        self.next_announce: dict[int, float] = {}  # id of a store -> monotonic: when `announce` says it there again
        self.announced: str | None = None        # the /metrics URL last said in a store
        self.announced_in: set[int] = set()      # ids of the stores it was said in (a consumer's cells: each)
        self.announce_refused = False            # the schema has no chronos_processes (said once in the log)

    # -- definitions -----------------------------------------------------------------------

    def gauge(self, name: str, doc: str) -> Any:
        return Gauge(name, doc, ("role", "node"), registry=self.registry).labels(self.role, self.node)

    def loop_period(self) -> float:
        """How long one pass of the role's loop may take when all is well."""
        return 1.0

    def count_dead_letters(self, reasons: Iterable[str]) -> None:
        """Define the dead-letter counter, with these reasons at 0 so rate() sees the first one."""
        self._dead = Counter("chronos_messages_dead_lettered_total", "messages sent to the dead-letter topic, by reason",
                             ("role", "node", "reason"), registry=self.registry)
        for reason in reasons:
            self._dead.labels(self.role, self.node, reason)

    def dead_lettered(self, reasons: Iterable[str]) -> None:
        """Count dead-lettered messages by reason code (the text before the first colon)."""
        for reason, count in collections.Counter(code_of(r) for r in reasons).items():
            self._dead.labels(self.role, self.node, reason).inc(count)

    def follow(self, totals: Callable[[], Mapping[str, int]]) -> None:
        """Export the process's running totals (see `totals`), read at each scrape."""
        self.registry.register(Totals(self.role, self.node, self.totals, totals))

    def follow_producer(self, watch: Any) -> None:
        """Export the Kafka producer's watchdog (`chronos.runtime.producer.ProducerWatch`): its replacements, and how
        long publishing has stalled; /healthz fails while it has."""
        self.registry.register(ProducerReplacements(self.role, self.node, watch.replacements))
        clock = self.health.clock
        self.gauge("chronos_publishing_stalled_seconds",
                   "how long nothing was acknowledged while messages wait to be published, once that is at least "
                   "CHRONOS_PUBLISH_STALL_MS; else 0").set_function(lambda: watch.stalled_for(clock()))
        self.health.watch("publishing", lambda: watch.since if watch.stalled_for(clock()) else clock(),
                          window_s=watch.stall_s,
                          detail=lambda: f"nothing acknowledged by Kafka while messages wait ({watch.replacements['stall']} "
                                         f"producers replaced for it so far)")

    def follow_postgres(self, links: Callable[[], Iterable[Any]],
                        cells: Callable[[], Mapping[str, Iterable[Any]]] | None = None) -> None:
        """Export the process's connections to PostgreSQL (the `ports.Link` of each of its stores; with `cells`,
        a consumer's, each cell's links, labelled with their cell)."""
        self.registry.register(PostgresLinks(self.role, self.node, links, cells))

    # -- the hot path ----------------------------------------------------------------------

    def beat(self) -> None:
        """The main loop ran."""
        self.last_loop = time.monotonic()

    def batch(self, step: str, size: int, seconds: float) -> None:
        size_hist, duration_hist, slowest = self._steps[step]
        size_hist.observe(size)
        duration_hist.observe(seconds)
        if seconds > self._slowest[step]:
            self._slowest[step] = seconds
            slowest.set(seconds)

    # -- serving ---------------------------------------------------------------------------

    @property
    def serving(self) -> bool:
        return self.server is not None

    def health_report(self) -> tuple[bool, dict[str, Any]]:
        ok, report = self.health.report()
        report.update(role=self.role, node=self.node, **({"cell": self.cell} if self.cell is not None else {}))
        return ok, report

    def liveness_report(self) -> tuple[bool, dict[str, Any]]:
        """/livez: the process's own loop only. An outage of PostgreSQL or Kafka (a failover) fails /healthz
        for as long as it lasts, and a restart would not end it; a loop that stopped beating is what a
        restart mends (a liveness probe's business)."""
        ok, report = self.health.report(only=("loop",))
        report.update(role=self.role, node=self.node, **({"cell": self.cell} if self.cell is not None else {}))
        return ok, report

    def exposed(self) -> Any:
        """What /metrics serves: the registry, each sample labelled with the cell this process serves if one."""
        return self.registry if self.cell is None else CellLabelled(self.registry, self.cell)

    def watch_postgres(self, postgres: Callable[[], float] | Mapping[str, Callable[[], float]],
                       detail: Callable[[], str | None] | None = None) -> None:
        """The health check of PostgreSQL (`serve`'s `postgres`): one, or with cells one per cell, named by it."""
        if callable(postgres):
            self.health.watch("postgres", postgres, detail=detail)
        else:
            for cell, reached in postgres.items():
                self.health.watch(f"postgres of cell {cell}", reached, detail=detail)

    def serve(self, *, postgres: Callable[[], float] | Mapping[str, Callable[[], float]],
              postgres_detail: Callable[[], str | None] | None = None,
              kafka: Callable[[], Any] | None = None, kafka_topic: str | None = None) -> None:
        """Start the HTTP server (if a port is set: on CHRONOS_METRICS_ADDRESS, over TLS and with basic
        authentication as CHRONOS_METRICS_WEB_CONFIG_FILE says) and the health checks of PostgreSQL and Kafka.

        `postgres` returns when the process last reached PostgreSQL (a consumer of several cells: one such
        function per cell, each cell its own check), `postgres_detail` what the process does about it not
        answering (if anything); `kafka` returns the process's current Kafka client, which a probe thread asks
        for `kafka_topic`'s metadata.
        """
        if not self.port:
            return
        self.watch_postgres(postgres, postgres_detail)
        if kafka is not None and kafka_topic is not None:
            probe = self.probe = KafkaProbe(kafka, kafka_topic, every_s=max(1.0, self.health.window / 4))
            self.health.watch("kafka", lambda: probe.last_ok, detail=lambda: probe.error)
        web = webconfig.load("CHRONOS_METRICS_WEB_CONFIG_FILE", self.settings.metrics_web_config_file or "")
        host = self.settings.metrics_address
        try:
            self.server = MetricsServer((host, self.port), self.exposed(), self.health_report, self.liveness_report,
                                        web)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on port {self.port} of {host} (CHRONOS_METRICS_PORT, "
                              f"CHRONOS_METRICS_ADDRESS): {exc.strerror or exc}") from None
        if self.probe is not None:
            self.probe.start()
        self.server.start()
        log.info("serving /metrics and /healthz on port %d (%s, %s%s)", self.port, host, self.server.scheme,
                 ", /metrics with a password" if web.users else "")

    def announce(self, store: Any, now: float) -> None:
        """While serving, say in the store where this process serves /metrics (`ports.Presence`), at most every
        ANNOUNCE_EVERY_S (`now`: `time.monotonic()`), from the thread that uses `store`: the console and `chronos
        status` find every process of every host there. Its address is CHRONOS_METRICS_ADDRESS, or where that
        is every interface, this host's on its way to PostgreSQL. A failure waits for the next time."""
        if self.server is None or now < self.next_announce.get(id(store), 0.0):
            return
        self.next_announce[id(store)] = now + ANNOUNCE_EVERY_S
        address = None if self.settings.metrics_address in WILDCARDS else self.settings.metrics_address
        try:
            url = store.announce(self.role, self.server.scheme, self.port, address)
        except StoreRejected as exc:  # a schema before version 10, until `chronos migrate` brings it
            if not self.announce_refused:
                log.info("cannot say where this process serves /metrics (%s): the console and chronos status find "
                         "it once the schema is at version 10", exc)
            self.announce_refused = True
            return
        except StoreUnavailable as exc:  # the role's own statements say PostgreSQL is away; tried again later
            log.debug("could not say where this process serves /metrics: %s", exc)
            return
        if self.announced != url:
            log.info("told PostgreSQL this process serves %s", url)
        self.announced, self.announce_refused = url, False
        self.announced_in.add(id(store))

    def withdraw(self, store: Any) -> None:
        """Take back what `announce` said in `store` (the process stops); a failure leaves the row to age out."""
        if id(store) not in self.announced_in:
            return
        try:
            store.withdraw()
        except (StoreRejected, StoreUnavailable) as exc:
            log.debug("could not take back where this process served /metrics: %s", exc)
        self.announced_in.discard(id(store))
        if not self.announced_in:
            self.announced = None

    def close(self) -> None:
        if self.probe is not None:
            self.probe.stop()
        if self.server is not None:
            self.server.close()
            self.server = None


class _Behind:
    """`chronos_consumer_lag_seconds`, computed at scrape time, so that it grows while the consumer's loop
    stands still (waiting on a write that does not end) as well as while it reads too slowly."""

    NAME = "chronos_consumer_lag_seconds"
    HELP = ("how long ago the oldest input message this consumer has not read yet arrived on each input partition "
            "assigned to it, estimated from its end as the consumer's fetches saw it every 5 s (0 when it has "
            "read everything; a lower bound for a partition it found already behind)")

    def __init__(self, telemetry: "ConsumerTelemetry"):
        self.telemetry = telemetry

    def describe(self) -> Iterable[GaugeMetricFamily]:
        yield GaugeMetricFamily(self.NAME, self.HELP, labels=("role", "node", "partition"))

    def collect(self) -> Iterable[GaugeMetricFamily]:
        t = self.telemetry
        family = GaugeMetricFamily(self.NAME, self.HELP, labels=("role", "node", "partition"))
        now = t.health.clock()
        for partition, lag in sorted(t.behind.items()):
            family.add_metric([t.role, t.node, str(partition)], lag.seconds(now))
        yield family


FIRED = ("chronos_messages_fired_total", "messages published to their destination and acknowledged by Kafka "
         "(by a consumer: messages already due on arrival)")


class ConsumerTelemetry(Telemetry):
    role = "consumer"
    steps = ("insert", "publish")
    totals = {
        "consumed": ("chronos_messages_consumed_total", "messages read from the input topic"),
        "enqueued": ("chronos_messages_enqueued_total", "messages written to the store (new ids)"),
        "late": FIRED,
        "duplicates": ("chronos_messages_duplicate_total", "messages ignored because their id was already waiting"),
        "replaced": ("chronos_messages_replaced_total", "waiting messages replaced (chronosAction: replace)"),
        "cancelled": ("chronos_messages_cancelled_total", "waiting messages cancelled (chronosAction: cancel)"),
        "cancelled_in_flight": ("chronos_messages_cancelled_in_flight_total",
                                "cancels that found the message already held by a firer: deleted, but it "
                                "may still be delivered"),
        "parked": PARKED,
        "forwarded": ("chronos_messages_forwarded_total", "cancels and replaces read in another cell than their "
                      "message's, forwarded there and reaching it (cells)"),
    }

    def __init__(self, node_id: uuid.UUID | str, settings: Settings, environ: Mapping[str, str] | None = None):
        super().__init__(node_id, settings, environ)
        self.count_dead_letters(CONSUMER_REASONS)
        self.lag = Gauge("chronos_consumer_lag_messages",
                         "input messages past this consumer's position on each input partition assigned to it: "
                         "the high watermark of its last fetch less what it has read (a partition not fetched "
                         "yet counts 0; none out of the group)", ("role", "node", "partition"),
                         registry=self.registry)
        self.lag_shown: set[int] = set()
        self.behind: dict[int, PartitionLag] = {}   # replaced whole by the loop, read by the metrics' thread
        self.registry.register(_Behind(self))
        self.assigned = self.gauge("chronos_consumer_partitions", "input partitions assigned to this consumer")
        self.clock_offset = self.gauge("chronos_consumer_clock_offset_seconds",
                                       "database clock minus this host's clock, as last measured (every 10 s): "
                                       "a consumer publishes at once what is due by this host's clock")

    def follow_cells(self, cells: Iterable[str], paused: Callable[[str], bool]) -> None:
        """With cells: whether this consumer holds each cell's partitions paused (`paused(cell)`, read at
        scrape time) because the cell does not answer it."""
        gauge = Gauge("chronos_consumer_cell_paused", "1 while this consumer holds the input partitions of a cell "
                      "paused because the cell's PostgreSQL does not answer it (its messages wait on the input "
                      "topic), else 0", ("role", "node", "cell"), registry=self.registry)
        for cell in cells:
            gauge.labels(self.role, self.node, cell).set_function(functools.partial(lambda c: float(paused(c)), cell))

    def consumer_lag(self, ends: Mapping[int, tuple[int, int]], now: float) -> None:
        """Each assigned input partition's position and end (partition -> (the offset the consumer reads
        next, the high watermark), negative where not known yet) at `now` (`time.monotonic()`): the
        messages and the time it is behind. A partition no longer assigned leaves both gauges, so that a
        sum over the consumers counts each partition once."""
        for gone in self.lag_shown - ends.keys():
            self.lag.remove(self.role, self.node, str(gone))
        behind = {}
        for partition, (position, end) in ends.items():
            messages = max(0, end - position) if position >= 0 and end >= 0 else 0
            self.lag.labels(self.role, self.node, str(partition)).set(messages)
            behind[partition] = self.behind.get(partition) or PartitionLag()
            behind[partition].sample(now, position, end)
        self.behind = behind
        self.lag_shown = set(ends)
        self.assigned.set(len(ends))


class FirerTelemetry(Telemetry):
    role = "firer"
    steps = ("claim", "publish", "delete")
    totals = {
        "claimed": ("chronos_messages_claimed_total", "rows claimed from the store"),
        "fired": FIRED,
        "vanished": ("chronos_messages_vanished_total",
                     "published rows no longer this firer's to delete (a peer took them over)"),
        "released": ("chronos_messages_released_total",
                     "held rows handed back unpublished (Kafka did not answer, or shutdown)"),
        "retried": ("chronos_messages_retried_total",
                    "publishes refused by the destination, handed back to be tried again after a backoff"),
        "expired": ("chronos_messages_expired_total",
                    "held rows handed back unpublished because they were claimed too long ago to be this firer's "
                    "still (it was stopped or starved): a peer fires them"),
        "parked": PARKED,
    }

    def __init__(self, node_id: uuid.UUID | str, settings: Settings, environ: Mapping[str, str] | None = None):
        super().__init__(node_id, settings, environ)
        self.count_dead_letters(FIRER_REASONS)
        self.lateness = Histogram("chronos_fire_lateness_seconds",
                                  "Kafka acknowledgement time minus deadline, per fired message",
                                  ("role", "node"), buckets=LATENESS_BUCKETS,
                                  registry=self.registry).labels(self.role, self.node)
        self._lateness_bounds = list(self.lateness._upper_bounds)  # prometheus_client appends +Inf
        # the metric's name says "outstanding" (dashboards use it); the rows are "held"
        self.held = self.gauge("chronos_firer_outstanding_rows",
                               "rows this firer holds (claimed, not settled yet): waiting for their time, or "
                               "published and waiting for Kafka's acknowledgement")
        self.publish_latency = self.gauge("chronos_firer_publish_latency_seconds",
                                          "moving average of publish-to-acknowledgement time (the advance used)")
        self.clock_offset = self.gauge("chronos_firer_clock_offset_seconds",
                                       "database clock minus local clock, as last measured")

    def loop_period(self) -> float:
        return max(1.0, self.settings.poll_interval_ms / 1000.0)

    def fired(self, lateness: list[float]) -> None:
        """Observe the fire lateness (seconds) of messages acknowledged together: as many
        `Histogram.observe` calls would, with one locked increment per bucket touched instead of two
        per message (a quarter of the firer's per-message cost)."""
        if not lateness:
            return
        buckets = collections.Counter(map(functools.partial(bisect.bisect_left, self._lateness_bounds), lateness))
        self.lateness._sum.inc(sum(lateness))
        for i, count in buckets.items():
            self.lateness._buckets[i].inc(count)

    def follow_timing(self, held: Callable[[], float], timing: Any) -> None:
        """Read the firer's own state at scrape time: rows it holds, and its `PublishTiming`."""
        self.held.set_function(held)
        self.publish_latency.set_function(lambda: timing.latency)
        self.clock_offset.set_function(lambda: timing.offset_us / 1e6)


class DetectorTelemetry(Telemetry):
    role = "detector"
    steps = ("scan",)
    totals = {"reset": ("chronos_messages_reset_total", "rows held past the hold time and handed back to the firers")}

    def __init__(self, node_id: uuid.UUID | str, settings: Settings, environ: Mapping[str, str] | None = None):
        super().__init__(node_id, settings, environ)
        # the store gauges: exported by the one detector that reads them for every detector of its database
        # (`DetectorProcess.refresh_gauges`), so families whose series come and go with that turn
        self.store_families = {field: Gauge(name, doc, ("role", "node"), registry=self.registry) for field, name, doc in (
            ("waiting", "chronos_rows_waiting", "rows waiting for their deadline, not claimed "
             "(an estimate on a very large table, see chronos_rows_waiting_estimated)"),
            ("waiting_estimated", "chronos_rows_waiting_estimated", "1 when chronos_rows_waiting is the planner's estimate"),
            ("due", "chronos_rows_due", "rows whose deadline has passed and no firer claimed yet"),
            # named "in flight" (dashboards and alert rules use it): the rows held by the firers
            ("in_flight", "chronos_rows_in_flight", "rows held by a firer: claimed, not fired or handed back yet"),
            ("past_hold_time", "chronos_rows_past_hold_time", "rows held longer than the hold time (suspected failures)"),
            ("oldest_overdue_s", "chronos_oldest_overdue_seconds", "how late the most overdue unfired row is (0 when none)"),
            ("schedules", "chronos_recurring_schedules", "recurring (cron) schedules in the store"),
            ("parked", "chronos_rows_parked", "messages kept in chronos_parked: neither their destination "
             "nor the dead-letter topic accepted them (an operator should look)"),
            ("read_at", "chronos_store_gauges_timestamp_seconds",
             "when the chronos_rows_* gauges were last read from the store (unix time)"))}
        self.throttled = Gauge("chronos_throttled_rows", "due rows of a rate-limited destination topic held back "
                               "by its fire-rate limit (not claimed yet)", ("role", "node", "topic"),
                               registry=self.registry)
        self.throttled_lateness = Gauge("chronos_throttled_lateness_seconds", "how late the oldest held-back row "
                                        "of a rate-limited destination topic is (0 when none)",
                                        ("role", "node", "topic"), registry=self.registry)
        self.actions: Mapping[str, tuple[int, int]] = {}   # read with the store gauges
        self.registry.register(ActionTotals(self.role, self.node, lambda: self.actions))
        stats_file = (os.environ if environ is None else environ).get(STATS_ENV)
        if stats_file:  # under `chronos up` with its embedded broker
            self.registry.register(EmbeddedBroker(self.role, self.node, stats_file))

    def loop_period(self) -> float:
        return max(1.0, self.settings.failure_detection_interval_ms / 1000.0)

    def store_gauges(self, overview: Any) -> None:
        """Set the store gauges from a `store.Overview`."""
        values = {"waiting": overview.waiting, "waiting_estimated": 1 if overview.waiting_estimated else 0,
                  "due": overview.due, "in_flight": overview.in_flight, "past_hold_time": overview.past_hold_time,
                  "oldest_overdue_s": overview.oldest_overdue_s or 0.0, "schedules": overview.schedules or 0,
                  "parked": overview.parked or 0, "read_at": time.time()}
        for field, family in self.store_families.items():
            family.labels(self.role, self.node).set(values[field])

    def withhold_store_gauges(self) -> None:
        """Export no store gauges (nor the throttled ones): another detector reads them for this one."""
        for family in self.store_families.values():
            family.remove(self.role, self.node)
        self.throttled_gauges(())

    def throttled_gauges(self, throttled: Iterable[Any]) -> None:
        """Set the per-topic throttled gauges from `store.Throttled` values; a topic no longer
        listed (no firer limited it in the last minute) drops out."""
        self.throttled.clear()
        self.throttled_lateness.clear()
        for t in throttled:
            self.throttled.labels(self.role, self.node, t.topic).set(t.rows)
            self.throttled_lateness.labels(self.role, self.node, t.topic).set(t.lateness_s)
