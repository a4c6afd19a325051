"""The collectors of a process's metrics read at scrape time, not counted on the hot path: its own running
totals, the operator actions counted in the store, the embedded broker's stats file, its producers'
replacements and its connections to PostgreSQL (chronos.telemetry.metrics registers them)."""

from __future__ import annotations

import collections
from typing import Any, Callable, Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from chronos.adapters.kafka.brokerstats import read_stats
from chronos.domain.operators import ACTIONS, PARKED_ACTIONS


class Totals:
    """Counters read at scrape time from a process's own running totals: no work on the hot path."""

    def __init__(self, role: str, node: str, names: Mapping[str, tuple[str, str]],
                 totals: Callable[[], Mapping[str, int]]):
        self.labels = (role, node)
        self.names, self.totals = names, totals

    def describe(self) -> Iterable[CounterMetricFamily]:
        for name, doc in self.names.values():
            yield CounterMetricFamily(name, doc, labels=("role", "node"))

    def collect(self) -> Iterable[CounterMetricFamily]:
        values = self.totals()
        for key, (name, doc) in self.names.items():
            family = CounterMetricFamily(name, doc, labels=("role", "node"))
            family.add_metric(self.labels, values.get(key, 0))
            yield family


class ActionTotals:
    """Operator actions (cancel, fire-now, reschedule; parked messages replayed and dropped) as counted in
    the store's chronos_actions table: the CLI that takes them lives for a second, so the detector exports
    the store's totals, each action from zero before it is first taken."""

    ACTIONS = (*ACTIONS, *PARKED_ACTIONS)

    def __init__(self, role: str, node: str, totals: Callable[[], Mapping[str, tuple[int, int]]]):
        self.labels = (role, node)
        self.totals = totals

    def describe(self) -> Iterable[CounterMetricFamily]:
        return self._families({})

    def collect(self) -> Iterable[CounterMetricFamily]:
        return self._families(self.totals())

    def _families(self, totals: Mapping[str, tuple[int, int]]) -> list[CounterMetricFamily]:
        taken = CounterMetricFamily("chronos_operator_actions_total",
                                    "operator actions taken (chronos cancel, fire-now, reschedule, parked replay and "
                                    "drop), from the store",
                                    labels=("role", "node", "action"))
        changed = CounterMetricFamily("chronos_operator_action_messages_total",
                                      "messages changed by operator actions, from the store",
                                      labels=("role", "node", "action"))
        for action in sorted(set(self.ACTIONS) | set(totals)):
            n, m = totals.get(action, (0, 0))
            taken.add_metric([*self.labels, action], n)
            changed.add_metric([*self.labels, action], m)
        return [taken, changed]


