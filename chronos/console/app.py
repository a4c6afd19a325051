"""The console's web application (Starlette): pages rendered on the server, one JSON endpoint
for the overview's live refresh, and the security around them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import datetime, timedelta, timezone
from importlib import resources
from typing import Any, AsyncIterator
from urllib.parse import parse_qs

import orjson
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from chronos.domain import cron
from chronos.config import Settings
from chronos.console.auth import COOKIE, Auth, same_origin
from chronos.console.live import MetricsSampler, StoreReader, histogram_svg, rates_svg
from chronos.errors import ChronosError
from chronos.ops import status

log = logging.getLogger("chronos.console")

_HERE = resources.files("chronos.console")
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
MAX_FORM_BYTES = 64 * 1024
NEXT_OCCURRENCES = 5

# No script but the console's own file, no inline script or style, no framing: even a value that
# escaped escaping could not run.
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                 b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),  # no-referrer would make Origin "null" on our own forms
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every response (a plain ASGI middleware: no per-request overhead)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + SECURITY_HEADERS
            await send(message)
        await self.app(scope, receive, with_headers)


class Console:
    """Everything a request handler needs: settings, the store reader, metrics, auth, templates."""

    def __init__(self, settings: Settings, store: Any, *, metrics_urls: tuple[str, ...] = ()):
        self.settings = settings
        self.reader = StoreReader(store, settings.hold_time_ms, settings.output_topic)
        self.sampler = MetricsSampler(metrics_urls)
        self.auth = Auth(settings.console_token)
        self.env = Environment(loader=FileSystemLoader(str(_HERE / "templates")),
                               autoescape=select_autoescape(default=True, default_for_string=True))
        self.env.globals["relative"] = relative
        self._live: tuple[float, bytes] | None = None
        self._live_lock = asyncio.Lock()

    # -- rendering ---------------------------------------------------------------------------

    def page(self, request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        sid = self.auth.session(request.cookies.get(COOKIE))
        context.update(read_only=self.auth.read_only, signed_in=sid is not None,
                       form_token=self.auth.form_token(sid) if sid else None, path=request.url.path)
        return HTMLResponse(self.env.get_template(template).render(**context), status_code=status_code)

    # -- the live overview ---------------------------------------------------------------------

    async def live(self) -> bytes:
        """The overview as JSON, built at most once a second whoever asks."""
        self.sampler.watched()
        async with self._live_lock:
            now = time.monotonic()
            if self._live is not None and now - self._live[0] < self.reader.ttl:
                return self._live[1]
            body = orjson.dumps(await self.snapshot())
            self._live = (now, body)
            return body

    async def snapshot(self) -> dict[str, Any]:
        store, error = await self.reader.overview()
        history = self.sampler.history
        lateness = history.lateness()
        rates = history.rates()
        shown = display(store, rates, lateness)
        stalled, longest = history.stalled()
        publishing_stalled = (f"{stalled} process{'es' if stalled > 1 else ''} published nothing Kafka acknowledged "
                              f"for up to {_seconds_text(longest)}: their producers are being replaced; see their logs"
                              if stalled else "")
        postgres = (store or {}).get("postgres")
        reported = status.reported_dicts(history.asked(), postgres) if self.sampler.urls else None
        processes, postgres_apart = postgres_processes(postgres, reported)
        shown.update(metrics_answering=str(history.sources_up), store_error=error or "",
                     publishing_stalled=publishing_stalled, postgres_apart=postgres_apart)
        return {"store": store, "store_error": error, "rates": rates, "publishing_stalled": publishing_stalled,
                "postgres_apart": postgres_apart, "postgres_processes": processes,
                "lateness": None if lateness is None else {k: lateness[k] for k in
                                                          ("count", "window_s", "p50", "p99", "p999")},
                "metrics": {"sources": len(self.sampler.urls), "answering": history.sources_up},
                "display": shown,
                "nodes": [[n["node"], f"{n['rows']:,}", _seconds_text(n["held_for_s"]), f"{n['past_hold_time']:,}"]
                          for n in (store or {}).get("in_flight_by_node", [])],
                # topics under a fire-rate limit: due rows it holds back, and how late the oldest is
                "throttled": [[t["topic"], f"{t['rate_per_s']:g}/s", f"{t['rows']:,}",
                               _seconds_text(t["lateness_s"]) if t["rows"] else "-"]
                              for t in (store or {}).get("throttled", [])],
                "charts": {"lateness": histogram_svg(lateness),
                           "rates": rates_svg(history.series(), time.time())}}


def display(store: dict[str, Any] | None, rates: dict[str, float] | None,
            lateness: dict[str, Any] | None) -> dict[str, str]:
    """Every figure of the overview as the text the page shows (the same for the first render and
    the live refresh, so the script only copies text)."""
    out: dict[str, str] = {}
    if store is not None:
        age = store.get("waiting_age_s") or 0.0
        out.update(waiting=f"{store['waiting']:,}",
                   waiting_note=("estimate" if store["waiting_estimated"] else "counted")
                   + (f" {age:.0f} s ago" if age >= 2 else ""),
                   due_now=f"{store['due_now']:,}", in_flight=f"{store['in_flight']:,}",
                   oldest_overdue=_seconds_text(store["oldest_overdue_s"]),
                   past_hold_time=f"{store['past_hold_time']:,}",
                   parked="-" if store.get("parked") is None else f"{store['parked']:,}",
                   recurring_schedules="-" if store["recurring_schedules"] is None
                   else f"{store['recurring_schedules']:,}",
                   next_deadline="-" if store["next_deadline_in_s"] is None
                   else f"in {_seconds_text(store['next_deadline_in_s'])}",
                   next_deadline_at=store["next_deadline"] or "", at=store["at"])
        postgres = store.get("postgres")
        if postgres:
            standbys = postgres["standbys"]
            states = [s["sync_state"] for s in standbys]
            out.update(postgres_role=postgres["role"],
                       postgres_note=f"{postgres['server'] or '-'} · PostgreSQL {postgres['version']} · "
                       + (f"{len(standbys)} standby{'s' if len(standbys) > 1 else ''}" if standbys else "no standby")
                       + (" (state not visible)" if None in states else f" ({', '.join(states)})" if states else ""))
        broker = store.get("embedded_broker")
        if broker:  # `chronos up`'s embedded broker: it keeps every message in memory
            rss, warn, held = broker["rss_bytes"], broker["memory_warning_bytes"], broker["messages"]
            out.update(broker_rss="-" if rss is None else f"{rss / 2 ** 20:,.0f} MB",
                       broker_note=("-" if held is None else f"{held:,} messages held")
                       + (f"; above {warn / 2 ** 20:,.0f} MB: plan a restart" if rss and warn and rss >= warn else "")
                       + (f"; restarted {broker['restarts']}x, about {broker['lost_input']:,} unread lost"
                          if broker["restarts"] else ""))
    for key in ("in", "fired", "dead"):
        out[f"rate_{key}"] = "-" if rates is None else f"{rates[key]:,.1f}/s"
    for key in ("p50", "p99", "p999"):
        value = None if lateness is None else lateness[key]
        out[key] = "-" if value is None else _seconds_text(value)
    out["lateness_count"] = "-" if lateness is None else f"{lateness['count']:,}"
    out["lateness_window"] = "-" if lateness is None else _seconds_text(lateness["window_s"])
    return out


_APART = {"no_connection": "no connection open", "other_server": "another server than the console's",
          "no_session_here": "no session on the console's server: another one behind the same address"}


def postgres_processes(postgres: dict[str, Any] | None,
                       reported: list[dict[str, Any]] | None) -> tuple[list[list[str]], str]:
    """The overview's table of the PostgreSQL server each process uses, one row per process: what it
    reports on its /metrics (`status.reported_dicts`; None: no URL known), with its sessions on the
    console's server (`status.postgres_dict`); then the processes with sessions there that no URL
    answered for, and the firers that hold rows with none. And the banner's text: the processes on
    another server than the console's, or on none ("" when there is none)."""
    here = postgres["server"] if postgres else None
    sessions = {p["node"]: p["sessions"] for p in (postgres or {}).get("processes", [])}
    rows: list[list[str]] = []
    apart: list[str] = []
    listed: set[str] = set()
    for r in reported or []:
        name = f"{r['role']} {r['node'][:8]}" if r["role"] else r["url"]
        listed.add(r["node"] or "")
        here_count = f"{sessions.get(r['node'], 0):,}" if postgres and r["node"] else "-"
        if not r["answered"]:
            rows.append([name, "-", here_count, "-", "-", "-", "no answer"])
            continue
        if r["role"] is None:
            rows.append([name, "-", "-", "-", "-", "-", "reports no PostgreSQL connection metrics"])
            continue
        servers = ", ".join(f"{s} ×{n}" if n > 1 else s for s, n in r["servers"].items()) or "none"
        note = _APART.get(r["apart"], "")
        if r["apart"]:
            apart.append(f"{name} {'has none' if r['apart'] == 'no_connection' else 'is on ' + servers}"
                         + (" (no session on the console's)" if r["apart"] == "no_session_here" else ""))
        rows.append([name, servers, here_count, f"{r['reconnects']:,}", f"{r['server_changes']:,}",
                     f"{r['unanswered']:,}", note])
    for p in (postgres or {}).get("processes", []):
        if p["node"] not in listed:
            rows.append([f"{p['role']} {p['node'][:8]}", "-", f"{p['sessions']:,}", "-", "-", "-",
                         "sessions on this server; its /metrics not asked"])
    for f in (postgres or {}).get("firers_not_connected", []):
        if f["node"] not in listed:
            rows.append([f"firer {f['node'][:8]}", "-", "0", "-", "-", "-",
                         f"holds {f['rows']:,} row{'s' if f['rows'] != 1 else ''} but has no session on this server: "
                         f"connected elsewhere, or gone"])
    banner = ""
    if apart:
        banner = (f"{len(apart)} process{'es' if len(apart) > 1 else ''} not on the console's server "
                  f"{here or '-'}: {'; '.join(apart)}")
    return rows, banner


