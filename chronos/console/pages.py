"""The console's pages: the overview and its live JSON, the schedules, signing in and out, the
messages pages (search, a message) and the parked ones (search, a parked message), the actions over
them, and the error pages.

The messages pages and their actions are a second face on `chronos.ops.inspect` and the operators' store
port, the functions behind `chronos show`, `list`, `cancel`, `fire-now` and `reschedule`; the parked pages
and theirs on `chronos.ops.parked`, behind `chronos parked list|show|replay|drop` (same parsing, same
statements, same actions; nothing here talks SQL). Every store call runs off the event loop through
the console's store readers, one per cell: with cells, every page and action covers every cell and says
which cell each thing is in."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from typing import Any, Mapping, NamedTuple
from urllib.parse import urlencode

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from chronos.console.auth import COOKIE, same_origin
from chronos.console.context import Console, check_action, console_of, read_form
from chronos.console.views import id_from_path, message_url, show_bytes
from chronos.domain import cron
from chronos.domain.operators import PREVIEW_BYTES, STATES, Filters, ParkedFilters, ParkedMessage
from chronos.errors import ChronosError, ConfigError, NeedsConfirmation, UnavailableError
from chronos.ops import inspect
from chronos.ops import parked as parked_ops

log = logging.getLogger("chronos.console")

NEXT_OCCURRENCES = 5
FILTER_FIELDS = ("id_prefix", "key", "topic", "ordering_key", "state", "due_after", "due_before")
DEFAULT_LIMIT = 50
MAX_LIMIT = 500
VERBS = {"cancel": ("Cancel", "cancel", "cancelled"), "fire_now": ("Fire now", "fire now", "made due now"),
         "reschedule": ("Reschedule", "reschedule", "rescheduled")}


def by_cell(counts: Mapping[str, int] | None, verb: str) -> str:
    """`By cell, would change: a 3, b 0.`: what an action does in each cell, with cells; nothing without."""
    if not counts:
        return ""
    return f"By cell, {verb}: " + ", ".join(f"{cell} {n:,}" for cell, n in counts.items()) + "."


# -- the overview and the schedules ------------------------------------------------------------

async def overview(request: Request) -> Response:
    console = console_of(request)
    return console.page(request, "overview.html", live=orjson.loads(await console.live()))


async def overview_json(request: Request) -> Response:
    return Response(await console_of(request).live(), media_type="application/json")


async def schedules(request: Request) -> Response:
    console = console_of(request)
    try:
        rows = await console.call_cells(inspect.schedules_in_cells)
        error = None
    except ChronosError as exc:
        rows, error = [], str(exc)
    items = []
    for cell, (sid, expr, tz, next_us, topic, okey, created) in rows:
        upcoming: list[datetime] = [cron.from_us(next_us)]
        problem = None
        try:
            schedule = cron.parse(expr, tz)
            while len(upcoming) < NEXT_OCCURRENCES:
                upcoming.append(schedule.next_after(upcoming[-1]))
        except cron.CronError as exc:
            problem = str(exc)
        items.append({"id": sid, "cron": expr, "timezone": tz, "topic": topic, "ordering_key": okey,
                      "created_at": created, "next": upcoming, "problem": problem, "cell": cell})
    return console.page(request, "schedules.html", schedules=items, error=error, cells=console.cells,
                        now=datetime.now(timezone.utc))


# -- signing in --------------------------------------------------------------------------------

async def login_form(request: Request) -> Response:
    console = console_of(request)
    if console.auth.read_only:
        return console.page(request, "error.html", 403, title="Read-only console",
                            message="This console has no token (CHRONOS_CONSOLE_TOKEN), so nobody can act "
                                    "through it.")
    return console.page(request, "login.html", failed=False)


async def login(request: Request) -> Response:
    console = console_of(request)
    if console.auth.read_only:
        return await login_form(request)
    if not same_origin(request.headers, request.url.scheme, request.headers.get("host", "")):
        return console.page(request, "error.html", 403, title="Refused",
                            message="This request did not come from the console's own page.")
    form = await read_form(request)
    if not console.auth.check_token(form.get("token", "")):
        await asyncio.sleep(0.5)  # slows down guessing
        return console.page(request, "login.html", 403, failed=True)
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(COOKIE, console.auth.new_session(), httponly=True, samesite="strict",
                        secure=request.url.scheme == "https", path="/")
    return response


async def logout(request: Request) -> Response:
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


# -- messages ----------------------------------------------------------------------------------

def filters_from(fields: Mapping[str, str], output_topic: str, now: datetime) -> Filters:
    """The search's filters as `chronos list` parses its flags (raises ConfigError on bad input)."""
    def get(name: str) -> str | None:
        return fields.get(name, "").strip() or None

    due_after, due_before = get("due_after"), get("due_before")
    return inspect.filters_for(
        output_topic=output_topic,
        due_after=inspect.parse_time(due_after, now, "due after") if due_after else None,
        due_before=inspect.parse_time(due_before, now, "due before") if due_before else None,
        topic=get("topic"), key=inspect.parse_key(get("key")), ordering_key=get("ordering_key"),
        id_prefix=get("id_prefix"), state=get("state"))


