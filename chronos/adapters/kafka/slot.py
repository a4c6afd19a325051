"""The Kafka producer a role publishes with, and its replacement: one `ProducerSlot` per role,
used alike by the consumer and the firer.

A producer at fault or silent (`watch.ProducerWatch` decides) is replaced by a new one. The old one's
unacknowledged publishes are purged; their delivery reports, each saying purged (or acknowledged,
for a publish that got through after all), come back through the callbacks they were published
with, some at once and the rest on later polls of the old producer. The slot keeps such a producer
(*retired*) and serves it until it owes no report, so that every publish is answered once.
"""

from __future__ import annotations

from typing import Callable

from chronos.adapters.kafka.clients import OutageLog
from chronos.adapters.kafka.watch import ProducerWatch
from chronos.ports import Publisher


class ProducerSlot:
    """A role's producer and its replacements, for the one thread that publishes and polls.

    - `producer` and `outage`: the producer in use and the log of its outages;
    - `generation`: how many times it was replaced. A publish remembers the generation it was made
      in: the report of a replaced producer's publish says nothing more about the message;
    - `retired`: replaced producers that still owe delivery reports (`serve_retired`);
    - `watch`: what its delivery reports say about the producer, and when to replace it.
    """

    def __init__(self, make: Callable[[], tuple[Publisher, OutageLog]], watch: ProducerWatch):
        """`make` makes a producer and the log of its outages: at start, and again at each replacement."""
        self.make, self.watch = make, watch
        self.producer, self.outage = make()
        self.generation = 0
        self.retired: list[Publisher] = []

    def look_after(self, now: float) -> None:
        """Replace the producer if the watch says it is at fault or has stalled (`now` monotonic), and
        serve what the replaced ones still owe. Between delivery reports, never inside one."""
        why = self.watch.due(now)
        if why is not None:
            self.replace(why, now)
        self.serve_retired()

    def replace(self, why: str, now: float) -> None:
        """A new producer; the old one's unacknowledged publishes are purged, and their reports served
        now or, for those still to come, by `serve_retired`."""
        old = self.producer
        self.generation += 1
        self.watch.replaced(why, now)
        self.producer, self.outage = self.make()
        if retire(old):
            self.retired.append(old)

    def serve_retired(self) -> None:
        """Serve the reports replaced producers still owe; drop each once it owes none."""
        if self.retired:
            self.retired = [old for old in self.retired if old.flush(0)]


def retire(producer: Publisher, timeout: float = 1.0) -> int:
    """Fail a replaced producer's publishes that are not acknowledged yet, queued or in flight, and
    serve their delivery reports now (each says purged: its message is handed back or published
    again). Returns how many reports are still to come, which later `poll`s of it serve."""
    producer.purge(in_queue=True, in_flight=True, blocking=False)
    return producer.flush(timeout)
