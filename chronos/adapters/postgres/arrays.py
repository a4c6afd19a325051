"""The array parameters of the store's hot statements (ids, ctids, claim times), written as PostgreSQL array
literals."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from chronos.domain.model import Claimed


def text_array(values: Iterable[str]) -> str:
    """A PostgreSQL array literal of text values, for a `%s::text[]` parameter: on the firer's hot path,
    far cheaper than psycopg's list adapter (docs/benchmarks/history.md, the array literals' row), and
    cheaper still when no value holds a quote or a backslash (the firer's ids and ctids, nearly always):
    joined and checked once, not escaped one by one."""
    values = list(values)
    if not values:
        return "{}"
    together = "".join(values)
    if '"' not in together and "\\" not in together:
        return '{"' + '","'.join(values) + '"}'
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"


def claimed_params(rows: Sequence[Claimed], node: Any) -> dict[str, Any]:
    """(ctid, id, readied_at) triples as array literals, and the node that claimed them. One claim stamps all
    its rows with one readied_at, so each distinct timestamp is formatted once."""
    stamps: dict[Any, str] = {}
    for r in rows:
        if r.readied_at not in stamps:
            stamps[r.readied_at] = r.readied_at.isoformat()
    return {"ctids": text_array(r.ctid for r in rows), "ids": text_array(r.id for r in rows),
            "readied_at": "{" + ",".join(stamps[r.readied_at] for r in rows) + "}", "node": node}