class EmbeddedBroker:
    """The embedded broker as `chronos up` last sampled it (its stats file, read at scrape time): its
    memory, the messages it holds, its restarts and what they lost. Nothing without a stats file."""

    GAUGES = {
        "rss_bytes": ("chronos_embedded_broker_rss_bytes", "resident memory of the embedded broker (it frees no message)"),
        "messages": ("chronos_embedded_broker_messages", "messages the embedded broker holds in memory, all topics"),
        "input_unread": ("chronos_embedded_broker_unread_input_messages",
                         "input messages past the consumer group's committed offsets (lost if the broker dies)"),
        "warning_bytes": ("chronos_embedded_broker_memory_warning_bytes",
                          "memory above which chronos up warns about the embedded broker"),
        "sampled_at": ("chronos_embedded_broker_sampled_timestamp_seconds",
                       "when chronos up last read the embedded broker's offsets (unix time)"),
    }
    COUNTERS = {
        "restarts": ("chronos_embedded_broker_restarts_total", "times chronos up started a dead embedded broker again"),
        "lost_input": ("chronos_embedded_broker_lost_input_messages_total",
                       "input messages not yet read that died with the embedded broker (about: from the last sample)"),
    }

    def __init__(self, role: str, node: str, path: str):
        self.labels, self.path = (role, node), path

    def describe(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        return []  # the families exist only while the file does

    def collect(self) -> Iterable[GaugeMetricFamily | CounterMetricFamily]:
        stats = read_stats(self.path)
        if stats is None:
            return
        for key, (name, doc) in self.GAUGES.items():
            if isinstance(stats.get(key), (int, float)):
                yield self._one(GaugeMetricFamily, name, doc, stats[key])
        for key, (name, doc) in self.COUNTERS.items():
            yield self._one(CounterMetricFamily, name, doc, stats.get(key) or 0)

    def _one(self, kind, name: str, doc: str, value: float):
        family = kind(name, doc, labels=("role", "node"))
        family.add_metric(self.labels, value)
        return family


class ProducerReplacements:
    """How often a process replaced its Kafka producer, by why: `fault` (the producer itself was refused:
    fenced, forgotten, ...) or `stall` (nothing acknowledged for CHRONOS_PUBLISH_STALL_MS)."""

    NAME = "chronos_producer_replacements_total"
    HELP = "Kafka producers replaced: fault (the broker refused the producer itself), stall (nothing acknowledged)"

    def __init__(self, role: str, node: str, replacements: Mapping[str, int]):
        self.labels = (role, node)
        self.replacements = replacements

    def describe(self) -> Iterable[CounterMetricFamily]:
        yield CounterMetricFamily(self.NAME, self.HELP, labels=("role", "node", "reason"))

    def collect(self) -> Iterable[CounterMetricFamily]:
        family = CounterMetricFamily(self.NAME, self.HELP, labels=("role", "node", "reason"))
        for reason, count in sorted(self.replacements.items()):
            family.add_metric([*self.labels, reason], count)
        yield family


class PostgresLinks:
    """The process's connections to PostgreSQL (`ports.Link` of each of its stores), read at scrape time:
    which server each is connected to, and how often they reconnected, reached another server (a
    failover, a switchover), gave up a statement the server did not answer, or found it read-only."""

    COUNTERS = {
        "connects": ("chronos_postgres_connects_total", "connections opened to PostgreSQL (the first ones included)"),
        "server_changes": ("chronos_postgres_server_changes_total",
                           "connections that reached another server than the one before: a failover or switchover"),
        "unanswered": ("chronos_postgres_unanswered_total",
                       "statements PostgreSQL did not answer within CHRONOS_DATABASE_TIMEOUT_MS: the connection "
                       "was dropped (a hung server, a network partition)"),
        "read_only": ("chronos_postgres_read_only_total",
                      "connections dropped because their server had become read-only (a demoted primary)"),
    }
    CONNECTED = ("chronos_postgres_connected", "connections of this process open to each PostgreSQL server "
                 "(host:port as the URL names it); no series while none is open")

    def __init__(self, role: str, node: str, links: Callable[[], Iterable[Any]],
                 cells: Callable[[], Mapping[str, Iterable[Any]]] | None = None):
        """`links()`: the links of the process's stores; or, for a consumer of several cells, `cells()`: each
        cell's, whose series then carry the cell."""
        self.labels, self.links, self.cells = (role, node), links, cells

    def describe(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        return self._families({})

    def collect(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        if self.cells is not None:
            return self._families({cell: list(links) for cell, links in self.cells().items()})
        return self._families({"": list(self.links())})

    def _families(self, by_cell: Mapping[str, list[Any]]) -> list[CounterMetricFamily | GaugeMetricFamily]:
        cell_label = ("cell",) if self.cells is not None else ()
        families: list[CounterMetricFamily | GaugeMetricFamily] = []
        for key, (name, doc) in self.COUNTERS.items():
            family = CounterMetricFamily(name, doc, labels=("role", "node", *cell_label))
            for cell, links in by_cell.items():
                family.add_metric([*self.labels, *([cell] if cell_label else [])],
                                  sum(getattr(link, key) for link in links))
            families.append(family)
        connected = GaugeMetricFamily(*self.CONNECTED, labels=("role", "node", *cell_label, "server"))
        for cell, links in by_cell.items():
            for server, count in sorted(collections.Counter(link.server for link in links if link.server).items()):
                connected.add_metric([*self.labels, *([cell] if cell_label else []), server], count)
        families.append(connected)
        return families
