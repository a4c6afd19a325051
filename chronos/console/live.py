"""What the overview shows live: the store read at most once a second for every client, and the
processes' rates and lateness from their /metrics.

Pure logic (scrape parsing, windowed rates, quantiles, SVG) sits beside the two small async
readers that call it; nothing here imports the web framework, so it tests without one.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence
from xml.sax.saxutils import escape

from prometheus_client.parser import text_string_to_metric_families

from chronos.ops import servers, status
from chronos.errors import ChronosError
from chronos.logs import Throttle
from chronos.telemetry.scrape import Scraper

log = logging.getLogger("chronos.console")

IN = "chronos_messages_consumed_total"
FIRED = "chronos_messages_fired_total"
DEAD = "chronos_messages_dead_lettered_total"
LATENESS = "chronos_fire_lateness_seconds_bucket"
STALLED = "chronos_publishing_stalled_seconds"
_WANTED = (IN, FIRED, DEAD, LATENESS, STALLED, servers.PREFIX)

WINDOW_S = 300.0        # the lateness distribution and the rate chart cover the last 5 minutes
RATE_OVER_S = 5.0       # the rates shown are averaged over about this long
QUANTILES = (("p50", 0.5), ("p99", 0.99), ("p999", 0.999))


# -- one scrape --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scrape:
    """The counters of one process that the overview needs (totals since it started)."""

    consumed: float = 0.0
    fired: float = 0.0
    dead: float = 0.0
    buckets: tuple[tuple[float, float], ...] = ()   # (upper bound, cumulative count), +Inf last
    stalled: float = 0.0                             # seconds its publishing has stalled (0: it has not)
    links: tuple[servers.Reported, ...] = ()         # its connections to PostgreSQL

    @property
    def processes(self) -> frozenset[tuple[str, str]]:
        """The (role, node) of the process that answered: every process reports its PostgreSQL links."""
        return frozenset((r.role, r.node) for r in self.links)


def parse_scrape(text: str) -> Scrape:
    """The console's counters from a Prometheus text scrape; only the few lines it needs are parsed."""
    lines = "\n".join(line for line in text.splitlines() if line.startswith(_WANTED))
    totals = {IN: 0.0, FIRED: 0.0, DEAD: 0.0}
    buckets: dict[float, float] = {}
    stalled = 0.0
    links = []
    for family in text_string_to_metric_families(lines + "\n"):
        for sample in family.samples:
            if sample.name.startswith(servers.PREFIX):
                links.append(sample)
            elif sample.name in totals:
                totals[sample.name] += sample.value
            elif sample.name == STALLED:
                stalled = max(stalled, sample.value)
            elif sample.name == LATENESS:
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
    return Scrape(totals[IN], totals[FIRED], totals[DEAD], tuple(sorted(buckets.items())), stalled,
                  servers.reported_from(links))


# -- history of scrapes ------------------------------------------------------------------------

@dataclass
class Step:
    """What happened between two samples, summed over every process that answered both times."""

    at: float
    seconds: float
    consumed: float
    fired: float
    dead: float
    buckets: list[float]     # per-bucket counts (not cumulative), in the order of `History.bounds`


def _delta(new: float, old: float) -> float:
    # a counter that went down belongs to a restarted process: all it counted is new
    return new - old if new >= old else new


