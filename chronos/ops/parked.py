"""What operators do with parked messages: list and show them, replay them to Kafka, drop them.

A message is parked (the `chronos_parked` table) when neither its destination nor the dead-letter
topic took it (too large for both, say); nothing publishes it again by itself. These are functions over
the operators' store port (`chronos.ports.OperatorsStore`) and, for a replay, a Kafka producer
(`chronos.ports.Publisher`); `chronos parked list|show|replay|drop` and the console's Parked pages are
two faces on them. The actions select by number or by filters, walk the selection in batches, oldest
first, need confirming above a threshold, and are logged and counted like the other operators' actions.

A replay publishes each message as it was parked: key, value and headers byte for byte (the headers as
the codec stored them, in their order: a message the consumer parked was kept as read, Chronos's own
headers included), to the topic it was going to or to the one given, which must be the output topic,
the dead-letter topic or one CHRONOS_ALLOWED_TOPICS allows (as a message's chronosTopic must). It waits
for Kafka's acknowledgements and only then deletes the acknowledged rows, in the transaction that counts
the replay: a crash or an outage between the two leaves them parked, and the next replay publishes them
again (at least once, as everything Chronos publishes). A publish Kafka refuses leaves its row parked with
the refusal as its new reason; one Kafka does not answer in time leaves it as it was, and the replay
stops there.

There is no "re-queue" (back into the store at a new deadline): a parked message was due when it was
parked, so a replay now, or later by the operator's clock, is what a deadline would give, with Kafka's
answer in the command's own output instead of a second round of retries, dead letter and parking hours
later; and a parked row keeps no ordering key or schedule, so back in the store it would fire outside its
key's order without saying so.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Iterator, Sequence

from chronos import codec
from chronos.domain.delivery import PRODUCER_FAILURE, UNANSWERED_FAILURE, DeliveryError, classify, failure_reason
from chronos.domain.operators import PREVIEW_BYTES, ParkedFilters, ParkedMessage, ParkedRecord, ParkedRef
from chronos.errors import ConfigError, NeedsConfirmation, NotFound, ReplayRefused, UnavailableError
from chronos.ops.inspect import bytes_json, iso, parse_time
from chronos.ports import OperatorsStore, Publisher

log = logging.getLogger("chronos.operator")

BATCH = 1000              # parked messages per step of an action's walk
HOLD_BYTES = 64 << 20     # a replay loads at most this much (or one message) before publishing it
SAMPLE = 20               # numbers a result shows
REPLAY_TIMEOUT_S = 30.0   # how long a replay waits for Kafka's acknowledgements of what it published


# -- parsing (pure) ----------------------------------------------------------------------------

def parse_numbers(texts: Sequence[str]) -> list[int]:
    """Parked messages' numbers as given (`17`, `#17`), or a ConfigError."""
    numbers = []
    for text in texts:
        raw = text.strip().removeprefix("#")
        if not raw.isdigit() or int(raw) <= 0:
            raise ConfigError(f"{text!r} is not the number of a parked message (chronos parked list shows them)")
        numbers.append(int(raw))
    return numbers


def filters_for(now: datetime, *, topic: str | None = None, reason: str | None = None, parked_after: str | None = None,
                parked_before: str | None = None, id_prefix: str | None = None) -> ParkedFilters:
    """The parked messages' filters as an operator gives them: times ISO-8601 or relative to `now`."""
    after = parse_time(parked_after, now, "--parked-after") if parked_after else None
    before = parse_time(parked_before, now, "--parked-before") if parked_before else None
    if after is not None and before is not None and after >= before:
        raise ConfigError("--parked-after must be before --parked-before")
    if id_prefix == "":
        raise ConfigError("--id-prefix must not be empty")
    if reason is not None and not re.fullmatch(r"[a-z_]+", reason):
        raise ConfigError(f"--reason is a reason's code, such as too_large or publish_failed, not {reason!r}")
    return ParkedFilters(topic=topic, reason=reason, parked_after=after, parked_before=before, id_prefix=id_prefix)


