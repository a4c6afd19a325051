"""A process's health: when it last did each thing it must keep doing, and a Kafka probe thread."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Collection

from confluent_kafka import Producer

KAFKA_PROBE_TIMEOUT_S = 2.0


class Health:
    """When the process last did each thing it must keep doing; /healthz fails on any stale one.

    Each check is a function returning a `time.monotonic()` timestamp of the last success (0 for
    never), read from the HTTP thread; a plain float attribute read is enough there. A check that
    never succeeded passes for one window after start, so a starting process is not reported sick.
    """

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic):
        self.window = window_s
        self.clock = clock
        self.started = clock()
        self.checks: dict[str, tuple[float, Callable[[], float], Callable[[], str | None] | None]] = {}

    def watch(self, name: str, last_ok: Callable[[], float], *, window_s: float | None = None,
              detail: Callable[[], str | None] | None = None) -> None:
        """Add a check; `detail` explains a failure (the last error seen), if it knows one."""
        self.checks[name] = (window_s or self.window, last_ok, detail)

    def report(self, now: float | None = None, only: Collection[str] | None = None) -> tuple[bool, dict[str, Any]]:
        """(healthy, the /healthz JSON report): every check's age (or only those named), and why the stale
        ones fail."""
        now = self.clock() if now is None else now
        checks: dict[str, Any] = {}
        reasons = []
        for name, (window, last_ok, detail) in self.checks.items():
            if only is not None and name not in only:
                continue
            last = last_ok()
            age = now - (last or self.started)
            ok = age <= window
            entry: dict[str, Any] = {"ok": ok, "age_s": round(age, 3) if last else None}
            if not ok:
                why = f"{name}: " + (f"last ok {age:.1f}s ago" if last else f"never ok in {age:.1f}s") + \
                      f" (window {window:g}s)"
                extra = detail() if detail else None
                if extra:
                    why += f": {extra}"
                    entry["error"] = extra
                reasons.append(why)
            checks[name] = entry
        return not reasons, {"status": "ok" if not reasons else "unhealthy", "reason": "; ".join(reasons) or None,
                             "checks": checks}


class KafkaProbe:
    """Asks Kafka for metadata every few seconds from a thread of its own.

    An idle client says nothing about whether its brokers answer; a metadata request does, and
    from this thread it never holds up the process's loop. librdkafka clients are thread-safe.
    A consumer is asked for its topic's metadata. A producer is asked for every topic's: its request
    for one topic lets the broker create that topic when it is missing (librdkafka's producers allow
    it by default), and a health check must not bring back a topic an operator deleted, with the
    broker's default partitions. A request for every topic never creates one.
    """

    def __init__(self, client: Callable[[], Any], topic: str, every_s: float, timeout_s: float = KAFKA_PROBE_TIMEOUT_S):
        self.client, self.topic, self.every, self.timeout = client, topic, every_s, timeout_s
        self.last_ok = 0.0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chronos-kafka-probe", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop and wait for the thread, so the client can be closed safely afterwards."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.timeout + 1.0)

    def probe(self) -> bool:
        """Ask once; True if Kafka answered (`last_ok` and `error` say the same)."""
        try:
            client = self.client()
            if isinstance(client, Producer):
                client.list_topics(timeout=self.timeout)
            else:
                client.list_topics(self.topic, timeout=self.timeout)
        except Exception as exc:  # noqa: BLE001 - KafkaException or a closed client: either way not reachable
            self.error = str(exc.args[0]) if exc.args else type(exc).__name__
            return False
        self.last_ok = time.monotonic()
        self.error = None
        return True

    def _run(self) -> None:
        while True:
            self.probe()
            if self._stop.wait(self.every):
                return
