"""What operators ask of the store and do to it: list, cancel, fire-now, reschedule (parked messages:
`chronos.ops.parked`).

Functions over the operators' store port (`chronos.ports.OperatorsStore`: its statements, on PostgreSQL
or the in-memory twin), returning typed results: the flags parsed, pages and their cursors, actions
walked in batches, confirmed above a threshold and logged. `chronos show|list|cancel|fire-now|reschedule`
(chronos/commands/) and the console are two faces on them, and `to_json` gives every result as plain JSON.
What operators select and see (filters, states, messages) is `chronos.domain.operators`.

In-flight rows: no action changes them. The firer that holds the row publishes it at the deadline
in force when it claimed it and then deletes it (or, with the claim that deletes, commits its delete);
changing or deleting the row under it could not stop that publish, only make the result lie. A row held
by a claim that deletes is skipped without waiting for the firer's transaction. Each action reports
such rows as `in_flight`, and the operator can act again once they fired (or, if their firer died, once
a detector handed them back after the hold time, or PostgreSQL ended the firer's transaction). A later
input message with the same id follows the usual rule: ignored while the id is waiting or in flight (so
after fire-now or reschedule too), scheduled anew once the id is gone (after cancel, or after it fired).
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator, Mapping, Sequence

import orjson

from chronos.domain.cron import from_us, to_us
from chronos.domain.operators import (ACTIONS, HELD_WITHIN_MS, PREVIEW_BYTES, STATES, Filters, Listed, Message,
                                      Position, Schedule)
from chronos.errors import ConfigError, InFlightSkipped, NeedsConfirmation, NotFound
from chronos.ports import OperatorsStore

log = logging.getLogger("chronos.operator")

BATCH = 1000            # rows per transaction when an action walks a filter
SAMPLE = 20             # ids a dry run shows

_RELATIVE_RE = re.compile(r"^([+-]?)(\d+(?:\.\d+)?)(ms|s|m|h|d|w)$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


# -- parsing (pure) ----------------------------------------------------------------------------

def parse_time(text: str, now: datetime, what: str = "time") -> datetime:
    """ISO-8601 (no offset means UTC) or relative to `now`: `10m`, `-2h`, `+1d`, `500ms`."""
    raw = text.strip()
    match = _RELATIVE_RE.match(raw)
    if match:
        delta = timedelta(seconds=float(match.group(2)) * _UNITS[match.group(3)])
        return now - delta if match.group(1) == "-" else now + delta
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ConfigError(f"{what} is neither ISO-8601 nor relative like 10m, -2h, 1d: {text!r}") from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def parse_delay(text: str) -> timedelta:
    """A delay from now for `reschedule --delay`: `500ms`, `30s`, `10m`, `2h`, `1d`, `1w`; never negative."""
    raw = text.strip()
    match = _RELATIVE_RE.match(raw)
    if not match:
        raise ConfigError(f"--delay is not a duration like 500ms, 30s, 10m, 2h, 1d: {text!r}")
    if match.group(1) == "-":
        raise ConfigError(f"--delay must not be negative: {text!r} (use fire-now, or --at for a past time)")
    return timedelta(seconds=float(match.group(2)) * _UNITS[match.group(3)])


def parse_state(text: str | None) -> str | None:
    if text is None:
        return None
    state = text.strip().lower().replace("-", "_")
    if state not in STATES:
        raise ConfigError(f"unknown state {text!r}: use one of {', '.join(STATES)}")
    return state


def parse_key(text: str | None) -> bytes | None:
    """A message key as given on the command line: UTF-8 text, or `hex:` followed by hex digits."""
    if text is None:
        return None
    if text.startswith("hex:"):
        try:
            return bytes.fromhex(text[4:])
        except ValueError:
            raise ConfigError(f"--key {text!r} is not hex after 'hex:'") from None
    return text.encode()


def filters_for(*, output_topic: str, due_after: datetime | None = None, due_before: datetime | None = None,
                topic: str | None = None, key: bytes | None = None, ordering_key: str | None = None,
                id_prefix: str | None = None, state: str | None = None) -> Filters:
    """Filters as an operator gives them: the output topic is stored as NULL, so it becomes a flag."""
    if due_after is not None and due_before is not None and due_after >= due_before:
        raise ConfigError("--due-after must be before --due-before")
    if id_prefix == "":
        raise ConfigError("--id-prefix must not be empty")
    return Filters(due_after=due_after, due_before=due_before,
                   topic=None if topic == output_topic else topic, output_topic=topic == output_topic,
                   key=key, ordering_key=ordering_key, id_prefix=id_prefix, state=parse_state(state))


def encode_cursor(order: str, values: Sequence[Any]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([order, *values])).decode().rstrip("=")


def decode_cursor(text: str) -> tuple[str, list[Any]]:
    """(order, values) of a cursor printed with a page; a cursor that is not ours is a bad flag."""
    try:
        data = orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        order, values = data[0], data[1:]
        if order == "d" and len(values) == 2 and all(isinstance(v, int) for v in values):
            return order, values
        if order == "i" and len(values) == 1 and isinstance(values[0], str):
            return order, values
    except (ValueError, TypeError, IndexError, orjson.JSONDecodeError):
        pass
    raise ConfigError(f"--after is not a cursor printed by `chronos list`: {text!r}")


# -- results -----------------------------------------------------------------------------------

@dataclass
class Page:
    items: list[Listed]
    cursor: str | None              # pass as `after` for the next page; None when this is the last
    cells: list[str] | None = None  # with cells: the cell of each item


@dataclass
class ActionResult:
    action: str                     # cancel, fire_now, reschedule
    dry_run: bool
    changed: int = 0                # rows changed (a dry run: rows that would change)
    in_flight: list[str] = field(default_factory=list)      # left alone: a firer holds them
    not_found: list[str] = field(default_factory=list)      # ids given that are not in the store
    sample: list[str] = field(default_factory=list)         # first ids changed (or that would be)
    at: datetime | None = None      # fire-now / reschedule: the new deadline
    cells: dict[str, int] | None = None  # with cells: rows changed (or that would be) in each cell
    where: dict[str, str] = field(default_factory=dict)     # with cells: the cell of each id sampled or in flight

    def check(self) -> None:
        """Raise the error an incomplete action exits with (unknown ids first)."""
        if self.not_found:
            raise NotFound(f"{len(self.not_found)} of the ids are not in the store: "
                           + ", ".join(repr(i) for i in self.not_found[:5]) + (" ..." if len(self.not_found) > 5 else ""))
        if self.in_flight:
            raise InFlightSkipped(f"{len(self.in_flight)} messages are in flight (a firer is publishing them) and "
                                  "were left alone: " + ", ".join(repr(i) for i in self.in_flight[:5])
                                  + (" ..." if len(self.in_flight) > 5 else ""))


# -- queries -------------------------------------------------------------------------------------

def list_messages(store: OperatorsStore, f: Filters, *, output_topic: str, limit: int = 50, after: str | None = None,
                  not_at: datetime | None = None, held_within_ms: int = HELD_WITHIN_MS) -> Page:
    """One page of what matches, in deadline order (id order with an id prefix), after a cursor; rows a
    firer's claim that deletes holds are looked for among those due within `held_within_ms`."""
    if limit <= 0:
        raise ConfigError(f"--limit must be greater than 0, got {limit}")
    cursor = decode_cursor(after) if after else None
    by_id = f.id_prefix is not None
    if cursor is not None and (cursor[0] == "i") != by_id:
        raise ConfigError("--after is a cursor of a listing with other filters (--id-prefix changes the order)")
    position: Position | None = None
    if cursor is not None:
        order, values = cursor
        position = values[0] if order == "i" else (values[0], values[1])
    items = store.list_messages(f, output_topic=output_topic, limit=limit, after=position, not_at=not_at,
                                held_within_ms=held_within_ms)
    next_cursor = None
    if len(items) == limit:
        last = items[-1]
        next_cursor = encode_cursor("i", [last.id]) if by_id else encode_cursor("d", [to_us(last.deadline), last.seq])
    return Page(items, next_cursor)


