"""The web console (`chronos console`, the `console` extra): watch the schedule live, find a
message, act on it.

Importing this package loads no web framework: `chronos console` (chronos/commands/console.py) and
`chronos up` ask here whether the extra is installed before anything imports it, and the service
processes never import the console at all. `chronos.console.server` is the part that needs the extra.
"""

from __future__ import annotations

INSTALL_HINT = "pip install 'chronos-scheduler[console]'"


def missing_extra() -> str | None:
    """The name of a package of the console extra that is not installed, or None."""
    import importlib.util
    for name in ("starlette", "uvicorn", "jinja2"):
        if importlib.util.find_spec(name) is None:
            return name
    return None