def _seconds_text(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) < 1:
        return f"{value * 1000:.0f} ms"
    if abs(value) < 60:
        return f"{value:.1f} s"
    if abs(value) < 3600:
        return f"{value / 60:.1f} min"
    if abs(value) < 172800:
        return f"{value / 3600:.1f} h"
    return f"{value / 86400:.1f} d"


def _console(request: Request) -> Console:
    return request.app.state.console


# -- pages -------------------------------------------------------------------------------------

async def overview(request: Request) -> Response:
    console = _console(request)
    return console.page(request, "overview.html", live=orjson.loads(await console.live()))


async def overview_json(request: Request) -> Response:
    return Response(await _console(request).live(), media_type="application/json")


async def schedules(request: Request) -> Response:
    console = _console(request)
    try:
        rows = await console.reader.call(lambda s: s.list_schedules())
        error = None
    except ChronosError as exc:
        rows, error = [], str(exc)
    items = []
    for sid, expr, tz, next_us, topic, okey, created in rows:
        upcoming: list[datetime] = [cron.from_us(next_us)]
        problem = None
        try:
            schedule = cron.parse(expr, tz)
            while len(upcoming) < NEXT_OCCURRENCES:
                upcoming.append(schedule.next_after(upcoming[-1]))
        except cron.CronError as exc:
            problem = str(exc)
        items.append({"id": sid, "cron": expr, "timezone": tz, "topic": topic, "ordering_key": okey,
                      "created_at": created, "next": upcoming, "problem": problem})
    return console.page(request, "schedules.html", schedules=items, error=error,
                        now=datetime.now(timezone.utc))