@dataclass(frozen=True)
class Destinations:
    """Where a replay may publish: the output topic, the dead-letter topic, or a topic the allow-list
    (CHRONOS_ALLOWED_TOPICS) allows."""

    output_topic: str
    dlq_topic: str
    allowed: re.Pattern[str]

    def allow(self, topic: str) -> bool:
        return topic in (self.output_topic, self.dlq_topic) or self.allowed.fullmatch(topic) is not None


# -- results -----------------------------------------------------------------------------------

@dataclass
class ParkedPage:
    items: list[ParkedMessage]
    cursor: int | None              # pass as `before` for the next (older) page; None on the last


@dataclass
class ParkedResult:
    action: str                     # replay_parked, drop_parked
    dry_run: bool
    to: str | None = None           # a replay's topic; None: each message to the topic it was going to
    changed: int = 0                # replayed or dropped (a dry run: that would be)
    sample: list[int] = field(default_factory=list)         # the first numbers changed (or that would be)
    not_found: list[int] = field(default_factory=list)      # numbers given that are not parked
    not_allowed: list[int] = field(default_factory=list)    # a replay: their topic is not allowed, left parked
    refused: list[tuple[int, str]] = field(default_factory=list)  # a replay: Kafka refused them: (number, reason)
    unanswered: list[int] = field(default_factory=list)     # a replay: Kafka did not answer in time, left as they were

    def check(self) -> None:
        """Raise the error an incomplete action exits with: unknown numbers, then Kafka not answering,
        then messages left parked."""
        if self.not_found:
            raise NotFound(f"{len(self.not_found)} of the numbers are not parked: {_listed(self.not_found)}")
        if self.unanswered:
            raise UnavailableError(f"Kafka did not acknowledge {len(self.unanswered)} replays in time: "
                                   f"{_listed(self.unanswered)} stay parked as they were (one Kafka did take is "
                                   "published again by the next replay), and the replay stopped there")
        left = [n for n, _ in self.refused] + self.not_allowed
        if left:
            why = []
            if self.refused:
                why.append(f"Kafka refused {len(self.refused)} (their reason says why)")
            if self.not_allowed:
                why.append(f"CHRONOS_ALLOWED_TOPICS does not allow the topic of {len(self.not_allowed)}")
            raise ReplayRefused(f"{len(left)} stay parked: {' and '.join(why)}: {_listed(sorted(left))}")


def _listed(numbers: Sequence[int]) -> str:
    return ", ".join(f"#{n}" for n in numbers[:5]) + (" ..." if len(numbers) > 5 else "")


# -- queries -----------------------------------------------------------------------------------

def list_parked(store: OperatorsStore, *, limit: int = 50, before: int | None = None,
                filters: ParkedFilters | None = None) -> ParkedPage:
    """One page of parked messages, newest first, older than the cursor `before`."""
    if limit <= 0:
        raise ConfigError(f"--limit must be greater than 0, got {limit}")
    items = store.list_parked(limit=limit, before=before, filters=filters)
    return ParkedPage(items, items[-1].number if len(items) == limit else None)


# -- actions -----------------------------------------------------------------------------------

def drop(store: OperatorsStore, *, numbers: Sequence[int] = (), filters: ParkedFilters | None = None,
         dry_run: bool = False, confirm_above: int | None = None, yes: bool = False, batch: int = BATCH) -> ParkedResult:
    """Delete the parked messages of these numbers, or every one matching `filters`, in transactions of at
    most `batch`. More than `confirm_above` need `yes` (NeedsConfirmation before deleting anything)."""
    _check_selection(numbers, filters)
    result = ParkedResult("drop_parked", dry_run)
    first = True
    for refs in _confirmed(_selected(store, numbers, filters, batch, result), dry_run, confirm_above, yes, "drop"):
        chosen = [r.number for r in refs]
        if not dry_run:
            chosen = store.drop_parked(chosen, counted=first)
            first = False
        _changed(result, chosen)
    if not dry_run:
        if first:
            store.drop_parked([], counted=True)   # counted even when nothing matched
        log.log(logging.INFO if result.changed else logging.DEBUG, "drop-parked: %d parked messages dropped%s",
                result.changed, f", {len(result.not_found)} not found" if result.not_found else "")
    return result


