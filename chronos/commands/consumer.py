"""`chronos consumer`: consume the input topic into the store (one process; supervisord runs as many as asked)."""

from __future__ import annotations

import argparse
from typing import Any

from chronos.commands import _shared


def add_parser(sub: Any) -> None:
    _shared.add_role_parser(sub, "consumer", "consume the input topic into the store", run)


def run(args: argparse.Namespace) -> int:
    return _shared.run_role("consumer", args)
