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

With cells, each cell's database parks its own messages and numbers them itself: a parked message is named
by its cell and number, `CELL#NUMBER` (`cell2#17`); a listing merges the cells newest first with a cursor that
holds each cell's place, and an action counts what it would do in every cell against the threshold before
doing anything in any.

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
from typing import Any, Callable, Iterator, Mapping, Sequence

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


def label(cell: str, number: int) -> str:
    """How a parked message is named: `#17`, or with cells `cell2#17`."""
    return f"{cell}#{number}"


def parse_refs(texts: Sequence[str], cells: Sequence[str]) -> list[tuple[str, int]]:
    """Parked messages as given, each with its cell: without cells (`cells` is `[""]`) numbers (`17`, `#17`);
    with cells `CELL#NUMBER` (`cell2#17`), as `chronos parked list` shows them. A ConfigError otherwise."""
    if list(cells) == [""]:
        return [("", n) for n in parse_numbers(texts)]
    refs = []
    for text in texts:
        cell, sep, number = text.strip().rpartition("#")
        if not sep or not cell:
            raise ConfigError(f"{text!r}: with cells a parked message is CELL#NUMBER, as chronos parked list shows "
                              f"it (such as {cells[0]}#17)")
        if cell not in cells:
            raise ConfigError(f"{text!r}: no cell {cell!r} (the cells are {', '.join(cells)})")
        refs.append((cell, parse_numbers([number])[0]))
    return refs


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
    cursor: int | str | None        # pass as `before` for the next (older) page; None on the last
    cells: list[str] | None = None  # with cells: the cell of each item


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
        _check(*([label("", n) for n in numbers] for numbers in (
            self.not_found, self.unanswered, [n for n, _ in self.refused], self.not_allowed)))


@dataclass
class CellsParkedResult:
    """An action on the parked messages of several cells: each cell's part (its numbers are that cell's)."""

    action: str
    dry_run: bool
    to: str | None
    parts: dict[str, ParkedResult]

    @property
    def changed(self) -> int:
        return sum(part.changed for part in self.parts.values())

    def labels(self, what: str) -> list[str]:
        """The parked messages of one of the results' lists (sample, not_found, not_allowed, unanswered, refused),
        each named with its cell."""
        return [label(cell, n if isinstance(n, int) else n[0]) for cell, part in self.parts.items()
                for n in getattr(part, what)]

    def refused(self) -> list[tuple[str, str]]:
        """(the parked message named with its cell, Kafka's refusal) of every cell."""
        return [(label(cell, n), reason) for cell, part in self.parts.items() for n, reason in part.refused]

    def check(self) -> None:
        """`ParkedResult.check` over every cell."""
        _check(*(self.labels(what) for what in ("not_found", "unanswered", "refused", "not_allowed")))


def _check(not_found: list[str], unanswered: list[str], refused: list[str], not_allowed: list[str]) -> None:
    if not_found:
        raise NotFound(f"{len(not_found)} of the numbers are not parked: {_listed(not_found)}")
    if unanswered:
        raise UnavailableError(f"Kafka did not acknowledge {len(unanswered)} replays in time: {_listed(unanswered)} "
                               "stay parked as they were (one Kafka did take is published again by the next replay), "
                               "and the replay stopped there")
    left = refused + not_allowed
    if left:
        why = []
        if refused:
            why.append(f"Kafka refused {len(refused)} (their reason says why)")
        if not_allowed:
            why.append(f"CHRONOS_ALLOWED_TOPICS does not allow the topic of {len(not_allowed)}")
        raise ReplayRefused(f"{len(left)} stay parked: {' and '.join(why)}: {_listed(sorted(left, key=_order))}")


def _order(text: str) -> tuple[str, int]:
    cell, _, number = text.rpartition("#")
    return cell, int(number)


def _listed(labels: Sequence[str]) -> str:
    return ", ".join(labels[:5]) + (" ..." if len(labels) > 5 else "")


# -- queries -----------------------------------------------------------------------------------

def list_parked(store: OperatorsStore, *, limit: int = 50, before: int | None = None,
                filters: ParkedFilters | None = None) -> ParkedPage:
    """One page of parked messages, newest first, older than the cursor `before`."""
    if limit <= 0:
        raise ConfigError(f"--limit must be greater than 0, got {limit}")
    items = store.list_parked(limit=limit, before=before, filters=filters)
    return ParkedPage(items, items[-1].number if len(items) == limit else None)