def replay(store: OperatorsStore, publisher: Callable[[], Publisher], destinations: Destinations, *,
           numbers: Sequence[int] = (), filters: ParkedFilters | None = None, to: str | None = None,
           dry_run: bool = False, confirm_above: int | None = None, yes: bool = False, batch: int = BATCH,
           hold_bytes: int = HOLD_BYTES, timeout: float = REPLAY_TIMEOUT_S,
           clock: Callable[[], float] = time.monotonic) -> ParkedResult:
    """Publish the parked messages of these numbers, or every one matching `filters`, oldest first, to `to`
    or each to the topic it was going to; delete each once Kafka acknowledged it (see the module's
    docstring). `publisher` makes the producer, when there is something to publish. More than
    `confirm_above` need `yes`."""
    _check_selection(numbers, filters)
    if to is not None and not destinations.allow(to):
        raise ConfigError(f"--to {to!r} is neither the output topic, nor the dead-letter topic, nor a topic "
                          "CHRONOS_ALLOWED_TOPICS allows")
    result = ParkedResult("replay_parked", dry_run, to=to)

    def allowed(batches: Iterator[list[ParkedRef]]) -> Iterator[list[ParkedRef]]:
        for refs in batches:
            result.not_allowed += [r.number for r in refs if to is None and not destinations.allow(r.topic)]
            ready = [r for r in refs if to is not None or destinations.allow(r.topic)]
            if ready:
                yield ready

    producer: Publisher | None = None
    first = True
    selected = allowed(_selected(store, numbers, filters, batch, result))
    for refs in _confirmed(selected, dry_run, confirm_above, yes, "replay"):
        if dry_run:
            _changed(result, [r.number for r in refs])
            continue
        for chunk in _by_size(refs, hold_bytes):
            records = store.load_parked(chunk)
            if producer is None:
                producer = publisher()
            reports = _publish(producer, records, to, timeout, clock)
            acked, refused = [], []
            for r in records:
                err = reports.get(r.number, _NO_ANSWER)
                if err is None:
                    acked.append(r.number)
                elif err is _NO_ANSWER or classify(err) in (UNANSWERED_FAILURE, PRODUCER_FAILURE):
                    result.unanswered.append(r.number)   # says nothing of the message: left as it was
                else:
                    refused.append((r.number, f"{failure_reason(err)} (replay to {to or r.topic})"))
            result.changed += store.settle_replayed(acked, refused, counted=first)
            first = False
            result.refused += refused
            room = SAMPLE - len(result.sample)
            result.sample += acked[:max(room, 0)]
            if result.unanswered:
                break
        if result.unanswered:
            break
    if not dry_run:
        if first:
            store.settle_replayed([], [], counted=True)   # counted even when nothing matched
        log.log(logging.INFO if result.changed or result.refused else logging.DEBUG,
                "replay-parked: %d parked messages replayed to %s%s", result.changed, to or "their topics",
                "".join(f", {n} {what}" for n, what in (
                    (len(result.refused), "refused by Kafka (left parked)"),
                    (len(result.not_allowed), "not allowed by CHRONOS_ALLOWED_TOPICS (left parked)"),
                    (len(result.unanswered), "unanswered by Kafka (left parked)"),
                    (len(result.not_found), "not found")) if n))
    return result


_NO_ANSWER: Any = object()   # no delivery report at all, even after the purge


def _publish(producer: Publisher, records: list[ParkedRecord], to: str | None, timeout: float,
             clock: Callable[[], float]) -> dict[int, DeliveryError | None]:
    """Publish `records` byte for byte and wait up to `timeout` for Kafka's answers: number -> None
    (acknowledged) or the error. What is still unanswered then is purged (reported as purged)."""
    reports: dict[int, DeliveryError | None] = {}

    def delivered(number: int, err: DeliveryError | None, _msg: Any) -> None:
        reports[number] = err
    for r in records:
        producer.send(to or r.topic, r.value, r.key, codec.decode_headers(r.headers) if r.headers else None,
                      functools.partial(delivered, r.number))
    deadline = clock() + timeout
    while producer.flush(max(0.0, min(1.0, deadline - clock()))) > 0 and clock() < deadline:
        pass
    if len(reports) < len(records):
        producer.purge()
        producer.flush(1.0)   # serves the purged publishes' reports
    return reports


