"""What the store holds, at a glance: the status as JSON-ready values and as text, for `chronos status`
(chronos/commands/status.py) and the console's overview alike."""

from __future__ import annotations

import argparse
import os
from datetime import datetime, timezone
from typing import Any, Sequence

from chronos import config
from chronos.domain.cells import CellMap, ranges
from chronos.domain.model import NodeLoad, ServerView
from chronos.adapters.kafka.brokerstats import STATS_ENV, read_stats, rss_bytes
from chronos.ops import servers


def to_dict(view: Any, hold_time_ms: int, throttled: Sequence[Any] = (),
            broker: dict[str, Any] | None = None, postgres: dict[str, Any] | None = None) -> dict[str, Any]:
    """A `store.Overview` (and the `store.Throttled` of each rate-limited topic, the embedded
    broker's stats as `chronos up` wrote them, and the PostgreSQL server as `postgres_dict` shows it)
    as plain JSON-ready values (times in ISO-8601 UTC, durations in seconds)."""
    return {
        "at": _iso(view.at),
        "waiting": view.waiting,
        "waiting_estimated": view.waiting_estimated,
        "due_now": view.due,
        "in_flight": view.in_flight,
        "in_flight_by_node": [{"node": str(n.node), "rows": n.rows, "past_hold_time": n.past_hold_time,
                               "held_for_s": round(n.held_for_s, 3)} for n in view.by_node],
        "oldest_overdue_s": None if view.oldest_overdue_s is None else round(view.oldest_overdue_s, 3),
        "past_hold_time": view.past_hold_time,
        "hold_time_ms": hold_time_ms,
        "recurring_schedules": view.schedules,
        "parked": view.parked,
        "throttled": [{"topic": t.topic, "rate_per_s": t.rate, "rows": t.rows, "lateness_s": round(t.lateness_s, 3)}
                      for t in throttled],
        "next_deadline": _iso(view.next_deadline) if view.next_deadline else None,
        "next_deadline_in_s": round((view.next_deadline - view.at).total_seconds(), 3) if view.next_deadline
        else None,
        "postgres": postgres,
        "embedded_broker": _broker(broker) if broker else None,
    }


def cells_dict(cells: dict[str, dict[str, Any]], cell_map: CellMap, broker: dict[str, Any] | None) -> dict[str, Any]:
    """The status of several cells (each cell's `to_dict`, without the broker's): the totals of what they hold,
    each cell's own with its input partitions, and the embedded broker's stats once."""
    return {
        **cells_totals(cells),
        "cells": [{"cell": cell, "input_partitions": cell_map.partitions_of(cell), **d} for cell, d in cells.items()],
        "embedded_broker": _broker(broker) if broker else None,
    }