def list_in_cells(stores: Mapping[str, OperatorsStore], f: Filters, *, output_topic: str, limit: int = 50,
                  after: str | None = None, held_within_ms: int = HELD_WITHIN_MS) -> Page:
    """`list_messages` over every cell (cell name -> its store): one page of what matches in all of them, in
    deadline order (id order with an id prefix; between cells at one deadline, in the cells' order), with the
    cell of each, and a cursor that holds each cell's position. One cell, named "" (no cells): its page."""
    if len(stores) == 1 and "" in stores:
        return list_messages(stores[""], f, output_topic=output_topic, limit=limit, after=after,
                             held_within_ms=held_within_ms)
    if limit <= 0:
        raise ConfigError(f"--limit must be greater than 0, got {limit}")
    by_id = f.id_prefix is not None
    positions = _decode_cells_cursor(after, by_id, list(stores)) if after else {}
    rank = {cell: i for i, cell in enumerate(stores)}
    found: list[tuple[Any, str, Listed]] = []
    more = False
    for cell, store in stores.items():
        items = store.list_messages(f, output_topic=output_topic, limit=limit, after=positions.get(cell),
                                    held_within_ms=held_within_ms)
        more = more or len(items) == limit
        found += [((m.id, rank[cell]) if by_id else (m.deadline, rank[cell], m.seq), cell, m) for m in items]
    found.sort(key=lambda t: t[0])
    page = found[:limit]
    for _, cell, m in page:
        positions[cell] = m.id if by_id else (to_us(m.deadline), m.seq)
    cursor = None
    if more or len(found) > limit:
        cursor = encode_cursor("ci" if by_id else "cd", [{cell: (list(p) if isinstance(p, tuple) else p)
                                                           for cell, p in positions.items()}])
    return Page([m for _, _, m in page], cursor, [cell for _, cell, _ in page])


