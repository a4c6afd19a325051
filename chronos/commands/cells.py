"""`chronos cells move|add`: move an input partition to another cell, or add a cell and move it its share of the
partitions, under load; run again after it stopped half way, each finishes the job (chronos/ops/moves.py does
the work). Run as the cells' databases' owner, like `chronos migrate`: a move makes triggers on the table."""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from typing import Any

from chronos import config

#: How much lower the command's own priority is than the processes it shares a host with: its work (rows read,
#: decoded and written again) waits for theirs where the cores are busy.
NICE = 10

SETTINGS = ("cells", "database_url", "database_pool_mode", "hold_time_ms", "failure_detection_interval_ms",
            "move_rate", "lookahead_ms", "log_level", "log_format")
MORE = ("Every cell is asked (CHRONOS_CELLS): the move is recorded in the database of the cell the partition "
        "leaves, so that the command run again after it stopped half way finishes it (it waits for the lease of "
        "one that died to expire). The partition's rows due after the next few seconds are copied ahead while it "
        "takes its messages as before; then, at the cut-over, its consumers' writes pause (its own partition "
        "only), the rows the old cell's firers hold are settled there, the rest handed over, and the new cell "
        "opens it. Refused (exit 2) while the new cell has no live firer or a running consumer does not write to it.")


def add_parser(sub: Any) -> None:
    """The `cells` command and its two: move, add."""
    parser = sub.add_parser("cells", help="move an input partition to another cell, or add a cell, under load",
                            description="Cells divide the input partitions among PostgreSQL databases. Move a "
                                        "partition from its cell to another, or add a cell and move it its even "
                                        "share, while Chronos runs.")
    sub = parser.add_subparsers(dest="cells_command", required=True, metavar="COMMAND")

    p = sub.add_parser("move", help="move an input partition to another cell",
                       description=f"Move the input partition's messages to another cell. {MORE}")
    config.add_arguments(p, only=SETTINGS)
    p.add_argument("--partition", required=True, type=_partition, help="the input partition to move")
    p.add_argument("--to", required=True, metavar="CELL", help="the cell it goes to, by its name in CHRONOS_CELLS")
    p.set_defaults(func=run_move)

    p = sub.add_parser("add", help="add a cell and move it its share of the input partitions",
                       description="Migrate a new cell's database, then move it its even share of the input "
                                   "partitions, one at a time, from the cells that own the most; moves under way "
                                   f"are finished first. {MORE}")
    config.add_arguments(p, only=SETTINGS + ("input_topic", "kafka_bootstrap_servers", "kafka_properties",
                                             "kafka_properties_file"))
    p.add_argument("cell", metavar="NAME[=URL]", help="the new cell: its name in CHRONOS_CELLS, or its name and "
                                                      "database URL")
    p.set_defaults(func=run_add)


def _partition(raw: str) -> int:
    if not raw.isdigit():
        raise argparse.ArgumentTypeError(f"a partition is a whole number, got {raw!r}")
    return int(raw)


def _mover(settings: config.Settings, urls: dict[str, str]):
    from chronos import logs
    from chronos.adapters.postgres.store import Store
    from chronos.ops.moves import MoveSettings, Mover, first_wait_ms
    node = uuid.uuid4()
    logs.setup("operator", str(node), settings.log_level, settings.log_format, settings.secrets())
    os.nice(NICE)
    stores = {cell: Store(url, pool_mode=settings.database_pool_mode) for cell, url in urls.items()}

    def say(line: str) -> None:
        print(line, flush=True)
    moves = MoveSettings(hold_ms=settings.hold_time_ms, detection_ms=settings.failure_detection_interval_ms,
                         rate=settings.move_rate, queue_first_ms=first_wait_ms(settings.lookahead_ms))
    return Mover(stores, moves, say=say, node=node)


def _close(mover) -> None:
    for store in mover.stores.values():
        store.close()


def run_move(args: argparse.Namespace) -> int:
    """Move one partition, or finish its move."""
    settings = config.load(args)
    if not settings.cells:
        raise config.ConfigError("chronos cells move needs the cells: CHRONOS_CELLS (or --cells), NAME=URL pairs")
    mover = _mover(settings, settings.databases())
    try:
        moved = mover.move(args.partition, args.to)
    finally:
        _close(mover)
    if not moved.already:
        print(f"partition {moved.partition} is in cell {moved.target}" +
              (f" at epoch {moved.epoch} (its cut-over took {moved.cut_over_s:.2f}s)" if moved.epoch else ""))
    return 0


def run_add(args: argparse.Namespace) -> int:
    """Migrate a new cell, then move it its share of the partitions."""
    from chronos.adapters.postgres import migrations
    settings = config.load(args)
    cells = settings.databases() if settings.cells else {}
    name, url = _new_cell(args.cell, cells)
    if not cells:
        raise config.ConfigError("chronos cells add needs the cells there are: CHRONOS_CELLS (or --cells), NAME=URL "
                                 "pairs (a deployment of one database is one cell: name it)")
    applied = migrations.migrate(url)
    print(f"cell {name}: " + (f"applied migrations {', '.join(map(str, applied))}; " if applied else "")
          + f"schema at version {migrations.LATEST_VERSION}", flush=True)
    mover = _mover(settings, {**cells, name: url})
    try:
        partitions = None
        if not any(store.cell_partitions() for store in mover.stores.values()):
            partitions = _topic_partitions(settings)
        moved = mover.add(name, partitions)
    finally:
        _close(mover)
    done = [m for m in moved if not m.already]
    print(f"cell {name} owns its share: {len(done)} partition(s) moved to it" if done else
          f"cell {name} owns its share already")
    return 0


def _new_cell(raw: str, cells: dict[str, str]) -> tuple[str, str]:
    """The new cell's name and URL, from NAME=URL or a NAME of CHRONOS_CELLS."""
    if "=" not in raw:
        if raw not in cells:
            raise config.ConfigError(f"cell {raw!r} is not in CHRONOS_CELLS: give it as NAME=URL")
        return raw, cells[raw]
    ((name, url),) = config.parse_cells("the new cell", raw)
    if name in cells and cells[name] != url:
        raise config.ConfigError(f"cell {name!r} is in CHRONOS_CELLS with another URL")
    return name, url


def _topic_partitions(settings: config.Settings) -> int:
    """The input topic's partition count, for a map that lists nothing yet."""
    from chronos.adapters.kafka.admin import partition_count
    if not settings.kafka_bootstrap_servers:
        raise config.ConfigError("no cell lists the input partitions yet: Chronos needs Kafka "
                                 "(CHRONOS_KAFKA_BOOTSTRAP_SERVERS) to count the input topic's")
    count = partition_count(settings.kafka_bootstrap_servers, settings.input_topic, settings.kafka_config)
    if count == 0:
        raise config.ConfigError(f"the input topic {settings.input_topic} does not exist")
    print(f"the input topic {settings.input_topic} has {count} partitions", file=sys.stderr)
    return count
