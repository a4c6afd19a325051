"""Fire-rate limits: how fast the firers together may publish to each destination topic.

`CHRONOS_FIRE_RATE_LIMITS` lists `PATTERN=RATE` pairs (`orders=500,payments.*=100/min`);
`CHRONOS_FIRE_RATE_DEFAULT` is the RATE of every topic no pattern matches. A RATE is messages
per second, or per minute or hour with `/min` or `/h`; `unlimited` exempts a topic from the
default. Each destination topic has its own token bucket in PostgreSQL (chronos_rate_limits),
shared by every firer: it refills at the rate and holds at most one second of it (at least one
message), so after a quiet spell a topic gets at most that burst before the rate applies.
With cells, each cell's firers take a share of every limit, by the input partitions the cell owns
(`cell_share`): its buckets refill at that part of each rate. Pure logic here (the rates, a cell's
share of them, and how one batch is shared between topics); the buckets are in the store adapters.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Callable, Sequence

from chronos.domain.cells import OPEN, CellPartition
from chronos.domain.model import Claimed
from chronos.codec.topics import MAX_TOPIC_LENGTH, TOPIC_CHARS
from chronos.errors import ConfigError

_PATTERN_RE = re.compile(f"[*{TOPIC_CHARS}]{{1,{MAX_TOPIC_LENGTH}}}")
_RATE_RE = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)\s*(?:/\s*(s|sec|min|m|h))?$")
_PER = {None: 1.0, "s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}
UNLIMITED = "unlimited"
BURST_SECONDS = 1.0   # a bucket holds this much of its rate


def parse_rate(name: str, raw: str) -> float | None:
    """A RATE as messages per second; None for `unlimited` or an empty value."""
    text = raw.strip().lower()
    if text in ("", UNLIMITED):
        return None
    match = _RATE_RE.match(text)
    if not match:
        raise ConfigError(f"{name}: {raw!r} is not a rate (messages per second like 500, or 100/min, 10/h, "
                          f"or unlimited)")
    rate = float(match.group(1)) / _PER[match.group(2)]
    if rate <= 0:
        raise ConfigError(f"{name}: a rate must be more than 0, got {raw!r} (use `unlimited` for no limit)")
    return rate


@dataclass(frozen=True)
class TopicRates:
    """`PATTERN=RATE` pairs in the order given; `str()` gives them back as the setting reads them."""

    entries: tuple[tuple[str, float | None], ...] = ()

    def __str__(self) -> str:
        return ",".join(f"{p}={UNLIMITED if r is None else f'{r:.17g}'}" for p, r in self.entries)

    def __bool__(self) -> bool:
        return bool(self.entries)


def parse_topic_rates(name: str, raw: str) -> TopicRates:
    """`orders=500,payments.*=100/min,audit=unlimited`: a topic name or a pattern with `*`, then a RATE."""
    entries: list[tuple[str, float | None]] = []
    for item in filter(None, (part.strip() for part in raw.split(","))):
        pattern, sep, rate = item.partition("=")
        pattern = pattern.strip()
        if not sep:
            raise ConfigError(f"{name} must be a list of TOPIC=RATE pairs, got {item!r}")
        if not _PATTERN_RE.fullmatch(pattern):
            raise ConfigError(f"{name}: {pattern!r} is not a topic name or pattern (letters, digits, . _ - and *)")
        if any(p == pattern for p, _ in entries):
            raise ConfigError(f"{name}: {pattern!r} is given twice")
        entries.append((pattern, parse_rate(name, rate)))
    return TopicRates(tuple(entries))


@dataclass(frozen=True)
class FireRateLimits:
    """The rate of each destination topic: its exact name first, then the first matching pattern,
    then the default. None means unlimited."""

    topics: TopicRates = TopicRates()
    default: float | None = None

    def __bool__(self) -> bool:
        """Whether any topic may be limited (else the firers claim as if this feature did not exist)."""
        return self.default is not None or any(r is not None for _, r in self.topics.entries)

    def __str__(self) -> str:
        default = "unlimited" if self.default is None else f"{self.default:g}/s"
        return f"{self.topics or 'none'} (messages per second), default {default}"

    def scaled(self, share: float) -> "FireRateLimits":
        """These limits, each rate times `share` (a cell's part of them: `cell_share`)."""
        return FireRateLimits(TopicRates(tuple((p, None if r is None else r * share) for p, r in self.topics.entries)),
                              None if self.default is None else self.default * share)

    def rate_for(self, topic: str) -> float | None:
        for pattern, rate in self.topics.entries:
            if pattern == topic:
                return rate
        for pattern, rate in self.topics.entries:
            if "*" in pattern and fnmatch.fnmatchcase(topic, pattern):
                return rate
        return self.default


def cell_share(listed: Sequence[CellPartition], partitions: int | None) -> float | None:
    """With cells, the share of every fire-rate limit a cell's firers take: the input partitions it owns open
    over the topic's (`partitions`), since its messages are its partitions'; so the cells' buckets together refill
    at each limit's rate. A cell that owns none takes one partition's share, for the rows it still holds (written
    before the map, or left by a partition moved away). None for the whole: a cell that lists nothing (the
    one cell of a deployment), or a partition count not known."""
    if not listed or not partitions:
        return None
    owned = sum(1 for p in listed if p.state == OPEN)
    return min(1.0, max(owned, 1) / partitions)


class CellLimits:
    """The fire-rate limits a firer's claims keep to: the deployment's (`whole`), or, with cells, its cell's share
    of them (`cell_share`), asked of `share` again every `every_s` seconds as partitions move between cells."""

    def __init__(self, whole: FireRateLimits, share: Callable[[], float | None] | None, every_s: float):
        self.whole = self.limits = whole
        self.ask, self.every_s = share, every_s
        self.share: float | None = None
        self.next_at = 0.0

    def current(self, now: float) -> FireRateLimits:
        """The limits to claim by, the share asked for again if it is time (`now`, a monotonic clock's seconds)."""
        if self.ask is not None and now >= self.next_at:
            self.next_at = now + self.every_s
            share = self.ask()
            if share != self.share:
                self.share = share
                self.limits = self.whole if share is None else self.whole.scaled(share)
        return self.limits


def capacity(rate: float) -> float:
    """How many tokens a topic's bucket holds at most: one second of its rate, at least one message."""
    return max(1.0, rate * BURST_SECONDS)


def claim_granted(reserve: Callable[[str, str | None, float, int], int], give_back: Callable[[str, float, int], None],
                  take: Callable[[str | None, int], list[Claimed]]) -> Callable[[str, str | None, float, int], list[Claimed]]:
    """A limited topic's claim (`claim_by_topic`'s `claim_granted`) whose tokens are set aside apart from the
    rows' claim: `reserve(name, topic, rate, at_most)` grants up to `at_most` tokens, `take(topic, n)` takes
    up to n due rows, and `give_back(name, rate, unused)` returns the tokens no row used."""
    def granted(name: str, topic: str | None, rate: float, share: int) -> list[Claimed]:
        grant = reserve(name, topic, rate, share)
        rows = take(topic, grant) if grant > 0 else []
        if len(rows) < grant:
            give_back(name, rate, grant - len(rows))
        return rows
    return granted


def claim_by_topic(limits: FireRateLimits, output_topic: str, topics: Sequence[str], limit: int,
                   claim: Callable[[str | None, int], list[Claimed]],
                   claim_granted: Callable[[str, str | None, float, int], list[Claimed]]) -> tuple[list[Claimed], bool]:
    """One batch of at most `limit` rows under fire-rate limits, claimed topic by topic: the output
    topic (rows without chronosTopic, `None` here) and `topics`, those named by waiting rows. An
    unlimited topic's rows come from `claim(topic, at_most)`, a limited one's from
    `claim_granted(its name, topic, rate, at_most)`, which claims no more than its bucket holds.

    Limited topics go first: their budgets keep them small, and what they leave goes to the others.
    Each topic gets at most an even share of what remains of the batch, so a backlog of one topic
    cannot starve the next; the topics that filled their share split what is left over. Returns
    (the rows in deadline order, whether a topic's share of the batch rather than its budget or
    its due rows ended its claim: a backlog to drain without sleeping)."""
    rates = {t: limits.rate_for(t or output_topic) for t in (None, *topics)}
    claimed: list[Claimed] = []
    order = sorted(rates, key=lambda t: rates[t] is None)
    while order and len(claimed) < limit:
        filled = []
        for left, topic in zip(range(len(order), 0, -1), order):
            share = -(-(limit - len(claimed)) // left)  # rounded up
            if share <= 0:
                break
            rate = rates[topic]
            rows = claim(topic, share) if rate is None else claim_granted(topic or output_topic, topic, rate, share)
            if len(rows) == share:
                filled.append(topic)
            claimed += rows
        order = filled
    claimed.sort(key=lambda r: (r.scheduled_us, r.seq))
    return claimed, bool(order)