def without_key_search(stores: Mapping[str, OperatorsStore], f: Filters | None) -> list[str]:
    """The cells (named "" without cells) whose search by key `f` reads the rows in deadline order, there being no
    key-search index there (`chronos key-search on` builds it); none when `f` has no key."""
    if f is None or f.key is None:
        return []
    return [cell for cell, store in stores.items() if not store.key_search()]


def key_search_note(cells: Sequence[str]) -> str | None:
    """What the CLI and the console say of a search by key in `cells` (`without_key_search`'s), or None."""
    if not cells:
        return None
    where = "the database has" if cells == [""] else f"cell{'s' if len(cells) > 1 else ''} {', '.join(cells)} " \
        f"{'have' if len(cells) > 1 else 'has'}"
    return (f"{where} no key-search index: this search reads the rows in deadline order until its page is full "
            "(chronos key-search on builds the index)")


def _decode_cells_cursor(text: str, by_id: bool, cells: list[str]) -> dict[str, Position]:
    """Each cell's position in a cursor `list_in_cells` printed; a cursor that is not one is a bad flag."""
    try:
        data = orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        order, positions = data[0], data[1]
        if order in ("ci", "cd") and isinstance(positions, dict) and set(positions) <= set(cells):
            if (order == "ci") != by_id:
                raise ConfigError("--after is a cursor of a listing with other filters (--id-prefix changes the "
                                  "order)")
            if order == "ci" and all(isinstance(v, str) for v in positions.values()):
                return dict(positions)
            if order == "cd" and all(isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v)
                                     for v in positions.values()):
                return {cell: (v[0], v[1]) for cell, v in positions.items()}
    except (ValueError, TypeError, IndexError, orjson.JSONDecodeError):
        pass
    raise ConfigError(f"--after is not a cursor printed by `chronos list` over these cells: {text!r}")


