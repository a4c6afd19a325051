"""Exponential backoff with a cap, and the one way a process reports a dependency's outage."""

from __future__ import annotations

import logging
import time
from typing import Callable

from chronos.logs import Throttle


# The processes try PostgreSQL again at least this often while it is away: a new connection costs the server
# little, and after a failover the processes find the new primary within about this long (plus a connect
# timeout per host that does not answer).
POSTGRES_RETRY_CAP_S = 1.0


class Backoff:
    """Exponential backoff with a cap, for reconnecting to PostgreSQL or Kafka."""

    def __init__(self, first: float = 0.1, cap: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self.first, self.cap, self.clock = first, cap, clock
        self.delay = first
        self.down_since: float | None = None

    def failed(self) -> float:
        """Record a failure; returns how long to wait before the next try."""
        if self.down_since is None:
            self.down_since = self.clock()
            self.delay = self.first
        else:
            self.delay = min(self.delay * 2, self.cap)
        return self.delay

    def succeeded(self) -> float | None:
        """Record a success; returns how long the outage lasted, or None if there was none."""
        if self.down_since is None:
            return None
        lasted = self.clock() - self.down_since
        self.down_since = None
        self.delay = self.first
        return lasted


class Outage:
    """A dependency's outage as every process reports it: each failure returns the backoff delay
    before the next try and is logged ("postgres unavailable (...); retrying in ..."), the repeats
    aggregated by a `Throttle`; the first success after failures logs how long it lasted.

    One per thread that talks to the dependency: it is not thread-safe.
    """

    def __init__(self, logger: logging.Logger, what: str = "postgres", *, first: float = 0.1, cap: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self.logger, self.what = logger, what
        self.backoff = Backoff(first, cap, clock)
        self.throttle = Throttle(logger, clock=clock)

    def failed(self, exc: BaseException) -> float:
        """Record a failure; returns how long to wait before the next try."""
        delay = self.backoff.failed()
        self.throttle.warning(self.what, "%s unavailable (%s); retrying in %.1fs", self.what, exc, delay)
        return delay

    def ok(self) -> None:
        """Record a success; the first after an outage logs how long the outage lasted."""
        lasted = self.backoff.succeeded()
        if lasted is not None:
            self.logger.warning("%s reachable again after %.1fs", self.what, lasted)

    def down_for(self) -> float:
        """Seconds since the first failure of the outage going on, 0.0 when there is none."""
        since = self.backoff.down_since
        return 0.0 if since is None else self.backoff.clock() - since
