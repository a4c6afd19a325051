"""The console's web application (Starlette): its routes to the page handlers (`pages`), the security
headers on every response, and the host check that keeps a page on another site from reading it.

The console is in layers: `app` builds it from `pages`, the page handlers, which share `context` (the
console object, form reading, action checks), which stands on `live` (the cached store read, the
processes' metrics), `auth` and `views` (how things show); the import contracts keep it so."""

from __future__ import annotations

import asyncio
import contextlib
from importlib import resources
from typing import Any, AsyncIterator, Mapping

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from chronos.config import Settings
from chronos.console import pages
from chronos.console.context import Console

STATIC = resources.files("chronos.console") / "static"
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")

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


def create_app(settings: Settings, stores: Mapping[str, Any], *, metrics_urls: tuple[str, ...] = ()) -> Starlette:
    """The console for these settings over these stores (a `chronos.adapters.postgres.store.Store` on each cell's
    database by cell name; without cells, one named "")."""
    console = Console(settings, stores, metrics_urls=metrics_urls)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(console.sampler.run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await asyncio.to_thread(console.close)

    middleware = [Middleware(SecurityHeaders)]
    if settings.console_host in LOOPBACK:
        # a page on another site cannot read this console through a DNS name it points at loopback
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=list(LOOPBACK)))
    app = Starlette(
        routes=[
            Route("/", pages.overview),
            Route("/api/overview", pages.overview_json),
            Route("/schedules", pages.schedules),
            Route("/messages", pages.search),
            Route("/messages/{message_id:path}", pages.detail),
            Route("/parked", pages.parked),
            Route("/parked/{number:int}", pages.parked_detail),
            Route("/parked/{cell}/{number:int}", pages.parked_detail),
            Route("/parked/actions/preview", pages.parked_preview, methods=["POST"]),
            Route("/parked/actions/apply", pages.parked_apply, methods=["POST"]),
            Route("/actions/preview", pages.preview, methods=["POST"]),
            Route("/actions/apply", pages.apply, methods=["POST"]),
            Route("/login", pages.login_form, methods=["GET"]),
            Route("/login", pages.login, methods=["POST"]),
            Route("/logout", pages.logout, methods=["POST"]),
            Mount("/static", app=StaticFiles(directory=str(STATIC)), name="static"),
        ],
        middleware=middleware,
        exception_handlers={HTTPException: pages.not_found, 404: pages.not_found, 500: pages.server_error,
                            Exception: pages.server_error},
        lifespan=lifespan,
    )
    app.state.console = console
    return app