async def login_form(request: Request) -> Response:
    console = _console(request)
    if console.auth.read_only:
        return console.page(request, "error.html", 403, title="Read-only console",
                            message="This console has no token (CHRONOS_CONSOLE_TOKEN), so nobody can act "
                                    "through it.")
    return console.page(request, "login.html", failed=False)


async def login(request: Request) -> Response:
    console = _console(request)
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


async def read_form(request: Request) -> dict[str, str]:
    """An urlencoded form body (the console's forms are small), first value of each field."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise HTTPException(413, "form too large")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        raise HTTPException(400, "the form is not UTF-8") from None
    return {k: v[0] for k, v in fields.items()}


def check_action(request: Request, form: dict[str, str]) -> str | None:
    """Why this action request must be refused, or None when it may go ahead."""
    console = _console(request)
    if console.auth.read_only:
        return "This console is read-only: start it with CHRONOS_CONSOLE_TOKEN set to act through it."
    sid = console.auth.session(request.cookies.get(COOKIE))
    if sid is None:
        return "Sign in with the console token first."
    if not same_origin(request.headers, request.url.scheme, request.headers.get("host", "")):
        return "This request did not come from the console's own page."
    if not console.auth.check_form(sid, form.get("form_token")):
        return "The form is stale or forged: reload the page and try again."
    return None


# -- errors ------------------------------------------------------------------------------------

async def not_found(request: Request, exc: Exception) -> Response:
    console = _console(request)
    status_code = getattr(exc, "status_code", 404)
    detail = getattr(exc, "detail", None)
    if status_code == 404:
        return console.page(request, "error.html", 404, title="Not found",
                            message="There is nothing at this address.")
    return console.page(request, "error.html", status_code, title="Cannot do that",
                        message=str(detail) if detail else "The request was refused.")


async def server_error(request: Request, exc: Exception) -> Response:
    log.error("%s %s failed: %s", request.method, request.url.path, type(exc).__name__, exc_info=exc)
    return _console(request).page(request, "error.html", 500, title="Something went wrong",
                                  message="The console could not answer; its log says why.")


# -- the application ---------------------------------------------------------------------------

def create_app(settings: Settings, store: Any, *, metrics_urls: tuple[str, ...] = ()) -> Starlette:
    """The console for these settings over this store (a `chronos.adapters.postgres.store.Store`)."""
    console = Console(settings, store, metrics_urls=metrics_urls)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(console.sampler.run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await asyncio.to_thread(console.reader.close)

    from chronos.console import messages  # its handlers use this module's helpers

    middleware = [Middleware(SecurityHeaders)]
    if settings.console_host in LOOPBACK:
        # a page on another site cannot read this console through a DNS name it points at loopback
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=list(LOOPBACK)))
    app = Starlette(
        routes=[
            Route("/", overview),
            Route("/api/overview", overview_json),
            Route("/schedules", schedules),
            Route("/messages", messages.search),
            Route("/messages/{message_id:path}", messages.detail),
            Route("/parked", messages.parked),
            Route("/actions/preview", messages.preview, methods=["POST"]),
            Route("/actions/apply", messages.apply, methods=["POST"]),
            Route("/login", login_form, methods=["GET"]),
            Route("/login", login, methods=["POST"]),
            Route("/logout", logout, methods=["POST"]),
            Mount("/static", app=StaticFiles(directory=str(_HERE / "static")), name="static"),
        ],
        middleware=middleware,
        exception_handlers={HTTPException: not_found, 404: not_found, 500: server_error, Exception: server_error},
        lifespan=lifespan,
    )
    app.state.console = console
    return app


def relative(when: datetime, now: datetime) -> str:
    """'in 5.0 s' / '3.2 min ago' for a template."""
    delta = (when - now) / timedelta(seconds=1)
    return f"in {_seconds_text(delta)}" if delta >= 0 else f"{_seconds_text(-delta)} ago"