def list_parked_in_cells(stores: Mapping[str, OperatorsStore], *, limit: int = 50, before: str | None = None,
                         filters: ParkedFilters | None = None) -> ParkedPage:
    """`list_parked` over every cell (cell name -> its store): one page of what the cells keep, newest first
    (between cells parked at one time, in the cells' order), with the cell of each, and a cursor (`CELL#NUMBER`
    of each cell's place, comma-separated) for the next. One cell, named "" (no cells): its page, its cursor a
    number."""
    if len(stores) == 1 and "" in stores:
        return list_parked(stores[""], limit=limit, before=parse_numbers([before])[0] if before else None,
                           filters=filters)
    if limit <= 0:
        raise ConfigError(f"--limit must be greater than 0, got {limit}")
    places = dict(parse_refs(before.split(","), list(stores))) if before else {}
    rank = {cell: i for i, cell in enumerate(stores)}
    found: list[tuple[Any, str, ParkedMessage]] = []
    more = False
    for cell, store in stores.items():
        items = store.list_parked(limit=limit, before=places.get(cell), filters=filters)
        more = more or len(items) == limit
        found += [((-p.parked_at.timestamp(), rank[cell], -p.number), cell, p) for p in items]
    found.sort(key=lambda t: t[0])
    page = found[:limit]
    for _, cell, p in page:
        places[cell] = p.number
    cursor = ",".join(label(cell, n) for cell, n in places.items()) if more or len(found) > limit else None
    return ParkedPage([p for _, _, p in page], cursor, [cell for _, cell, _ in page])


def show_parked_in_cell(stores: Mapping[str, OperatorsStore], ref: tuple[str, int]) -> ParkedMessage | None:
    """The parked message `ref` names (its cell and number)."""
    cell, number = ref
    return stores[cell].show_parked(number)


# -- actions -----------------------------------------------------------------------------------

def drop(store: OperatorsStore, *, numbers: Sequence[int] = (), filters: ParkedFilters | None = None,
         dry_run: bool = False, confirm_above: int | None = None, yes: bool = False, batch: int = BATCH) -> ParkedResult:
    """Delete the parked messages of these numbers, or every one matching `filters`, in transactions of at
    most `batch`. More than `confirm_above` need `yes` (NeedsConfirmation before deleting anything)."""
    return drop_in_cells({"": store}, refs=[("", n) for n in numbers], filters=filters, dry_run=dry_run,
                         confirm_above=confirm_above, yes=yes, batch=batch).parts[""]


def drop_in_cells(stores: Mapping[str, OperatorsStore], *, refs: Sequence[tuple[str, int]] = (),
                  filters: ParkedFilters | None = None, dry_run: bool = False, confirm_above: int | None = None,
                  yes: bool = False, batch: int = BATCH) -> CellsParkedResult:
    """`drop` in every cell (cell name -> its store; one named "" without cells), of these parked messages (each
    with its cell) or of every one matching `filters`: the confirmation counts every cell's before any is
    dropped, and each cell counts the action taken there."""
    _check_selection(refs, filters)
    result = CellsParkedResult("drop_parked", dry_run, None, {cell: ParkedResult("drop_parked", dry_run)
                                                              for cell in stores})
    counted: set[str] = set()
    for cell, chosen_refs in _confirmed(_selected_in_cells(stores, refs, filters, batch, result), dry_run,
                                        confirm_above, yes, "drop"):
        chosen = [r.number for r in chosen_refs]
        if not dry_run:
            chosen = stores[cell].drop_parked(chosen, counted=cell not in counted)
            counted.add(cell)
        _changed(result.parts[cell], chosen)
    if not dry_run:
        for cell, store in stores.items():
            if cell not in counted:
                store.drop_parked([], counted=True)   # counted even when nothing matched
        not_found = result.labels("not_found")
        log.log(logging.INFO if result.changed else logging.DEBUG, "drop-parked: %d parked messages dropped%s%s",
                result.changed, f", {len(not_found)} not found" if not_found else "", _by_cell(result))
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
    return replay_in_cells({"": store}, publisher, destinations, refs=[("", n) for n in numbers], filters=filters,
                           to=to, dry_run=dry_run, confirm_above=confirm_above, yes=yes, batch=batch,
                           hold_bytes=hold_bytes, timeout=timeout, clock=clock).parts[""]


