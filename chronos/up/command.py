"""The `chronos up` command: its run from the first line to the exit code (its flags are
`chronos.commands.up`'s)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from chronos import config
from chronos.console.launch import ConsoleProcess
from chronos.errors import ChronosError
from chronos.up import ROLES
from chronos.up.stack import Options, Stack

MAX_CELLS = 16  # embedded PostgreSQL servers on one machine


def options(args: argparse.Namespace) -> Options:
    """What the command line and the environment ask for; a config.ConfigError when it makes no sense."""
    if args.kafka_bootstrap_servers_alias and not args.kafka_bootstrap_servers:
        args.kafka_bootstrap_servers = args.kafka_bootstrap_servers_alias
    data_dir = Path(args.data_dir).resolve()
    ready_file = Path(args.ready_file).resolve() if args.ready_file else data_dir / "ready.json"
    args.ready_file = None  # `up` writes the ready file; it does not read one
    n_cells = 1
    if args.n_cells is not None and args.n_cells.strip().isdigit():
        n_cells = int(args.n_cells)
    elif args.n_cells is not None:
        args.cells = args.n_cells  # the cells of databases of the user's own, as CHRONOS_CELLS names them
    settings = config.load(args, default_ready_file=False)
    counts = {role: getattr(args, f"n_{role}") for role in ROLES}
    for role, n in counts.items():
        if n < 0 or n > 64:
            raise config.ConfigError(f"--{role}s must be between 0 and 64, got {n}")
    if args.partitions is not None and args.partitions < 1:
        raise config.ConfigError(f"--partitions must be at least 1, got {args.partitions}")
    if not 1 <= n_cells <= MAX_CELLS:
        raise config.ConfigError(f"--cells must be between 1 and {MAX_CELLS}, got {n_cells}")
    if n_cells > 1 and settings.cells:
        raise config.ConfigError(f"--cells {n_cells} runs embedded cells, and CHRONOS_CELLS names cells of your own: "
                                 "give one or the other")
    if settings.cells and settings.database_url:
        raise config.ConfigError("CHRONOS_CELLS names the cells' databases, and --database-url (CHRONOS_DATABASE_URL) "
                                 "one database: give one or the other")
    count = max(n_cells, len(settings.cells))
    if count > 1 and args.partitions is not None and args.partitions < count:
        raise config.ConfigError(f"{count} cells need at least {count} partitions (one per cell), "
                                 f"got --partitions {args.partitions}")
    warning_mb = positive_mb(args.broker_memory_warning_mb)
    return Options(settings, data_dir, counts, partitions=args.partitions, pg_port=args.pg_port,
                   kafka_port=args.kafka_port, ready_file=ready_file,
                   kafka_properties_file=str(Path(args.kafka_properties_file).resolve())
                   if args.kafka_properties_file else None,
                   broker_warning_bytes=None if warning_mb is None else warning_mb * 2 ** 20, cells=n_cells)


def positive_mb(value: str | None) -> int | None:
    """--broker-memory-warning-mb (or its variable, a string): a positive whole number of MB, or None."""
    if value is None or value == "":
        return None
    try:
        mb = int(value)
    except ValueError:
        mb = 0
    if mb < 1:
        raise config.ConfigError(f"--broker-memory-warning-mb (CHRONOS_BROKER_MEMORY_WARNING_MB) must be a "
                                 f"positive whole number of MB, got {value!r}")
    return mb


def console(args: argparse.Namespace, opts: Options, log_dir: Path) -> ConsoleProcess | None:
    """The web console to start, unless --no-console or its extra is missing (which is said)."""
    if args.no_console:
        return None
    why_not = ConsoleProcess.available()
    if why_not:
        print(f"console not started: {why_not}", flush=True)
        return None
    return ConsoleProcess(opts.settings, log_dir, port_chosen=args.console_port is not None
                          or "CHRONOS_CONSOLE_PORT" in os.environ)


def run(args: argparse.Namespace) -> int:
    """Start the stack, say it is ready, keep it until SIGTERM or SIGINT, stop it: the exit code."""
    opts = options(args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    stack = Stack(opts)
    stack.console = console(args, opts, stack.data.logs)
    stopping = threading.Event()

    def on_signal(signum, _frame):
        print(f"received {signal.Signals(signum).name}: stopping", flush=True)
        stopping.set()

    def life_check():
        if stopping.is_set():
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    code = 0
    try:
        stack.start(life_check)
        stack.announce()
        stack.watch(stopping)
    except KeyboardInterrupt:
        pass
    except ChronosError as exc:
        print(f"chronos up: {exc}", file=sys.stderr, flush=True)
        code = exc.exit_code
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stack.stop()
    if code == 0:
        print("stopped", flush=True)
    return code