def _limit(text: str | None) -> int:
    if not text:
        return DEFAULT_LIMIT
    try:
        limit = int(text)
    except ValueError:
        raise ConfigError(f"limit must be a whole number, got {text!r}") from None
    if not 0 < limit <= MAX_LIMIT:
        raise ConfigError(f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
    return limit


async def search(request: Request) -> Response:
    """`/messages`: one page of `chronos list` for the filters in the query string."""
    console = console_of(request)
    params = {k: v for k, v in request.query_params.items() if k in (*FILTER_FIELDS, "limit", "after")}
    output_topic = console.settings.output_topic
    rows: list[dict[str, Any]] = []
    next_url = error = note = None
    try:
        f = filters_from(params, output_topic, datetime.now(timezone.utc))
        limit = _limit(params.get("limit"))
        without, page = await console.call_cells(lambda stores: (inspect.without_key_search(stores, f), inspect.list_in_cells(
            stores, f, output_topic=output_topic, limit=limit, after=params.get("after") or None,
            held_within_ms=console.settings.hold_time_ms // 2)))
        note = inspect.key_search_note(without)
    except ChronosError as exc:
        error = str(exc)
    else:
        rows = [{"id": m.id, "url": message_url(m.id), "state": m.state, "deadline": m.deadline,
                 "topic": m.topic, "key": show_bytes(m.key, 64), "ordering_key": m.ordering_key, "cell": cell}
                for m, cell in zip(page.items, page.cells or [""] * len(page.items))]
        if page.cursor:
            next_url = "/messages?" + urlencode({**{k: v for k, v in params.items() if v and k != "after"},
                                                 "after": page.cursor})
    filter_fields = [(k, params[k]) for k in FILTER_FIELDS if params.get(k)]
    return console.page(request, "messages.html", 400 if error else 200, rows=rows, error=error, note=note,
                        next_url=next_url, filters=params, filter_fields=filter_fields,
                        states=("", *STATES), cells=console.cells)


async def detail(request: Request) -> Response:
    """`/messages/<url-encoded id>`: what `chronos show` tells about one message or schedule."""
    console = console_of(request)
    message_id = id_from_path(request.scope.get("raw_path") or request.url.path.encode())
    if message_id is None:
        raise HTTPException(404)
    found = await console.call_cells(lambda stores: inspect.show_in_cells(
        stores, message_id, output_topic=console.settings.output_topic))
    cell, m = found[0] if found else ("", None)
    if m is None:
        return console.page(request, "error.html", 404, title="Not found",
                            message=f"No message or schedule with the id {message_id!r} is in the store "
                                    "(it may have fired or been cancelled).")
    facts = [("cell", cell + (f" (also in {', '.join(c for c, _ in found[1:])})" if found[1:] else ""))] if cell \
        else []
    facts += inspect.schedule_facts(m)
    if m.original_deadline is not None:
        facts.append(("scheduled for", inspect.iso(m.original_deadline)))
    if m.attempts:
        facts.append(("failed publishes", f"{m.attempts}, last: {m.last_error}"))
    facts += [("topic", m.topic), ("ordering key", m.ordering_key if m.ordering_key is not None else "-"),
              ("enqueued", inspect.iso(m.enqueued_at))]
    value = show_bytes(None if m.value_size is None else m.value_preview, size=m.value_size)
    view = {"id": m.id, "state": m.state, "facts": facts, "key": show_bytes(m.key),
            "headers": [(name, show_bytes(v)) for name, v in m.headers], "value": value}
    return console.page(request, "message.html", m=view)


# -- actions ---------------------------------------------------------------------------------

def _target(form: Mapping[str, str], output_topic: str, now: datetime) -> dict[str, Any]:
    """What an action form names: one id, or the filters of a search."""
    if form.get("id"):
        return {"ids": [form["id"]]}
    f = filters_from(form, output_topic, now)
    if f.empty:
        raise ConfigError("an action on a search needs at least one filter")
    return {"filters": f}


def _when(form: Mapping[str, str], action: str, now: datetime) -> datetime | None:
    if action != "reschedule":
        return None
    at, delay = form.get("at", "").strip(), form.get("delay", "").strip()
    if bool(at) == bool(delay):
        raise ConfigError("reschedule needs a new deadline or a delay (one of them)")
    return inspect.parse_time(at, now, "new deadline") if at else now + inspect.parse_delay(delay)


class _Action(NamedTuple):
    """An action form the request may post, read: what it acts on and, for a reschedule, the new time."""

    console: Console
    form: Mapping[str, str]
    action: str
    target: dict[str, Any]
    at: datetime | None


async def _action_form(request: Request) -> _Action | Response:
    """The posted action form, or a refusal page (403) when the request may not act (read-only, no
    session, another origin, a wrong form token); 400 when the form names no valid action or target."""
    console = console_of(request)
    form = await read_form(request)
    refused = check_action(request, form)
    if refused:
        return console.page(request, "error.html", 403, title="Refused", message=refused)
    action = form.get("action", "")
    if action not in VERBS:
        raise HTTPException(400, f"unknown action {action!r}")
    try:
        now = datetime.now(timezone.utc)
        target = _target(form, console.settings.output_topic, now)
        at = _when(form, action, now)
    except ChronosError as exc:
        raise HTTPException(400, str(exc)) from None
    return _Action(console, form, action, target, at)


async def preview(request: Request) -> Response:
    """The confirmation page: what the action would change, counted by a dry run, before anything changes."""
    posted = await _action_form(request)
    if isinstance(posted, Response):
        return posted
    console, form, action, target, at = posted
    try:
        result = await console.call_cells(lambda stores: inspect.act_in_cells(
            stores, action, output_topic=console.settings.output_topic, at=at, dry_run=True, **target))
    except ChronosError as exc:
        raise HTTPException(400, str(exc)) from None
    fields = [("action", action)] + ([("id", form["id"])] if "ids" in target else
                                     [(k, form[k]) for k in FILTER_FIELDS if form.get(k)])
    if at is not None:
        fields.append(("at", at.isoformat()))  # a delay is fixed now, so the confirmed time is the one shown
    verb, verb_lower, _ = VERBS[action]
    back = message_url(form["id"]) if "ids" in target else "/messages?" + urlencode(
        [(k, form[k]) for k in FILTER_FIELDS if form.get(k)])
    return console.page(request, "confirm.html", verb=verb, verb_lower=verb_lower, count=result.changed,
                        type_count=result.changed > console.settings.confirm_above,
                        when=f"to {inspect.iso(at)}" if at else None, fields=fields, back=back,
                        in_flight=len(result.in_flight), not_found=len(result.not_found),
                        note=by_cell(result.cells, "would change") or None)


def _confirmed(console, form, what: str) -> int:
    """The count a confirmation form confirms (a ValueError when it has none). Above CHRONOS_CONFIRM_ABOVE, as
    the CLI wants --yes, the count must be typed, not only clicked: a ConfigError saying so (`what` is what the
    action does, with a place for the threshold)."""
    expected = int(form.get("expected", ""))
    typed = form.get("typed", "").replace(",", "").strip()
    if expected > console.settings.confirm_above and typed != str(expected):
        raise ConfigError(f"this {what.format(console.settings.confirm_above)} (CHRONOS_CONFIRM_ABOVE): type the "
                          f"count, {expected:,}, to confirm")
    return expected


async def apply(request: Request) -> Response:
    """Take a confirmed action; refuses when more messages match now than were confirmed."""
    posted = await _action_form(request)
    if isinstance(posted, Response):
        return posted
    console, form, action, target, at = posted
    try:
        expected = _confirmed(console, form, "changes more than {:,} messages")
        result = await console.call_cells(lambda stores: inspect.act_in_cells(
            stores, action, output_topic=console.settings.output_topic, at=at, confirm_above=expected, **target))
    except NeedsConfirmation:
        raise HTTPException(409, "More messages match now than you confirmed: nothing was changed. "
                                 "Review the action again.") from None
    except ValueError:
        raise HTTPException(400, "the confirmation form is incomplete") from None
    except ChronosError as exc:
        raise HTTPException(400, str(exc)) from None
    verb, _, past = VERBS[action]
    notes = [by_cell(result.cells, past)] if result.cells else []
    if result.in_flight:
        notes.append(f"{len(result.in_flight):,} in flight (a firer is publishing them) were left alone.")
    if result.not_found:
        notes.append(f"{len(result.not_found):,} were no longer in the store.")
    return console.page(request, "done.html", verb=verb, count=result.changed, past=past, note=" ".join(notes),
                        back="/messages")


# -- parked messages ---------------------------------------------------------------------------

PARKED_FILTERS = ("topic", "reason", "id_prefix", "parked_after", "parked_before")
PARKED_VERBS = {"replay": ("Replay", "replay", "replayed"), "drop": ("Drop", "drop", "dropped")}


def parked_filters_from(fields: Mapping[str, str], now: datetime) -> ParkedFilters:
    """The Parked page's filters as `chronos parked list` parses its flags (raises ConfigError on bad input)."""
    return parked_ops.filters_for(now, **{k: fields.get(k, "").strip() or None for k in PARKED_FILTERS})


def _parked_view(p: ParkedMessage, preview: int = 64, *, cell: str = "") -> dict[str, Any]:
    return {"number": p.number, "name": parked_ops.label(cell, p.number), "cell": cell,
            "url": _parked_url(cell, p.number), "message_id": p.message_id, "source": p.source,
            "topic": p.topic, "deadline": p.deadline, "reason": p.reason, "parked_at": p.parked_at,
            "key": show_bytes(p.key, preview), "headers": [(name, show_bytes(v, preview)) for name, v in p.headers],
            "value": show_bytes(None if p.value_size is None else p.value_preview, size=p.value_size)}


def _parked_url(cell: str, number: int) -> str:
    return f"/parked/{cell}/{number}" if cell else f"/parked/{number}"


async def parked(request: Request) -> Response:
    """Messages no topic accepted, newest first (`chronos_parked`; with cells, every cell's, each named
    CELL#NUMBER), a page at a time, with the filters of `chronos parked list`; signed in, the actions on every
    one a search matches."""
    console = console_of(request)
    params = {k: v for k, v in request.query_params.items() if k in (*PARKED_FILTERS, "before")}
    text = params.get("before", "")
    error = None
    rows: list[dict[str, Any]] = []
    next_url = None
    if text and not console.cells and not (text.isdigit() and int(text) > 0):
        error = f"before is not a page cursor of this page: {text!r}"
    else:
        try:
            f = parked_filters_from(params, datetime.now(timezone.utc))
            page = await console.call_cells(lambda stores: parked_ops.list_parked_in_cells(
                stores, limit=DEFAULT_LIMIT, before=text or None, filters=f))
        except ChronosError as exc:
            error = str(exc)
        else:
            rows = [_parked_view(p, cell=cell) for p, cell in zip(page.items, page.cells or [""] * len(page.items))]
            if page.cursor is not None:
                next_url = "/parked?" + urlencode({"before": page.cursor, **{k: v for k, v in params.items()
                                                                            if v and k != "before"}})
    filter_fields = [(k, params[k]) for k in PARKED_FILTERS if params.get(k)]
    return console.page(request, "parked.html", 400 if error else 200, rows=rows, error=error, next_url=next_url,
                        filters=params, filter_fields=filter_fields, cells=console.cells)


async def parked_detail(request: Request) -> Response:
    """`/parked/<number>` (with cells `/parked/<cell>/<number>`): what `chronos parked show` tells about one
    parked message, and its actions."""
    console = console_of(request)
    number = request.path_params["number"]
    cell = request.path_params.get("cell", "")
    if cell not in console.readers:
        raise HTTPException(404)
    p = await console.readers[cell].call(lambda s: s.show_parked(number))
    if p is None:
        return console.page(request, "error.html", 404, title="Not found",
                            message=f"No parked message {parked_ops.label(cell, number)} (it may have been replayed "
                                    "or dropped).")
    return console.page(request, "parked_message.html", p=_parked_view(p, PREVIEW_BYTES, cell=cell))


class _ParkedAction(NamedTuple):
    """A parked messages' action form the request may post, read."""

    console: Console
    form: Mapping[str, str]
    action: str
    target: dict[str, Any]
    to: str | None


async def _parked_form(request: Request) -> _ParkedAction | Response:
    """The posted form of an action on parked messages, or a refusal page (403) as for the other actions;
    400 when it names no valid action, number or filter, or a replay and the console has no Kafka."""
    console = console_of(request)
    form = await read_form(request)
    refused = check_action(request, form)
    if refused:
        return console.page(request, "error.html", 403, title="Refused", message=refused)
    action = form.get("action", "")
    if action not in PARKED_VERBS:
        raise HTTPException(400, f"unknown action {action!r}")
    try:
        if form.get("number"):
            target: dict[str, Any] = {"refs": parked_ops.parse_refs([form["number"]], list(console.readers))}
        else:
            f = parked_filters_from(form, datetime.now(timezone.utc))
            if f.empty:
                raise ConfigError("an action on parked messages needs a number or at least one filter")
            target = {"filters": f}
    except ChronosError as exc:
        raise HTTPException(400, str(exc)) from None
    if action == "replay" and not console.settings.kafka_bootstrap_servers:
        raise HTTPException(400, "This console has no Kafka to replay to: start it with "
                                 "CHRONOS_KAFKA_BOOTSTRAP_SERVERS (or a ready file) set.")
    to = (form.get("to", "").strip() or None) if action == "replay" else None
    return _ParkedAction(console, form, action, target, to)


def _act_on_parked(console: Console, action: str, target: dict[str, Any], to: str | None, **kw: Any):
    """What acts on the store for a parked messages' action: a replay publishes with the console's Kafka
    settings, as `chronos parked replay` does."""
    settings = console.settings
    if action == "drop":
        return lambda stores: parked_ops.drop_in_cells(stores, **target, **kw)

    def producer() -> Any:
        from chronos.adapters.kafka.admin import check_reachable
        from chronos.adapters.kafka.clients import make_producer
        assert settings.kafka_bootstrap_servers  # _parked_form refuses a replay without
        check_reachable(settings.kafka_bootstrap_servers, settings.kafka_config, secrets=settings.secrets())
        timeout_ms = str(int(parked_ops.REPLAY_TIMEOUT_S * 1000))
        return make_producer(settings, "console replay", **{"message.timeout.ms": timeout_ms})[0]
    destinations = parked_ops.Destinations(settings.output_topic, settings.dlq_topic, settings.allowed_topics_re)
    return lambda stores: parked_ops.replay_in_cells(stores, producer, destinations, to=to, **target, **kw)


async def parked_preview(request: Request) -> Response:
    """The confirmation page of a replay or a drop: what it would act on, counted first."""
    posted = await _parked_form(request)
    if isinstance(posted, Response):
        return posted
    console, form, action, target, to = posted
    try:
        result = await console.call_cells(_act_on_parked(console, action, target, to, dry_run=True))
    except ChronosError as exc:
        raise HTTPException(400, str(exc)) from None
    fields = [("action", action)] + ([("number", form["number"])] if "refs" in target else
                                     [(k, form[k]) for k in PARKED_FILTERS if form.get(k)])
    if to is not None:
        fields.append(("to", to))
    verb, verb_lower, _ = PARKED_VERBS[action]
    back = _parked_url(*target["refs"][0]) if "refs" in target else "/parked?" + urlencode(
        [(k, form[k]) for k in PARKED_FILTERS if form.get(k)])
    when = None if action == "drop" else f"to {to}" if to else "each to the topic it was going to"
    not_allowed = result.labels("not_allowed")
    notes = [f"{len(not_allowed):,} more would stay parked: CHRONOS_ALLOWED_TOPICS does not allow the topic "
             "they were going to (give a topic to replay them to)."] if not_allowed else []
    if console.cells:
        notes.append(by_cell({cell: part.changed for cell, part in result.parts.items()},
                             f"would be {PARKED_VERBS[action][2]}"))
    note = " ".join(notes) or None
    return console.page(request, "confirm.html", verb=verb, verb_lower=verb_lower, count=result.changed,
                        noun="parked message", type_count=result.changed > console.settings.confirm_above,
                        when=when, fields=fields, back=back, apply_url="/parked/actions/apply", in_flight=0,
                        not_found=len(result.labels("not_found")), note=note)


async def parked_apply(request: Request) -> Response:
    """Take a confirmed replay or drop; refuses when more parked messages match now than were confirmed."""
    posted = await _parked_form(request)
    if isinstance(posted, Response):
        return posted
    console, form, action, target, to = posted
    try:
        expected = _confirmed(console, form, "acts on more than {:,} parked messages")
        # statement by statement: a replay waits on Kafka between them, and the pages read on meanwhile
        result = await console.call_cells(_act_on_parked(console, action, target, to, confirm_above=expected))
    except NeedsConfirmation:
        raise HTTPException(409, "More parked messages match now than you confirmed: nothing was done. "
                                 "Review the action again.") from None
    except ValueError:
        raise HTTPException(400, "the confirmation form is incomplete") from None
    except UnavailableError as exc:
        raise HTTPException(503, str(exc)) from None
    except ChronosError as exc:
        raise HTTPException(400, str(exc)) from None
    verb, _, past = PARKED_VERBS[action]
    notes = [by_cell({cell: part.changed for cell, part in result.parts.items()}, past)] if console.cells else []
    refused, not_allowed = result.refused(), result.labels("not_allowed")
    unanswered, not_found = result.labels("unanswered"), result.labels("not_found")
    if refused:
        notes.append(f"{len(refused):,} refused by Kafka stay parked, with the refusal as their reason.")
    if not_allowed:
        notes.append(f"{len(not_allowed):,} stay parked: CHRONOS_ALLOWED_TOPICS does not allow the topic "
                     "they were going to.")
    if unanswered:
        notes.append(f"Kafka did not answer in time: {len(unanswered):,} stay parked as they were, and the "
                     "replay stopped there.")
    if not_found:
        notes.append(f"{len(not_found):,} were no longer parked.")
    return console.page(request, "done.html", verb=verb, count=result.changed, noun="parked message", past=past,
                        note=" ".join(notes), back="/parked")


# -- errors ------------------------------------------------------------------------------------

async def not_found(request: Request, exc: Exception) -> Response:
    console = console_of(request)
    status_code = getattr(exc, "status_code", 404)
    detail = getattr(exc, "detail", None)
    if status_code == 404:
        return console.page(request, "error.html", 404, title="Not found",
                            message="There is nothing at this address.")
    return console.page(request, "error.html", status_code, title="Cannot do that",
                        message=str(detail) if detail else "The request was refused.")


async def server_error(request: Request, exc: Exception) -> Response:
    log.error("%s %s failed: %s", request.method, request.url.path, type(exc).__name__, exc_info=exc)
    return console_of(request).page(request, "error.html", 500, title="Something went wrong",
                                    message="The console could not answer; its log says why.")