def replay_in_cells(stores: Mapping[str, OperatorsStore], publisher: Callable[[], Publisher],
                    destinations: Destinations, *, refs: Sequence[tuple[str, int]] = (),
                    filters: ParkedFilters | None = None, to: str | None = None, dry_run: bool = False,
                    confirm_above: int | None = None, yes: bool = False, batch: int = BATCH,
                    hold_bytes: int = HOLD_BYTES, timeout: float = REPLAY_TIMEOUT_S,
                    clock: Callable[[], float] = time.monotonic) -> CellsParkedResult:
    """`replay` in every cell (cell name -> its store; one named "" without cells), of these parked messages
    (each with its cell) or of every one matching `filters`, the cells in their order, with one producer: the
    confirmation counts every cell's before any is published, a Kafka that does not answer stops the replay in
    every cell, and each cell counts the action taken there."""
    _check_selection(refs, filters)
    if to is not None and not destinations.allow(to):
        raise ConfigError(f"--to {to!r} is neither the output topic, nor the dead-letter topic, nor a topic "
                          "CHRONOS_ALLOWED_TOPICS allows")
    result = CellsParkedResult("replay_parked", dry_run, to, {cell: ParkedResult("replay_parked", dry_run, to=to)
                                                             for cell in stores})

    def allowed(batches: Iterator[tuple[str, list[ParkedRef]]]) -> Iterator[tuple[str, list[ParkedRef]]]:
        for cell, found in batches:
            result.parts[cell].not_allowed += [r.number for r in found if to is None and not destinations.allow(r.topic)]
            ready = [r for r in found if to is not None or destinations.allow(r.topic)]
            if ready:
                yield cell, ready

    producer: Publisher | None = None
    counted: set[str] = set()
    stopped = False
    selected = allowed(_selected_in_cells(stores, refs, filters, batch, result))
    for cell, found in _confirmed(selected, dry_run, confirm_above, yes, "replay"):
        part = result.parts[cell]
        if dry_run:
            _changed(part, [r.number for r in found])
            continue
        for chunk in _by_size(found, hold_bytes):
            records = stores[cell].load_parked(chunk)
            if producer is None:
                producer = publisher()
            reports = _publish(producer, records, to, timeout, clock)
            acked, refused = [], []
            for r in records:
                err = reports.get(r.number, _NO_ANSWER)
                if err is None:
                    acked.append(r.number)
                elif err is _NO_ANSWER or classify(err) in (UNANSWERED_FAILURE, PRODUCER_FAILURE):
                    part.unanswered.append(r.number)   # says nothing of the message: left as it was
                else:
                    refused.append((r.number, f"{failure_reason(err)} (replay to {to or r.topic})"))
            part.changed += stores[cell].settle_replayed(acked, refused, counted=cell not in counted)
            counted.add(cell)
            part.refused += refused
            room = SAMPLE - len(part.sample)
            part.sample += acked[:max(room, 0)]
            if part.unanswered:
                stopped = True
                break
        if stopped:
            break
    if not dry_run:
        for cell, store in stores.items():
            if cell not in counted:
                store.settle_replayed([], [], counted=True)   # counted even when nothing matched
        log.log(logging.INFO if result.changed or result.refused() else logging.DEBUG,
                "replay-parked: %d parked messages replayed to %s%s%s", result.changed, to or "their topics",
                "".join(f", {n} {what}" for n, what in (
                    (len(result.refused()), "refused by Kafka (left parked)"),
                    (len(result.labels("not_allowed")), "not allowed by CHRONOS_ALLOWED_TOPICS (left parked)"),
                    (len(result.labels("unanswered")), "unanswered by Kafka (left parked)"),
                    (len(result.labels("not_found")), "not found")) if n), _by_cell(result))
    return result


def _by_cell(result: CellsParkedResult) -> str:
    """` (cell1 3, cell2 0)`: what an action did in each cell, with cells; nothing without."""
    if "" in result.parts:
        return ""
    return " (" + ", ".join(f"{cell} {part.changed}" for cell, part in result.parts.items()) + ")"


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


def _check_selection(refs: Sequence[Any], filters: ParkedFilters | None) -> None:
    if (filters is None) == (not refs):
        raise ConfigError("give the numbers of parked messages, or --filter with filters, not both")


def _selected_in_cells(stores: Mapping[str, OperatorsStore], refs: Sequence[tuple[str, int]],
                       filters: ParkedFilters | None, batch: int,
                       result: CellsParkedResult) -> Iterator[tuple[str, list[ParkedRef]]]:
    """The parked messages the references or the filters name in each cell, the cells in their order, each
    cell's oldest first, in batches; records the references not parked."""
    for cell, store in stores.items():
        numbers = [n for c, n in refs if c == cell]
        if filters is None and not numbers:
            continue
        for found in _selected(store, numbers, filters, batch, result.parts[cell]):
            yield cell, found


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
        found = store.walk_parked(filters, limit=batch, after=after)
        if found:
            yield found
        if len(found) < batch:
            return
        after = found[-1].number


def _confirmed(batches: Iterator[tuple[str, list[ParkedRef]]], dry_run: bool, confirm_above: int | None, yes: bool,
               verb: str) -> Iterator[tuple[str, list[ParkedRef]]]:
    """The batches (each with its cell), once it is known that no more than `confirm_above` are selected in all
    the cells (or `yes`)."""
    if dry_run or confirm_above is None or yes:
        yield from batches
        return
    pending, seen = [], 0
    for cell, found in batches:
        pending.append((cell, found))
        seen += len(found)
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

def to_json(result: ParkedMessage | ParkedPage | ParkedResult | CellsParkedResult | None) -> Any:
    """A result as plain JSON values: times ISO-8601 UTC, bytes as UTF-8 text when they are, plus hex. With
    cells, each parked message listed has its cell, and an action's result names each as `CELL#NUMBER`."""
    if result is None:
        return {"state": "not_found"}
    if isinstance(result, ParkedPage):
        listed = [to_json(p) for p in result.items]
        for item, cell in zip(listed, result.cells or ()):
            item["cell"] = cell
        return {"parked": listed, "next": result.cursor}
    if isinstance(result, CellsParkedResult):
        if "" in result.parts:
            return to_json(result.parts[""])
        return {"action": result.action.removesuffix("_parked"), "dry_run": result.dry_run, "to": result.to,
                "changed": result.changed, "cells": {cell: part.changed for cell, part in result.parts.items()},
                **{what: result.labels(what) for what in ("sample", "not_found", "not_allowed")},
                "refused": [{"parked": ref, "reason": r} for ref, r in result.refused()],
                "unanswered": result.labels("unanswered")}
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
