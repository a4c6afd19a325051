"""Exponential backoff with a cap, for reconnecting to PostgreSQL or Kafka."""

from __future__ import annotations

import time


class Backoff:
    """Exponential backoff with a cap, for reconnecting to PostgreSQL or Kafka."""

    def __init__(self, first: float = 0.1, cap: float = 5.0):
        self.first, self.cap = first, cap
        self.delay = first
        self.down_since: float | None = None

    def failed(self) -> float:
        """Record a failure; returns how long to wait before the next try."""
        if self.down_since is None:
            self.down_since = time.monotonic()
            self.delay = self.first
        else:
            self.delay = min(self.delay * 2, self.cap)
        return self.delay

    def succeeded(self) -> float | None:
        """Record a success; returns how long the outage lasted, or None if there was none."""
        if self.down_since is None:
            return None
        lasted = time.monotonic() - self.down_since
        self.down_since = None
        self.delay = self.first
        return lasted
