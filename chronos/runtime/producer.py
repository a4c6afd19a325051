"""A role's Kafka producer: what its delivery reports say about it (`ProducerWatch`), and its
replacement (`ProducerSlot`), used alike by the consumer and the firer.

Most failed publishes are about the message or its topic (too large, an unknown topic, a denied
write): those count against the message. Some are about the producer: its identity or state at
the broker (fenced, an epoch or producer id the broker no longer knows, a sequence out of
order), or a fault that hits every topic at once. librdkafka marks few of them fatal, so a
producer left in place fails every message the same way forever. Those must never count against
a message: the producer is replaced and the message handed back as it is.

And a producer can fall silent: a broker that restarted has forgotten it, and it waits for
acknowledgements that never come. `ProducerWatch` notices publishing that has stalled, nothing
acknowledged for `stall_s` while messages wait, and asks for the producer to be replaced.

The watch is pure logic: the caller passes `now` (monotonic seconds). A producer at fault or silent
is replaced by a new one. The old one's unacknowledged publishes are purged; their delivery reports,
each saying purged (or acknowledged, for a publish that got through after all), come back through
the callbacks they were published with, some at once and the rest on later polls of the old
producer. The slot keeps such a producer (*retired*) and serves it until it owes no report, so that
every publish is answered once.
"""

from __future__ import annotations

import logging
from typing import Callable

from chronos.domain.delivery import PRODUCER_FAILURE, REFUSED, UNCLEAR_FAILURE, DeliveryError, classify
from chronos.ports import KafkaOutage, Publisher

log = logging.getLogger("chronos.kafka")

FIRST_REPLACEMENT_GAP = 0.5  # seconds after a replacement before the next one of an episode; doubled each time


class ProducerWatch:
    """One producer's health as its delivery reports tell it, for the thread that polls it.

    An *episode* starts with a publish that fails or goes unacknowledged and ends with the next
    acknowledgement. Within one, the producer is replaced at once on a fault of its own, then
    again no sooner than a growing gap (0.5 s, 1 s, 2 s, ... up to `stall_s`), so a broker that
    refuses every new producer too is not asked for one per message.

    Read from other threads (health, metrics): `stalled_for`, `replacements`, floats and ints.
    """

    def __init__(self, what: str, stall_s: float, now: float):
        self.what, self.stall_s = what, stall_s
        self.since = now                         # last acknowledgement, or start of work after idling
        self.last_replacement = now
        self.busy = False                        # publishes waiting or failing (the caller says)
        self.failing_since: float | None = None  # first failure since the last acknowledgement
        self.failed_topics: set[str] = set()     # topics refused since the last acknowledgement
        self.wanted: str | None = None           # why the producer should be replaced, once due
        self.next_replacement = now
        self.gap = FIRST_REPLACEMENT_GAP
        self.stall_logged = False
        self.replacements: dict[str, int] = {"fault": 0, "stall": 0}

    # -- what the delivery reports say ----------------------------------------------------------

    def acked(self, now: float) -> None:
        """A publish was acknowledged: the producer works."""
        if self.stall_logged:
            log.warning("publishing works again for %s after %.1fs without an acknowledgement", self.what,
                        now - self.since)
        self.since = now
        if self.failing_since is not None or self.stall_logged:
            self.failing_since = None
            self.failed_topics.clear()
            self.wanted = None
            self.stall_logged = False
            self.gap = FIRST_REPLACEMENT_GAP

    def failed(self, err: DeliveryError, topic: str, now: float) -> str:
        """A publish to `topic` failed with `err`: what it means, as `classify` names it,
        except that an unclear error, and a refusal that hits every topic at once, are the
        producer's fault unless the producer was acknowledged lately. A producer fault asks for
        the producer to be replaced (`due`)."""
        kind = classify(err)
        if self.failing_since is None:
            self.failing_since = now
        if kind in (REFUSED, UNCLEAR_FAILURE):
            self.failed_topics.add(topic)
            if len(self.failed_topics) > 1:
                kind = PRODUCER_FAILURE  # several topics refuse and none acknowledges: not one topic's fault
            elif kind == UNCLEAR_FAILURE:
                kind = REFUSED if now - self.since < self.stall_s else PRODUCER_FAILURE
        if kind == PRODUCER_FAILURE and self.wanted is None:
            self.wanted = f"{err.name()}: {err.str()}"
        return kind

    # -- the watchdog -----------------------------------------------------------------------------

    def working(self, busy: bool, now: float) -> None:
        """Whether publishes wait for an answer or failed lately (`busy`); the stall clock starts
        when work starts, so an idle producer is never stalled."""
        busy = busy or self.failing_since is not None
        if busy and not self.busy:
            self.since = now
        self.busy = busy

    def stalled_for(self, now: float) -> float:
        """How long publishing has stalled (nothing acknowledged while busy), once that is at least
        `stall_s`; else 0."""
        waited = now - self.since if self.busy else 0.0
        return waited if waited >= self.stall_s else 0.0

    def due(self, now: float) -> str | None:
        """Why the producer must be replaced now, or None: a fault of its own, or a stall."""
        if now < self.next_replacement:
            return None
        if self.wanted is not None:
            return self.wanted
        stalled = self.stalled_for(now)
        if stalled and now - self.last_replacement >= self.stall_s:  # each producer gets a full window
            return f"nothing acknowledged for {stalled:.1f}s"
        return None

    def replaced(self, why: str, now: float) -> None:
        """The producer was replaced (for `why`, from `due`)."""
        stalled = self.wanted is None
        self.replacements["stall" if stalled else "fault"] += 1
        if stalled and not self.stall_logged:
            self.stall_logged = True
            log.error("publishing stalled for %s: %s while messages wait; replacing the Kafka producer "
                      "(logged once until publishing works again)", self.what, why)
        elif not stalled:
            log.warning("the Kafka producer of %s is at fault (%s): replacing it; its messages are handed back "
                        "without counting an attempt", self.what, why)
        self.wanted = None
        self.failed_topics.clear()
        self.last_replacement = now
        self.next_replacement = now + self.gap
        self.gap = min(self.gap * 2, self.stall_s)



class ProducerSlot:
    """A role's producer and its replacements, for the one thread that publishes and polls.

    - `producer` and `outage`: the producer in use and the log of its outages;
    - `generation`: how many times it was replaced. A publish remembers the generation it was made
      in: the report of a replaced producer's publish says nothing more about the message;
    - `retired`: replaced producers that still owe delivery reports (`serve_retired`);
    - `watch`: what its delivery reports say about the producer, and when to replace it.
    """

    def __init__(self, make: Callable[[], tuple[Publisher, KafkaOutage]], watch: ProducerWatch):
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