def show_in_cells(stores: Mapping[str, OperatorsStore], message_id: str, *,
                  output_topic: str) -> list[tuple[str, Message]]:
    """The message or schedule with this id in every cell that holds it (one, unless a producer sent it to
    partitions of two cells), each with its cell, in the cells' order."""
    found = []
    for cell, store in stores.items():
        m = store.show(message_id, output_topic=output_topic)
        if m is not None:
            found.append((cell, m))
    return found


def schedules_in_cells(stores: Mapping[str, OperatorsStore]) -> list[tuple[str, Schedule]]:
    """The recurring schedules of every cell (cell name -> its store; one named "" without cells), each with
    its cell, by next occurrence, then id, then the cells' order."""
    rank = {cell: i for i, cell in enumerate(stores)}
    found = [(cell, s) for cell, store in stores.items() for s in store.list_schedules()]
    return sorted(found, key=lambda t: (t[1].next_us, t[1].id, rank[t[0]]))


# -- actions -------------------------------------------------------------------------------------

def act(store: OperatorsStore, action: str, *, ids: Sequence[str] = (), filters: Filters | None = None,
        output_topic: str, at: datetime | None = None, dry_run: bool = False,
        confirm_above: int | None = None, yes: bool = False, batch: int = BATCH) -> ActionResult:
    """Cancel, fire now or reschedule (to `at`) the messages with these ids, or every message matching
    `filters`, in transactions of at most `batch` rows. In-flight rows are left alone and reported.

    Changing more than `confirm_above` messages needs `yes` (raises NeedsConfirmation before changing
    anything). Every action that changes something, and its count, is logged once and added to the
    store's action totals (in the transaction of each change).
    """
    return act_in_cells({"": store}, action, ids=ids, filters=filters, output_topic=output_topic, at=at,
                        dry_run=dry_run, confirm_above=confirm_above, yes=yes, batch=batch)