def cells_totals(cells: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What several cells hold together (each cell's `to_dict`): the counts added up, the most overdue, the
    soonest deadline, the time of the latest read; the embedded broker's stats as one of them saw them."""
    parts = list(cells.values())

    def total(key: str) -> int | None:
        counts = [d[key] for d in parts if d[key] is not None]
        return sum(counts) if counts else None
    overdue = [d["oldest_overdue_s"] for d in parts if d["oldest_overdue_s"] is not None]
    nexts = [d for d in parts if d["next_deadline"]]
    soonest = min(nexts, key=lambda d: d["next_deadline_in_s"]) if nexts else None
    return {
        "at": max(d["at"] for d in parts),
        **{key: total(key) for key in ("waiting", "due_now", "in_flight", "past_hold_time", "recurring_schedules",
                                        "parked")},
        "waiting_estimated": any(d["waiting_estimated"] for d in parts),
        "oldest_overdue_s": max(overdue) if overdue else None,
        "next_deadline": soonest["next_deadline"] if soonest else None,
        "next_deadline_in_s": soonest["next_deadline_in_s"] if soonest else None,
        "hold_time_ms": parts[0]["hold_time_ms"],
        "embedded_broker": next((d["embedded_broker"] for d in parts if d.get("embedded_broker")), None),
    }


def render_cells(d: dict[str, Any]) -> str:
    """The human-readable status of several cells: the totals, then each cell's status, then the broker's."""
    def row(label: str, value: Any, note: str = "") -> str:
        text = f"{value:,}" if isinstance(value, int) else str(value)
        return f"{label:<22}{text:>12}" + (f"   {note}" if note else "")

    def by_cell(key: str) -> str:
        return ", ".join(f"{c['cell']} {c[key]:,}" for c in d["cells"] if c[key] is not None)
    lines = [f"chronos status at {d['at']}: {len(d['cells'])} cells"]
    lines.append(row("waiting", d["waiting"], by_cell("waiting") + (" (estimate)" if d["waiting_estimated"] else "")))
    lines.append(row("due now", d["due_now"], by_cell("due_now")))
    lines.append(row("held by firers", d["in_flight"], by_cell("in_flight")))
    overdue = d["oldest_overdue_s"]
    lines.append(row("oldest overdue", "-" if overdue is None else _seconds(overdue)))
    lines.append(row("past hold time", d["past_hold_time"], by_cell("past_hold_time")))
    lines.append(row("next deadline", f"in {_seconds(d['next_deadline_in_s'])}" if d["next_deadline"] else "-",
                     d["next_deadline"] or ""))
    for c in d["cells"]:
        lines += ["", f"cell {c['cell']}: input partitions {ranges(c['input_partitions']) if c['input_partitions'] else 'all'}"]
        lines += ["  " + line for line in render(c).splitlines()[1:]]
    b = d.get("embedded_broker")
    if b:
        lines += [""] + render_broker(b, row)
    return "\n".join(lines)


def postgres_dict(server: ServerView, held: Sequence[NodeLoad] = (),
                  asked: Sequence[servers.Asked] | None = None) -> dict[str, Any]:
    """The server a store is connected to (`Store.server_view`) as JSON-ready values: its role and
    standbys, the Chronos processes with sessions on it, the firers that hold rows (`held`, the
    overview's `by_node`) but have none there, and what each process asked (`servers.ask`; None: no
    /metrics URL known) says of its own connections."""
    here = {p.node for p in server.processes if p.role == "firer"}
    d: dict[str, Any] = {
        "server": server.server,
        "address": server.address,
        "role": server.role,
        "version": server.version,
        "standbys": [{"name": s.name, "client": s.client, "state": s.state, "sync_state": s.sync_state}
                     for s in server.standbys],
        "processes": [{"role": p.role, "node": p.node, "sessions": p.sessions, "clients": p.clients,
                       "oldest_backend_start": _iso(p.oldest_start) if p.oldest_start else None,
                       "connected_for_s": round((server.at - p.oldest_start).total_seconds(), 3)
                       if p.oldest_start else None, "visible": p.visible} for p in server.processes],
        "firers_not_connected": [{"node": str(n.node), "rows": n.rows} for n in held if str(n.node) not in here],
    }
    d["reported"] = None if asked is None else reported_dicts(asked, d)
    return d


# Why a process that answered is not where the server status (or the console) reached is: it has no
# connection open, or it names another server, or it names this one and has no session on it (an address
# that moves, such as a virtual IP, led it to another server than this one).
APART = {"no_connection": "no connection open", "other_server": "ANOTHER server than this one",
         "no_session_here": "no session on this server: another one behind the same address"}


def reported_dicts(asked: Sequence[servers.Asked], postgres: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One entry per process asked: the servers it reports connections to, its reconnects, server
    changes and unanswered statements, and, against `postgres` (the server status or the console
    reached, `postgres_dict`; None: not known), its sessions there and why it is apart from it (`APART`,
    None when it is not). A process that did not answer is listed as such (with its role and node when
    known from an earlier answer)."""
    here = postgres["server"] if postgres else None
    sessions = {p["node"]: p["sessions"] for p in postgres["processes"]} if postgres else {}
    out: list[dict[str, Any]] = []
    for a in asked:
        for r in a.reported or (None,):
            entry: dict[str, Any] = {"url": a.url, "answered": a.answered, "role": None, "node": None}
            if r is not None:
                entry.update(role=r.role, node=r.node)
            if a.answered and r is not None:
                here_now = sessions.get(r.node, 0) if postgres else None
                apart = ("no_connection" if not r.servers else None if postgres is None
                         else "other_server" if not r.on(here) else "no_session_here" if not here_now else None)
                entry.update(servers=dict(r.servers), connections=r.connections, reconnects=r.reconnects,
                             server_changes=r.server_changes, unanswered=r.unanswered, read_only=r.read_only,
                             sessions_here=here_now, apart=apart)
            out.append(entry)
    return out


def _broker(stats: dict[str, Any]) -> dict[str, Any]:
    sampled = stats.get("sampled_at")
    return {"pid": stats.get("pid"), "rss_bytes": stats.get("rss_bytes"), "messages": stats.get("messages"),
            "input_unread": stats.get("input_unread"), "exact": stats.get("exact", True),
            "sampled_at": _iso(datetime.fromtimestamp(sampled, timezone.utc)) if sampled else None,
            "memory_warning_bytes": stats.get("warning_bytes"), "restarts": stats.get("restarts", 0),
            "lost_input": stats.get("lost_input", 0)}


def broker_stats(args: argparse.Namespace | None, environ: Any = None) -> dict[str, Any] | None:
    """The embedded broker's stats of the `chronos up` these settings name (its ready file; under
    `chronos up`, the file it names in the environment), with its memory read now when it runs on
    this machine; None without an embedded broker."""
    environ = os.environ if environ is None else environ
    path = environ.get(STATS_ENV)
    if not path:
        ready = config.find_ready_file(args, environ, default=not (getattr(args, "database_url", None)
                                                                    or environ.get("CHRONOS_DATABASE_URL")))
        # the ready file is JSON too, read as leniently: a status without the broker's lines beats none
        path = (read_stats(ready) or {}).get("broker_stats_file") if ready else None
    stats = read_stats(path) if path else None
    if stats is not None and stats.get("pid"):
        stats["rss_bytes"] = rss_bytes(stats["pid"]) or stats.get("rss_bytes")
    return stats


def render(d: dict[str, Any]) -> str:
    """The human-readable status."""
    def row(label: str, value: Any, note: str = "") -> str:
        text = f"{value:,}" if isinstance(value, int) else str(value)
        return f"{label:<22}{text:>12}" + (f"   {note}" if note else "")

    lines = [f"chronos status at {d['at']}"]
    lines.append(row("waiting", d["waiting"], "(estimate)" if d["waiting_estimated"] else ""))
    lines.append(row("due now", d["due_now"], "not claimed yet" if d["due_now"] else ""))
    lines.append(row("held by firers", d["in_flight"], "claimed, not settled yet" if d["in_flight"] else ""))
    for n in d["in_flight_by_node"]:
        note = f"held up to {_seconds(n['held_for_s'])}"
        if n["past_hold_time"]:
            note += f", {n['past_hold_time']:,} past the hold time"
        lines.append(row(f"  firer {n['node'][:8]}", n["rows"], note))
    overdue = d["oldest_overdue_s"]
    lines.append(row("oldest overdue", "-" if overdue is None else _seconds(overdue),
                     "late, not fired yet" if overdue is not None else ""))
    lines.append(row("past hold time", d["past_hold_time"],
                     f"suspected failures (hold time {d['hold_time_ms']:,} ms)" if d["past_hold_time"] else ""))
    schedules = d["recurring_schedules"]
    lines.append(row("recurring schedules", "-" if schedules is None else schedules))
    parked = d["parked"]
    lines.append(row("parked", "-" if parked is None else parked,
                     "kept in chronos_parked: see chronos parked list" if parked else ""))
    for t in d.get("throttled", []):
        limit = f"limit {t['rate_per_s']:g}/s"
        lines.append(row(f"  throttled {t['topic']}", t["rows"],
                         f"due, held back by the {limit}, oldest {_seconds(t['lateness_s'])} late" if t["rows"]
                         else f"{limit}, nothing held back"))
    if d["next_deadline"]:
        lines.append(row("next deadline", f"in {_seconds(d['next_deadline_in_s'])}", d["next_deadline"]))
    else:
        lines.append(row("next deadline", "-"))
    if d.get("postgres"):
        lines += render_postgres(d["postgres"], row)
    b = d.get("embedded_broker")
    if b:
        lines += render_broker(b, row)
    return "\n".join(lines)


def render_postgres(p: dict[str, Any], row: Any) -> list[str]:
    """The PostgreSQL lines of the status: the server and its standbys, the processes' sessions on it,
    and the server each process says it uses."""
    note = f"{p['server'] or '-'}, PostgreSQL {p['version']}"
    if p["address"] and p["address"] != p["server"]:
        note += f" (it says it is {p['address']})"
    lines = [row("postgres", p["role"], note)]
    standbys = p["standbys"]
    if any(s["state"] is None for s in standbys):
        seen = "their state is not visible to this role (pg_read_all_stats shows it)"
    else:
        seen = "; ".join(f"{s['name'] or s['client'] or '?'} {s['state']} {s['sync_state']}" for s in standbys)
    lines.append(row("  standbys", len(standbys), seen))
    processes = p["processes"]
    lines.append(row("  chronos sessions", sum(s["sessions"] for s in processes),
                     f"{len(processes)} process{'es' if len(processes) != 1 else ''} on this server"))
    for s in processes:
        if not s["visible"]:
            about = "another role's: its address and start are not visible to this role"
        else:
            about = f"from {', '.join(s['clients']) or '-'}, connected for {_seconds(s['connected_for_s'])}"
        lines.append(row(f"    {s['role']} {s['node'][:8]}", s["sessions"], about))
    for f in p["firers_not_connected"]:
        lines.append(row(f"    firer {f['node'][:8]}", "-", f"holds {f['rows']:,} row{'s' if f['rows'] != 1 else ''} "
                                                             f"but has no session on this server: connected "
                                                             f"elsewhere, or gone"))
    reported = p["reported"]
    if reported is None:
        lines.append(row("  processes report", "-", "no /metrics URLs known (no process said in PostgreSQL where it "
                                                    "serves them, none in CHRONOS_CONSOLE_METRICS_URLS)"))
        return lines
    answered = sum(1 for r in reported if r["answered"])
    lines.append(row("  processes report", answered, f"of {len(reported)} asked, on their /metrics"))
    for r in reported:
        if not r["answered"]:
            lines.append(row("    no answer", "-", r["url"]))
        elif r["role"] is None:
            lines.append(row("    no postgres metrics", "-", r["url"]))
        else:
            lines.append(row(f"    {r['role']} {r['node'][:8]}", r["connections"], _reported_note(r)))
    return lines


def _reported_note(r: dict[str, Any]) -> str:
    listed = ", ".join(s if len(r["servers"]) == 1 else f"{s} ({n})" for s, n in r["servers"].items())
    where = f"to {listed}" if r["apart"] is None else APART[r["apart"]] + (f": {listed}" if listed else "")
    return (f"{where}; {r['reconnects']:,} reconnects, {r['server_changes']:,} server changes, "
            f"{r['unanswered']:,} unanswered")


def render_broker(b: dict[str, Any], row: Any) -> list[str]:
    """The embedded broker's lines of the status: memory, messages held, restarts."""
    rss, warn = b["rss_bytes"], b["memory_warning_bytes"]
    note = f"pid {b['pid']}, memory only, frees no message"
    if rss is not None and warn and rss >= warn:
        note += f"; ABOVE the warning threshold ({warn / 2 ** 20:,.0f} MB): plan a restart"
    lines = [row("embedded broker", "-" if rss is None else f"{rss / 2 ** 20:,.1f} MB", note)]
    held, unread = b["messages"], b["input_unread"]
    bound = "" if b["exact"] else "at least "
    lines.append(row("  messages held", "-" if held is None else held,
                     "" if held is None or unread is None else f"{bound}all topics; {bound}{unread:,} input not "
                     f"read yet (sampled {b['sampled_at']})"))
    if b["restarts"]:
        lines.append(row("  broker restarts", b["restarts"],
                         f"about {b['lost_input']:,} unread input messages lost with it"))
    return lines


def _iso(when: datetime) -> str:
    return when.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _seconds(value: float) -> str:
    if abs(value) < 60:
        return f"{value:.3f}s"
    if abs(value) < 3600:
        return f"{value / 60:.1f}m"
    if abs(value) < 86400 * 2:
        return f"{value / 3600:.1f}h"
    return f"{value / 86400:.1f}d"
