"""`chronos fire-now`: make waiting messages due now, by id or by filter."""

from __future__ import annotations

import argparse
from typing import Any

from chronos.commands import _shared


def add_parser(sub: Any) -> None:
    p = _shared.add_action_parser(sub, "fire-now", "make waiting messages due now (a schedule: one occurrence now)")
    _shared.finish_action_parser(p, run)


def run(args: argparse.Namespace) -> int:
    return _shared.run_action("fire-now", args)