def act_in_cells(stores: Mapping[str, OperatorsStore], action: str, *, ids: Sequence[str] = (),
                 filters: Filters | None = None, output_topic: str, at: datetime | None = None, dry_run: bool = False,
                 confirm_above: int | None = None, yes: bool = False, batch: int = BATCH) -> ActionResult:
    """`act` in every cell (cell name -> its store; one named "" without cells): an id is not found only
    when no cell holds it, the confirmation counts the messages of every cell before any is changed, and
    each cell's action totals count what changed there. With cells, the result says what changed in each
    cell and the cell of each id it names."""
    if action not in ACTIONS:
        raise ConfigError(f"unknown action {action!r}")
    if (filters is None) == (not ids):
        raise ConfigError("give message ids, or --filter with filters, not both")
    if action == "reschedule" and at is None:
        raise ConfigError("reschedule needs --at or --delay")
    # fire-now: due now by each cell's own clock, the first cell's said
    ats = {cell: from_us(store.db_clock_us()) if action == "fire_now" else at for cell, store in stores.items()}
    result = ActionResult(action=action, dry_run=dry_run, at=next(iter(ats.values())) if action != "cancel" else None)
    named = bool(stores) and "" not in stores
    per_cell = {cell: ActionResult(action=action, dry_run=dry_run) for cell in stores}

    def batches_of(cell: str) -> Iterator[list[str]]:
        store, cell_at = stores[cell], ats[cell]
        if filters is None:
            return _id_batches(store, list(dict.fromkeys(ids)), batch, per_cell[cell])
        # rows this action moved must not come round again in the walk: fire-now walks only rows not
        # yet due (they move to `at`), reschedule skips rows already at `at`
        f = filters
        not_at = None
        if action == "fire_now":
            assert cell_at is not None  # read from the database clock above
            f = dataclasses.replace(f, due_after=max(f.due_after or cell_at, cell_at))
        elif action == "reschedule":
            not_at = cell_at
        return _filter_batches(store, f, batch, output_topic, not_at, per_cell[cell])

    chunks: Iterator[tuple[str, list[str]]] = ((cell, chunk) for cell in stores for chunk in batches_of(cell))
    if not dry_run and confirm_above is not None and not yes:
        # how many would change, up to the threshold, in every cell, before changing anything
        pending: list[tuple[str, list[str]]] = []
        seen = 0
        for cell, chunk in chunks:
            pending.append((cell, chunk))
            seen += len(chunk)
            if seen > confirm_above:
                raise NeedsConfirmation(f"{action.replace('_', '-')} would change more than {confirm_above} "
                                        f"messages (CHRONOS_CONFIRM_ABOVE): give --yes, or --dry-run to see them")
        chunks = iter(pending)
    counted: set[str] = set()
    for cell, chunk in chunks:
        if dry_run:
            changed = chunk
        else:
            changed = stores[cell].apply_action(action, chunk, ats[cell], counted=cell not in counted)
            counted.add(cell)
            # rows claimed between the read and the change
            held = set(chunk) - set(changed)
            per_cell[cell].in_flight.extend(i for i in chunk if i in held)
        per_cell[cell].changed += len(changed)
        room = SAMPLE - len(result.sample)
        if room > 0:
            result.sample.extend(changed[:room])
            result.where.update({i: cell for i in changed[:room]} if named else {})
    for cell, done in per_cell.items():
        result.changed += done.changed
        result.in_flight += done.in_flight
        if named:
            result.where.update({i: cell for i in done.in_flight})
    missing = [set(done.not_found) for done in per_cell.values()]
    result.not_found = [i for i in per_cell[next(iter(stores))].not_found if all(i in m for m in missing)]
    if named:
        result.cells = {cell: done.changed for cell, done in per_cell.items()}
    if not dry_run:
        for cell, store in stores.items():
            if cell not in counted:
                store.apply_action(action, [], ats[cell], counted=True)   # counted even when nothing matched
        # one line per action that changed something (an action that changed nothing is counted, not logged:
        # its outcome is the command's own output or error line)
        log.log(logging.INFO if result.changed else logging.DEBUG,
                "%s: %d messages %s%s%s%s", action.replace("_", "-"), result.changed, _DONE[action],
                f" to {at.isoformat()}" if action == "reschedule" and at else "",
                "".join(f", {n} {what}" for n, what in ((len(result.in_flight), "in flight left alone"),
                                                       (len(result.not_found), "not found")) if n),
                f" ({', '.join(f'{cell} {n}' for cell, n in result.cells.items())})" if result.cells else "")
    return result


_DONE = {"cancel": "cancelled", "fire_now": "made due now", "reschedule": "rescheduled"}


def _id_batches(store: OperatorsStore, ids: list[str], batch: int, result: ActionResult) -> Iterator[list[str]]:
    """The ids given that no firer holds, in batches; records the unknown and in-flight ones."""
    for start in range(0, len(ids), batch):
        chunk = ids[start:start + batch]
        found = store.present(chunk)
        result.not_found.extend(i for i in chunk if i not in found)
        result.in_flight.extend(i for i in chunk if found.get(i))
        ready = [i for i in chunk if found.get(i) is False]
        if ready:
            yield ready


def _filter_batches(store: OperatorsStore, f: Filters, batch: int, output_topic: str, not_at: datetime | None,
                    result: ActionResult) -> Iterator[list[str]]:
    """Ids of the rows matching the filters, a page at a time; records the in-flight ones."""
    after = None
    while True:
        page = list_messages(store, f, output_topic=output_topic, limit=batch, after=after, not_at=not_at)
        result.in_flight.extend(m.id for m in page.items if m.state == "in_flight")
        ready = [m.id for m in page.items if m.state != "in_flight"]
        if ready:
            yield ready
        if page.cursor is None:
            return
        after = page.cursor