@dataclass
class History:
    """Deltas between successive samples over the last `window` seconds, with running sums."""

    window: float = WINDOW_S
    bounds: tuple[float, ...] = ()
    steps: collections.deque = field(default_factory=collections.deque)
    last: dict[str, tuple[float, Scrape]] = field(default_factory=dict)
    sums: list[float] = field(default_factory=list)
    sources_up: int = 0
    sources: int = 0
    answered: dict[str, bool] = field(default_factory=dict)   # per URL, in the last round

    def add(self, now: float, scrapes: dict[str, Scrape | None]) -> None:
        """Record one round of scrapes (None: that process did not answer) taken at `now`. A process that
        answered at two URLs (one of CHRONOS_CONSOLE_METRICS_URLS, and the address it gave PostgreSQL) is
        counted at the first only."""
        seen: set[tuple[str, str]] = set()
        unique: dict[str, Scrape | None] = {}
        for url, scrape in scrapes.items():
            if scrape is not None and scrape.processes:
                if scrape.processes & seen:
                    continue
                seen |= scrape.processes
            unique[url] = scrape
        scrapes = unique
        for gone in self.last.keys() - scrapes.keys():  # no longer asked: a process gone, or a duplicate
            del self.last[gone]
        self.sources = len(scrapes)
        self.sources_up = sum(1 for s in scrapes.values() if s is not None)
        self.answered = {url: s is not None for url, s in scrapes.items()}
        step = Step(now, 0.0, 0.0, 0.0, 0.0, [0.0] * len(self.bounds))
        seconds = []
        for url, scrape in scrapes.items():
            if scrape is None:
                continue  # the next answer is counted against the last one, so nothing is lost
            if scrape.buckets and not self.bounds:
                self._set_bounds(tuple(b for b, _ in scrape.buckets))
                step.buckets = [0.0] * len(self.bounds)
            before = self.last.get(url)
            self.last[url] = (now, scrape)
            if before is None:
                continue
            then, old = before
            seconds.append(now - then)
            step.consumed += _delta(scrape.consumed, old.consumed)
            step.fired += _delta(scrape.fired, old.fired)
            step.dead += _delta(scrape.dead, old.dead)
            if self.bounds and len(scrape.buckets) == len(self.bounds) == len(old.buckets):
                restarted = scrape.buckets[-1][1] < old.buckets[-1][1]
                prev = 0.0
                for i, ((_, new), (_, was)) in enumerate(zip(scrape.buckets, old.buckets)):
                    cumulative = new if restarted else new - was
                    step.buckets[i] += cumulative - prev
                    prev = cumulative
        if not seconds:
            return
        step.seconds = max(seconds)
        self.steps.append(step)
        for i, n in enumerate(step.buckets):
            self.sums[i] += n
        while self.steps and self.steps[0].at <= now - self.window:
            gone = self.steps.popleft()
            for i, n in enumerate(gone.buckets):
                self.sums[i] -= n

    def _set_bounds(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.sums = [0.0] * len(bounds)

    def rates(self, over: float = RATE_OVER_S) -> dict[str, float] | None:
        """Messages per second (in, fired, dead-lettered) over the last `over` seconds, or None."""
        if not self.steps:
            return None
        last = self.steps[-1].at
        recent = [s for s in self.steps if s.at > last - over] or [self.steps[-1]]
        seconds = sum(s.seconds for s in recent) or 1.0
        return {"in": sum(s.consumed for s in recent) / seconds, "fired": sum(s.fired for s in recent) / seconds,
                "dead": sum(s.dead for s in recent) / seconds}

    def stalled(self) -> tuple[int, float]:
        """How many processes said, when last asked, that their publishing has stalled, and the
        longest stall."""
        stalls = [scrape.stalled for _, scrape in self.last.values() if scrape.stalled > 0]
        return len(stalls), max(stalls, default=0.0)

    def asked(self) -> list[servers.Asked]:
        """Each process's connections to PostgreSQL as it last reported them, and whether it answered
        the last round (a silent one keeps what it said before, so it is still known by name)."""
        return [servers.Asked(url, answered, self.last[url][1].links if url in self.last else ())
                for url, answered in self.answered.items()]

    def series(self) -> list[tuple[float, float, float]]:
        """(time, in per second, fired per second) of every step in the window, for the chart."""
        return [(s.at, s.consumed / s.seconds, s.fired / s.seconds) for s in self.steps if s.seconds > 0]

    def lateness(self) -> dict[str, Any] | None:
        """The window's lateness distribution: count, quantiles (seconds) and per-bucket counts."""
        if not self.bounds:
            return None
        counts = [max(0.0, c) for c in self.sums]
        total = sum(counts)
        out: dict[str, Any] = {"count": int(round(total)), "bounds": list(self.bounds),
                               "counts": [int(round(c)) for c in counts],
                               "window_s": min(self.window, sum(s.seconds for s in self.steps))}
        for name, q in QUANTILES:
            out[name] = quantile(self.bounds, counts, q) if total else None
        return out


def quantile(bounds: Sequence[float], counts: Sequence[float], q: float) -> float:
    """The q-quantile of a histogram (upper bounds, per-bucket counts), interpolated linearly
    inside the bucket that holds it, as Prometheus's histogram_quantile does. The first bucket
    has no lower bound (its upper bound is returned); the +Inf bucket returns the last finite bound."""
    total = sum(counts)
    rank = q * total
    seen = 0.0
    for i, (bound, n) in enumerate(zip(bounds, counts)):
        if n and seen + n >= rank:
            if math.isinf(bound):
                return bounds[i - 1] if i else 0.0
            if i == 0:
                return bound
            low = bounds[i - 1]
            return low + (bound - low) * ((rank - seen) / n)
        seen += n
    finite = [b for b in bounds if not math.isinf(b)]
    return finite[-1] if finite else 0.0


# -- charts (server-rendered SVG: the console needs no script library and no internet) ------------

def _bound_label(bound: float) -> str:
    if math.isinf(bound):
        return "more"
    ms = bound * 1000
    if abs(ms) >= 1000:
        return f"{bound:g}s"
    return f"{ms:g}ms"


def histogram_svg(lateness: dict[str, Any] | None, width: int = 640, height: int = 170) -> str:
    """Bars of fired messages per lateness bucket (label: the bucket's upper bound)."""
    if not lateness or not lateness["count"]:
        return (f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="no lateness yet">'
                f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" class="muted">'
                f'no message fired in the window</text></svg>')
    counts, bounds = lateness["counts"], lateness["bounds"]
    top = max(counts) or 1
    slot = width / len(counts)
    plot = height - 34
    parts = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="lateness histogram">']
    for i, (n, bound) in enumerate(zip(counts, bounds)):
        h = 0 if not n else max(1.0, plot * n / top)
        x = i * slot + 2
        label = escape(_bound_label(bound))
        parts.append(f'<rect class="bar{" early" if bound <= 0 else ""}" x="{x:.1f}" y="{10 + plot - h:.1f}" '
                     f'width="{slot - 4:.1f}" height="{h:.1f}"><title>≤ {label}: {n:,}</title></rect>')
        if slot >= 44 or i % 2 == 0:  # narrow bars: label every other one so labels do not run together
            parts.append(f'<text x="{x + (slot - 4) / 2:.1f}" y="{height - 12}" text-anchor="middle" '
                         f'class="axis">{label}</text>')
    parts.append("</svg>")
    return "".join(parts)


def rates_svg(series: list[tuple[float, float, float]], now: float, window: float = WINDOW_S,
              width: int = 640, height: int = 120) -> str:
    """Two lines over the window: messages in and fired per second."""
    if len(series) < 2:
        return (f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="no rates yet">'
                f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" class="muted">'
                f'collecting rates</text></svg>')
    top = max(max(i, f) for _, i, f in series) or 1.0
    plot = height - 20

    def line(index: int) -> str:
        return " ".join(f"{width * (1 - (now - p[0]) / window):.1f},{10 + plot * (1 - p[index] / top):.1f}"
                        for p in series)
    return (f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="rates">'
            f'<polyline class="line-in" points="{line(1)}"/><polyline class="line-fired" points="{line(2)}"/>'
            f'<text x="4" y="12" class="axis">{top:,.{0 if top >= 10 else 1}f}/s</text>'
            f'<text x="4" y="{height - 2}" class="axis">{window / 60:g} min ago</text>'
            f'<text x="{width - 4}" y="{height - 2}" text-anchor="end" class="axis">now</text></svg>')


# -- the readers -------------------------------------------------------------------------------

class MetricsSampler:
    """Scrapes every process's /metrics into a `History`: every second while someone watches the
    overview, every `idle_every` seconds otherwise (so the window has history when a page opens).

    The processes are those of `urls` (CHRONOS_CONSOLE_METRICS_URLS) and those `discover` finds (the
    processes that said where they serve in PostgreSQL: every host's), asked again every `discover_every`
    seconds; a failed look keeps the processes found before."""

    def __init__(self, urls: Sequence[str], *, every: float = 1.0, idle_every: float = 10.0,
                 active_for: float = 5.0, timeout: float = 2.0, clock: Callable[[], float] = time.time,
                 scraper: Scraper | None = None, discover: Callable[[], Awaitable[list[str]]] | None = None,
                 discover_every: float = 10.0):
        self.configured = list(urls)
        self.urls = list(urls)
        self.discover, self.discover_every = discover, discover_every
        self.discovered_at: float | None = None
        self.scraper = scraper or Scraper()
        self.every, self.idle_every, self.active_for, self.timeout = every, idle_every, active_for, timeout
        self.clock = clock
        self.history = History()
        self.watched_at = 0.0
        self._wake = asyncio.Event()
        self.throttle = Throttle(log)

    def watched(self) -> None:
        """A client asked for the live overview: sample every second for a while."""
        idle = self.clock() - self.watched_at > self.active_for
        self.watched_at = self.clock()
        if idle:
            self._wake.set()

    async def find(self) -> None:
        """The URLs to scrape: the configured ones first, then those found, each once."""
        now = self.clock()
        if self.discover is None or (self.discovered_at is not None and now - self.discovered_at < self.discover_every):
            return
        self.discovered_at = now
        try:
            found = await self.discover()
        except ChronosError as exc:
            self.throttle.warning("discover", "cannot read the processes' /metrics addresses from PostgreSQL (%s); "
                                  "scraping those known before", exc)
            return
        self.urls = list(dict.fromkeys([*self.configured, *found]))

    async def sample(self) -> None:
        await self.find()
        urls = list(self.urls)
        results = await asyncio.gather(*(asyncio.to_thread(self._one, url) for url in urls))
        self.history.add(self.clock(), dict(zip(urls, results)))

    def _one(self, url: str) -> Scrape | None:
        try:
            return parse_scrape(self.scraper.text(url, self.timeout))
        except (OSError, ValueError) as exc:
            log.debug("no metrics from %s: %s", url, exc)
            return None

    async def run(self) -> None:
        if not self.urls and self.discover is None:
            return
        while True:
            try:
                await self.sample()
            except Exception as exc:  # noqa: BLE001 - a round that fails must not end the sampling for good
                self.throttle.warning("round", "a round of the processes' metrics failed (%s: %s); the live "
                                      "figures go on from the next", type(exc).__name__, exc)
            active = self.clock() - self.watched_at <= self.active_for
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self.every if active else self.idle_every)
            except asyncio.TimeoutError:
                pass