def _check_selection(numbers: Sequence[int], filters: ParkedFilters | None) -> None:
    if (filters is None) == (not numbers):
        raise ConfigError("give the numbers of parked messages, or --filter with filters, not both")


def _selected(store: OperatorsStore, numbers: Sequence[int], filters: ParkedFilters | None, batch: int,
              result: ParkedResult) -> Iterator[list[ParkedRef]]:
    """The parked messages the numbers or the filters name, oldest first, in batches; records the numbers
    not parked."""
    if filters is None:
        wanted = sorted(set(numbers))
        for start in range(0, len(wanted), batch):
            chunk = wanted[start:start + batch]
            found = store.find_parked(chunk)
            present = {r.number for r in found}
            result.not_found += [n for n in chunk if n not in present]
            if found:
                yield found
        return
    after = None
    while True:
        refs = store.walk_parked(filters, limit=batch, after=after)
        if refs:
            yield refs
        if len(refs) < batch:
            return
        after = refs[-1].number


def _confirmed(batches: Iterator[list[ParkedRef]], dry_run: bool, confirm_above: int | None, yes: bool,
               verb: str) -> Iterator[list[ParkedRef]]:
    """The batches, once it is known that no more than `confirm_above` are selected (or `yes`)."""
    if dry_run or confirm_above is None or yes:
        yield from batches
        return
    pending, seen = [], 0
    for refs in batches:
        pending.append(refs)
        seen += len(refs)
        if seen > confirm_above:
            raise NeedsConfirmation(f"{verb} would change more than {confirm_above} parked messages "
                                    "(CHRONOS_CONFIRM_ABOVE): give --yes, or --dry-run to see them")
    yield from pending


def _by_size(refs: list[ParkedRef], hold_bytes: int) -> Iterator[list[int]]:
    """The numbers of `refs` in chunks of at most `hold_bytes` (a bigger message alone)."""
    chunk: list[int] = []
    size = 0
    for r in refs:
        if chunk and size + r.size > hold_bytes:
            yield chunk
            chunk, size = [], 0
        chunk.append(r.number)
        size += r.size
    if chunk:
        yield chunk


def _changed(result: ParkedResult, numbers: list[int]) -> None:
    result.changed += len(numbers)
    room = SAMPLE - len(result.sample)
    if room > 0:
        result.sample += numbers[:room]


# -- JSON ----------------------------------------------------------------------------------------

def to_json(result: ParkedMessage | ParkedPage | ParkedResult | None) -> Any:
    """A result as plain JSON values: times ISO-8601 UTC, bytes as UTF-8 text when they are, plus hex."""
    if result is None:
        return {"state": "not_found"}
    if isinstance(result, ParkedPage):
        return {"parked": [to_json(p) for p in result.items], "next": result.cursor}
    if isinstance(result, ParkedResult):
        return {"action": result.action.removesuffix("_parked"), "dry_run": result.dry_run, "to": result.to,
                "changed": result.changed, "sample": result.sample, "not_found": result.not_found,
                "not_allowed": result.not_allowed, "refused": [{"number": n, "reason": r} for n, r in result.refused],
                "unanswered": result.unanswered}
    p = result
    return {"number": p.number, "message_id": p.message_id, "source": p.source, "topic": p.topic,
            "deadline": iso(p.deadline) if p.deadline else None, "key": bytes_json(p.key),
            "headers": [[k, bytes_json(v)] for k, v in p.headers], "value_size": p.value_size,
            "value_preview": None if p.value_size is None else bytes_json(p.value_preview),
            "value_truncated": bool(p.value_size and p.value_size > PREVIEW_BYTES),
            "reason": p.reason, "parked_at": iso(p.parked_at)}