# -- JSON ----------------------------------------------------------------------------------------

def to_json(result: Message | Page | ActionResult | None) -> Any:
    """A result as plain JSON values: times ISO-8601 UTC, bytes as UTF-8 text when they are, plus hex."""
    if result is None:
        return {"state": "not_found"}
    if isinstance(result, Page):
        listed = [_listed_json(m) for m in result.items]
        for item, cell in zip(listed, result.cells or ()):
            item["cell"] = cell
        return {"messages": listed, "next": result.cursor}
    if isinstance(result, ActionResult):
        out = {"action": result.action.replace("_", "-"), "dry_run": result.dry_run, "changed": result.changed,
               "in_flight": result.in_flight, "not_found": result.not_found, "sample": result.sample,
               "at": iso(result.at) if result.at else None}
        if result.cells is not None:
            out.update(cells=result.cells, where=result.where)
        return out
    m = result
    return {"id": m.id, "state": m.state, "deadline": iso(m.deadline), "topic": m.topic, "key": bytes_json(m.key),
            "headers": [[k, bytes_json(v)] for k, v in m.headers], "value_size": m.value_size,
            "value_preview": None if m.value_size is None else bytes_json(m.value_preview),
            "value_truncated": bool(m.value_size and m.value_size > PREVIEW_BYTES),
            "ordering_key": m.ordering_key, "enqueued_at": iso(m.enqueued_at),
            "firer": str(m.firer) if m.firer else None, "claimed_at": iso(m.claimed_at) if m.claimed_at else None,
            "cron": m.cron, "timezone": m.timezone, "dst_policy": m.dst_policy,
            "next_occurrence": iso(m.deadline) if m.state == "recurring" else None,
            "attempts": m.attempts, "last_error": m.last_error,
            "original_deadline": iso(m.original_deadline) if m.original_deadline else None}


def _listed_json(m: Listed) -> dict[str, Any]:
    return {"id": m.id, "state": m.state, "deadline": iso(m.deadline), "topic": m.topic, "key": bytes_json(m.key),
            "ordering_key": m.ordering_key, "firer": str(m.firer) if m.firer else None, "cron": m.cron}


def bytes_json(data: bytes | None) -> dict[str, Any] | None:
    """{"text": the UTF-8 text or None, "hex": ...}: a script never has to guess which it got."""
    if data is None:
        return None
    return {"text": text_or_none(data), "hex": data.hex()}


def text_or_none(data: bytes) -> str | None:
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def safe_text(data: bytes | None, limit: int = PREVIEW_BYTES) -> str:
    """Bytes for a terminal: printable UTF-8 as a quoted, escaped string, anything else as hex."""
    if data is None:
        return "null"
    text = text_or_none(data[:limit])
    if text is not None and text.isprintable():
        shown = repr(text)
    else:
        shown = "hex:" + data[:limit].hex()
    return shown + ("..." if len(data) > limit else "")


def schedule_facts(m: Message) -> list[tuple[str, str]]:
    """Where a message stands in time, as (label, text) lines for `chronos show` and the console: the
    firer holding it (in flight), its cron and next occurrence (recurring), or its deadline."""
    facts = []
    if m.state == "in_flight":
        # since when: unknown to a role that may not see the firers' sessions hold a row (held_sessions)
        facts.append(("firer", f"{m.firer}" + (f" since {iso(m.claimed_at)}" if m.claimed_at else "")))
    if m.state == "recurring":
        facts += [("cron", f"{m.cron} ({m.timezone}" + (f", {m.dst_policy})" if m.dst_policy else ")")),
                  ("next occurrence", iso(m.deadline))]
    else:
        facts.append(("deadline", iso(m.deadline)))
    return facts


def iso(when: datetime) -> str:
    return when.astimezone(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")

