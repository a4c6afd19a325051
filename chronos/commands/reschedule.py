"""`chronos reschedule`: give waiting messages or schedules a new deadline, by id or by filter."""

from __future__ import annotations

import argparse
from typing import Any

from chronos.commands import _shared


def add_parser(sub: Any) -> None:
    p = _shared.add_action_parser(sub, "reschedule", "give waiting messages or schedules a new deadline")
    p.add_argument("--at", default=None, metavar="TIME", help="new deadline: ISO-8601 or relative like 2h")
    p.add_argument("--delay", default=None, help="new deadline this far from now: 30s, 10m, 2h, 1d")
    _shared.finish_action_parser(p, run)


def run(args: argparse.Namespace) -> int:
    return _shared.run_action("reschedule", args)