class CountPolicy:
    """How often the overview counts the waiting rows exactly: at most once a second, and no more
    often than keeps the count under `budget` of a core (on a large table the count is the only
    costly part of the overview; the other figures come off small indexes every second)."""

    def __init__(self, every: float = 1.0, budget: float = 0.01, longest: float = 30.0):
        self.least, self.budget, self.longest = every, budget, longest
        self.every = every
        self.counted_at: float | None = None

    def due(self, now: float) -> bool:
        return self.counted_at is None or now - self.counted_at >= self.every

    def counted(self, now: float, took: float) -> None:
        self.counted_at = now
        self.every = min(self.longest, max(self.least, took / self.budget))


class _EachCallLocked:
    """A store whose every method call takes `lock` for that call only."""

    def __init__(self, store: Any, lock: threading.Lock):
        self._store, self._lock = store, lock

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)

        def locked(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return method(*args, **kwargs)
        return locked


class StoreReader:
    """Runs store calls off the event loop, one at a time (a `Store` holds one connection), and
    keeps the overview for `ttl` seconds so that any number of open pages cost one read a second."""

    def __init__(self, store: Any, hold_time_ms: int, output_topic: str, *, ttl: float = 1.0,
                 clock: Callable[[], float] = time.monotonic):
        self.store, self.hold_time_ms, self.ttl, self.clock = store, hold_time_ms, ttl, clock
        self.output_topic = output_topic
        self.counting = CountPolicy(every=ttl)
        self._lock = threading.Lock()
        self._refresh = asyncio.Lock()
        self._cached: tuple[float, dict[str, Any] | None, str | None] | None = None
        self._waiting: tuple[int, bool] | None = None   # the last count: (rows, estimated)
        self._partitions: tuple[float, list[int] | None] | None = None  # the last read of the cell's list

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(store, *args) in a worker thread; raises what it raises (ChronosError subclasses)."""
        def run() -> Any:
            with self._lock:
                return fn(self.store, *args)
        return await asyncio.to_thread(run)

    async def call_between(self, fn: Callable[[Any], Any]) -> Any:
        """fn(store) in a worker thread, where `store` holds the lock for each of its calls only, not between
        them: an action that waits on Kafka between its statements (a replay) holds up no page's read."""
        return await asyncio.to_thread(fn, self.locked())

    def locked(self) -> Any:
        """The store, each of its calls holding the lock for that call only (`call_between`)."""
        return _EachCallLocked(self.store, self._lock)

    async def partitions(self) -> list[int] | None:
        """The input partitions this cell's database lists (none: it owns every one), or None when it does not
        answer; read at most once per `ttl`."""
        now = self.clock()
        if self._partitions is not None and now - self._partitions[0] < self.ttl:
            return self._partitions[1]
        try:
            listed: list[int] | None = [row.partition for row in await self.call(lambda s: s.cell_partitions())]
        except ChronosError:
            listed = None
        self._partitions = (now, listed)
        return listed

    async def overview(self) -> tuple[dict[str, Any] | None, str | None]:
        """(the store's overview as `chronos status --json` prints it, plus `waiting_age_s`, or None;
        the error, or None)."""
        async with self._refresh:
            now = self.clock()
            if self._cached is not None and now - self._cached[0] < self.ttl:
                return self._cached[1], self._cached[2]
            count = self._waiting is None or self.counting.due(now)
            try:
                started = time.monotonic()
                # exact=None: status's own rule (the planner's estimate on a huge table); the server's
                # view reads shared memory only (pg_stat_activity, pg_stat_replication)
                view, throttled, server = await self.call(lambda s: (
                    s.overview(self.hold_time_ms, exact=None if count else False), s.throttled(self.output_topic),
                    s.server_view()))
                took = time.monotonic() - started
                d = status.to_dict(view, self.hold_time_ms, throttled, status.broker_stats(None),
                                   status.postgres_dict(server, view.by_node))
                if count:
                    self.counting.counted(now, took)
                    self._waiting = (d["waiting"], d["waiting_estimated"])
                else:
                    assert self._waiting is not None  # `count` is set while there is no earlier count
                    d["waiting"], d["waiting_estimated"] = self._waiting
                d["waiting_age_s"] = round(now - (self.counting.counted_at or now), 3)
                result: tuple[dict[str, Any] | None, str | None] = (d, None)
            except ChronosError as exc:
                result = (None, str(exc))
            self._cached = (now, *result)
            return result

    def close(self) -> None:
        with self._lock:
            self.store.close()
