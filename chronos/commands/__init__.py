"""The `chronos` sub-commands, one module each.

Each module adds its command to the `chronos` parser with `add_parser(sub)` (its flags, help and
handler, the handler set as the parser's `func`) and holds that handler: `chronos fire-now` is
`chronos.commands.fire_now`. A command that is a family of jobs under one name (`chronos pipeline
schedule|report`, `chronos parked list|show|replay|drop`) is one module too, the one its commands'
parser is built in. A module whose name starts with an underscore holds what several commands share
and adds none.

`chronos.cli` adds them in the order of COMMANDS, the order of `chronos --help` and of the commands
reference page, and runs the handler (tests/unit/test_commands.py checks that every sub-command comes
from its module here). Importing a command module loads no heavy library: a handler imports what it
runs (PySpark, the console's web framework, the Kafka and PostgreSQL clients) when it runs.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from chronos.commands import (cancel, cells, console, consumer, detector, fire_now, firer, health, key_search, list,
                              migrate, parked, pg_cluster, pipeline, reschedule, rewind, schedules, send, show, status, tail,
                              targets, up)

COMMANDS: tuple[ModuleType, ...] = (consumer, firer, detector, migrate, key_search, cells, up, pg_cluster, send, schedules,
                                    tail, pipeline, status, health, targets, rewind, show, list, cancel, fire_now, reschedule,
                                    parked, console)


def add_parsers(sub: Any) -> None:
    """Add every command to `sub`, the `chronos` parser's sub-parsers."""
    for command in COMMANDS:
        command.add_parser(sub)
