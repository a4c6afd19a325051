"""What every page handler of the console shares: the console object (settings, the store reader, the
metrics sampler, auth, templates, the live overview), the form of a request read, and whether a request
may act."""

from __future__ import annotations

import asyncio
import time
from importlib import resources
from typing import Any, Callable, Mapping
from urllib.parse import parse_qs

import orjson
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse

from chronos.config import Settings
from chronos.console.auth import COOKIE, Auth, same_origin
from chronos.console.live import MetricsSampler, StoreReader, histogram_svg, rates_svg
from chronos.console.views import display, postgres_processes, relative, seconds_text
from chronos.domain.cells import ranges
from chronos.errors import ChronosError
from chronos.ops import status
from chronos.telemetry import scrape
from chronos.telemetry.endpoints import ANNOUNCED_WITHIN_MS
from chronos.telemetry.scrape import Scraper

TEMPLATES = resources.files("chronos.console") / "templates"
MAX_FORM_BYTES = 64 * 1024


class Console:
    """Everything a request handler needs: settings, the store readers (one per cell), metrics, auth, templates."""

    def __init__(self, settings: Settings, stores: Mapping[str, Any], *, metrics_urls: tuple[str, ...] = ()):
        """`stores`: a store on each cell's database by cell name, in the cells' order (without cells, one named
        "")."""
        self.settings = settings
        self.readers = {cell: StoreReader(store, settings.hold_time_ms, settings.output_topic)
                        for cell, store in stores.items()}
        self.reader = next(iter(self.readers.values()))
        self.cells = [cell for cell in self.readers if cell]  # the cells' names; none without cells
        self.sampler = MetricsSampler(metrics_urls, scraper=Scraper(scrape.load("CHRONOS_METRICS_SCRAPE_CONFIG_FILE",
                                                                           settings.metrics_scrape_config_file)),
                                      discover=self.announced)
        self.auth = Auth(settings.console_token)
        self.env = Environment(loader=FileSystemLoader(str(TEMPLATES)),
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

    async def announced(self) -> list[str]:
        """The /metrics URLs of the processes that said in PostgreSQL where they serve: every host's, every
        cell's (a cell that does not answer adds none)."""
        urls: list[str] = []
        for reader in self.readers.values():
            try:
                found = await reader.call(lambda store: store.announced(ANNOUNCED_WITHIN_MS))
            except ChronosError:
                if len(self.readers) == 1:
                    raise
                continue
            urls += [a.url for a in found]
        return list(dict.fromkeys(urls))

    async def call_cells(self, fn: Callable[[dict[str, Any]], Any]) -> Any:
        """fn(stores) in a worker thread, `stores` each cell's store by name (one named "" without cells), each
        call of each store holding its reader's lock for that call only (see `StoreReader.call_between`)."""
        return await asyncio.to_thread(fn, {cell: reader.locked() for cell, reader in self.readers.items()})

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()

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
        store, error, cells = await self.overview()
        history = self.sampler.history
        lateness = history.lateness()
        rates = history.rates()
        shown = display(store, rates, lateness)
        stalled, longest = history.stalled()
        publishing_stalled = (f"{stalled} process{'es' if stalled > 1 else ''} published nothing Kafka acknowledged "
                              f"for up to {seconds_text(longest)}: their producers are being replaced; see their logs"
                              if stalled else "")
        postgres = (store or {}).get("postgres")
        reported = status.reported_dicts(history.asked(), postgres) if history.sources else None
        processes, postgres_apart = postgres_processes(postgres, reported)
        shown.update(metrics_answering=str(history.sources_up), store_error=error or "",
                     publishing_stalled=publishing_stalled, postgres_apart=postgres_apart)
        if cells is not None:  # each cell's server is in the table of cells
            shown.update(cells_note=cells_note(cells), postgres_role=f"{len(cells)} cells",
                         postgres_note="each cell's server in the table of cells")
        return {"store": store, "store_error": error, "rates": rates, "publishing_stalled": publishing_stalled,
                "postgres_apart": postgres_apart, "postgres_processes": processes,
                "cells": cells_rows(cells) if cells is not None else None,
                "lateness": None if lateness is None else {k: lateness[k] for k in
                                                          ("count", "window_s", "p50", "p99", "p999")},
                "metrics": {"sources": history.sources, "answering": history.sources_up},
                "display": shown,
                "nodes": [[n["node"] + in_cell(n), f"{n['rows']:,}", seconds_text(n["held_for_s"]),
                           f"{n['past_hold_time']:,}"] for n in (store or {}).get("in_flight_by_node", [])],
                # topics under a fire-rate limit: due rows it holds back, and how late the oldest is
                "throttled": [[t["topic"] + in_cell(t), f"{t['rate_per_s']:g}/s", f"{t['rows']:,}",
                               seconds_text(t["lateness_s"]) if t["rows"] else "-"]
                              for t in (store or {}).get("throttled", [])],
                "charts": {"lateness": histogram_svg(lateness),
                           "rates": rates_svg(history.series(), time.time())}}


    async def overview(self) -> tuple[dict[str, Any] | None, str | None, dict[str, Any] | None]:
        """(what the store holds, as `chronos status --json` prints it, or None; the error, or None; with cells
        each cell's part, or None without cells). With cells, the totals of the cells that answer, each
        cell's own figures, and what keeps a cell from answering."""
        if not self.cells:
            store, error = await self.reader.overview()
            return store, error, None
        read = await asyncio.gather(*(reader.overview() for reader in self.readers.values()))
        lists = await asyncio.gather(*(reader.partitions() for reader in self.readers.values()))
        parts: dict[str, dict[str, Any]] = {cell: {"store": store, "error": error, "input_partitions": listed}
                                            for cell, (store, error), listed in zip(self.readers, read, lists)}
        answered = {cell: part["store"] for cell, part in parts.items() if part["store"] is not None}
        down = [f"cell {cell}: {part['error']}" for cell, part in parts.items() if part["error"]]
        if not answered:
            return None, "; ".join(down), parts
        totals = status.cells_totals(answered)
        for key in ("in_flight_by_node", "throttled"):
            totals[key] = [{**row, "cell": cell} for cell, d in answered.items() for row in d.get(key, [])]
        totals["waiting_age_s"] = max(d.get("waiting_age_s") or 0.0 for d in answered.values())
        return totals, "; ".join(down) or None, parts


def in_cell(row: Mapping[str, Any]) -> str:
    """` (cell NAME)` after what a row of the overview names, with cells."""
    return f" (cell {row['cell']})" if row.get("cell") else ""


def cells_rows(cells: Mapping[str, Any]) -> list[list[str]]:
    """The overview's table of cells: each cell's input partitions, what it holds, and its server or error."""
    rows = []
    for cell, part in cells.items():
        d, listed = part["store"], part["input_partitions"]
        owned = "-" if listed is None else ranges(listed) if listed else "all"
        if d is None:
            rows.append([cell, owned, "-", "-", "-", "-", "-", part["error"] or "-"])
            continue
        postgres = d.get("postgres") or {}
        rows.append([cell, owned, f"{d['waiting']:,}", f"{d['due_now']:,}", f"{d['in_flight']:,}",
                     seconds_text(d["oldest_overdue_s"]), "-" if d.get("parked") is None else f"{d['parked']:,}",
                     f"{postgres.get('role', '-')} {postgres.get('server') or ''}".strip()])
    return rows


def cells_note(cells: Mapping[str, Any]) -> str:
    """How many cells answer, for the overview's heading."""
    answering = sum(1 for part in cells.values() if part["store"] is not None)
    return f"{len(cells)} cells" + ("" if answering == len(cells) else f", {len(cells) - answering} not answering")


def console_of(request: Request) -> Console:
    """The console a request is served by."""
    return request.app.state.console


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
    console = console_of(request)
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
