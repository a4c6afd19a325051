"""How the console shows things: what a message holds, how a message id travels in a URL, and the
overview's figures as the page's text.

Keys, values and header values are bytes: shown as text when they are printable UTF-8, else
as hex, always through the templates' escaping. Pure functions, tested without a server.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote, unquote_to_bytes

PREVIEW_BYTES = 4096
MAX_ID_CHARS = 128  # as the consumer enforces for chronosMessageId


@dataclass(frozen=True)
class Shown:
    """Bytes as the page shows them."""

    kind: str        # "null", "text" or "hex"
    text: str
    size: int
    truncated: bool = False


def _printable(text: str) -> bool:
    """No control or unassigned characters, but line breaks and tabs (values are often text)."""
    return all(ch in "\n\r\t" or unicodedata.category(ch)[0] != "C" for ch in text)


def _decode(part: bytes, truncated: bool) -> str | None:
    # a multi-byte character cut by the preview limit is no reason to fall back to hex
    for cut in range(4 if truncated else 1):
        try:
            return part[:len(part) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


def show_bytes(data: bytes | None, limit: int = PREVIEW_BYTES, *, size: int | None = None) -> Shown:
    """Text when `data` is printable UTF-8, else hex (`00 ff ...`); at most `limit` bytes of it.
    `size` is the whole length when `data` is already a preview of something longer."""
    if data is None:
        return Shown("null", "(null)", 0)
    size = len(data) if size is None else size
    part = data[:limit]
    truncated = size > len(part)
    text = _decode(part, truncated)
    if text is not None and _printable(text):
        return Shown("text", text, size, truncated)
    return Shown("hex", part.hex(" "), size, truncated)


def message_url(message_id: str) -> str:
    """The stable address of a message's page: every character but unreserved ones escaped."""
    return "/messages/" + quote(message_id, safe="")


def id_from_path(raw_path: bytes, prefix: bytes = b"/messages/") -> str | None:
    """The message id of a `/messages/<url-encoded id>` request path, or None when the path
    cannot hold an id the consumer accepts (bad UTF-8, NUL, empty or too long)."""
    if not raw_path.startswith(prefix):
        return None
    try:
        message_id = unquote_to_bytes(raw_path[len(prefix):]).decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not message_id or len(message_id) > MAX_ID_CHARS or "\x00" in message_id:
        return None
    return message_id


# -- the overview's figures ------------------------------------------------------------------

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
                   oldest_overdue=seconds_text(store["oldest_overdue_s"]),
                   past_hold_time=f"{store['past_hold_time']:,}",
                   parked="-" if store.get("parked") is None else f"{store['parked']:,}",
                   recurring_schedules="-" if store["recurring_schedules"] is None
                   else f"{store['recurring_schedules']:,}",
                   next_deadline="-" if store["next_deadline_in_s"] is None
                   else f"in {seconds_text(store['next_deadline_in_s'])}",
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
        out[key] = "-" if value is None else seconds_text(value)
    out["lateness_count"] = "-" if lateness is None else f"{lateness['count']:,}"
    out["lateness_window"] = "-" if lateness is None else seconds_text(lateness["window_s"])
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


def seconds_text(value: float | None) -> str:
    """A duration for a page: ms, s, min, h or d, whichever reads best."""
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


def relative(when: datetime, now: datetime) -> str:
    """'in 5.0 s' / '3.2 min ago' for a template."""
    delta = (when - now) / timedelta(seconds=1)
    return f"in {seconds_text(delta)}" if delta >= 0 else f"{seconds_text(-delta)} ago"
