"""Which PostgreSQL server each process says it uses: the `chronos_postgres_*` series of its /metrics
(chronos.telemetry.collectors `PostgresLinks`), read back for `chronos status` and the console.

The server's own side (its role, its standbys, the processes' sessions on it) is
`Store.server_view`; this module is the processes' side, so the two can be put together: a
process connected to another server than the one status or the console reached (after a failover,
a process still on the old primary), or to none.
"""

from __future__ import annotations

import collections
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from prometheus_client.parser import text_string_to_metric_families

from chronos.telemetry.scrape import Scraper

log = logging.getLogger("chronos.status")

PREFIX = "chronos_postgres_"
CONNECTED = "chronos_postgres_connected"
_COUNTERS = {"chronos_postgres_connects_total": "connects", "chronos_postgres_server_changes_total": "server_changes",
             "chronos_postgres_unanswered_total": "unanswered", "chronos_postgres_read_only_total": "read_only"}

SCRAPE_TIMEOUT_S = 1.0  # a process that takes longer is listed as not answering


@dataclass(frozen=True)
class Reported:
    """What one process reports of its connections to PostgreSQL (totals since it started)."""

    role: str
    node: str
    servers: tuple[tuple[str, int], ...] = ()   # (server "host:port", connections open to it), by server
    connects: int = 0
    server_changes: int = 0
    unanswered: int = 0
    read_only: int = 0

    @property
    def connections(self) -> int:
        return sum(n for _, n in self.servers)

    @property
    def reconnects(self) -> int:
        """Connections opened beyond those open now: each one replaced a connection that was lost."""
        return max(0, self.connects - self.connections)

    def on(self, server: str | None) -> bool:
        """Whether every connection it has open is to `server` (False with none open)."""
        return bool(self.servers) and all(s == server for s, _ in self.servers)


@dataclass(frozen=True)
class Asked:
    """One process's /metrics, asked once: whether it answered, and what it reported (when it did not
    answer: what it reported the last time it did, if ever)."""

    url: str
    answered: bool
    reported: tuple[Reported, ...] = ()


def reported_from(samples: Iterable[Any]) -> tuple[Reported, ...]:
    """The processes' connections from the samples of a scrape (`prometheus_client` samples of the
    `chronos_postgres_*` families; others are ignored), one `Reported` per role and node (a consumer of several
    cells reports each cell's connections: they are added up)."""
    servers: dict[tuple[str, str], collections.Counter[str]] = collections.defaultdict(collections.Counter)
    counters: dict[tuple[str, str], collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for sample in samples:
        key = (sample.labels.get("role", ""), sample.labels.get("node", ""))
        if sample.name == CONNECTED:
            if sample.value > 0:
                servers[key][sample.labels.get("server", "?")] += int(sample.value)
        elif sample.name in _COUNTERS:
            counters[key][_COUNTERS[sample.name]] += int(sample.value)
    return tuple(Reported(role, node, tuple(sorted(servers[(role, node)].items())), **counters[(role, node)])
                 for role, node in sorted(set(servers) | set(counters)))


def parse(text: str) -> tuple[Reported, ...]:
    """`reported_from` a Prometheus text scrape; only its `chronos_postgres_*` lines are parsed."""
    lines = "\n".join(line for line in text.splitlines() if line.startswith(PREFIX))
    return reported_from(s for family in text_string_to_metric_families(lines + "\n") for s in family.samples)


def unique(asked: Sequence[Asked]) -> list[Asked]:
    """Each process once: one that answered at two URLs (a listed one, and the address it gave PostgreSQL)
    is kept at the first."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for a in asked:
        processes = {(r.role, r.node) for r in a.reported}
        if processes & seen:
            continue
        seen |= processes
        kept.append(a)
    return kept


def ask(urls: Sequence[str], timeout: float = SCRAPE_TIMEOUT_S, scraper: Scraper | None = None) -> list[Asked]:
    """Scrape every URL at once, each within `timeout` seconds (as `scraper` says: TLS, a password); in the
    order given."""
    if not urls:
        return []
    scraper = scraper or Scraper()
    with ThreadPoolExecutor(max_workers=min(16, len(urls)), thread_name_prefix="scrape") as pool:
        return list(pool.map(lambda url: _ask(scraper, url, timeout), urls))


def _ask(scraper: Scraper, url: str, timeout: float) -> Asked:
    try:
        return Asked(url, True, parse(scraper.text(url, timeout)))
    except (OSError, ValueError) as exc:  # refused, timed out, not Prometheus text: it did not answer
        log.debug("no metrics from %s: %s", url, exc)
        return Asked(url, False)
