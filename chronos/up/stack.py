"""The stack of one `chronos up`: what it was asked for (`Options`), and the services it starts in order,
watches while it runs, and stops (`Stack`).

The start order: the data directory, PostgreSQL (given, or embedded), the broker (given, or embedded),
the topics, the broker's watch (embedded only), the migrations, supervisord with the programs, the
console; then the ready line and the ready file. While it runs, once a second: supervisord and the
console still there, a dead embedded service started again (chronos.up.recovery), the programs'
states (chronos.up.programs), the broker sampled. Stopping goes in the reverse order.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import orjson

from chronos import config
from chronos.adapters.kafka.admin import check_reachable, create_topics, partition_count
from chronos.adapters.kafka.clients import EMBEDDED_PROFILE
from chronos.adapters.kafka.offset_process import OffsetReaderProcess
from chronos.adapters.postgres import connection, migrations, pooling
from chronos.config import Settings, redact_url
from chronos.domain.cells import CellMap
from chronos.console.launch import ConsoleProcess
from chronos.embedded.broker import KNOWN_CLIENTS, EmbeddedBroker
from chronos.embedded.postgres import EmbeddedPostgres
from chronos.adapters.kafka.brokerstats import STATS_ENV
from chronos.embedded.watch import BrokerWatch, default_warning_bytes, machine_memory_bytes
from chronos.errors import ConfigError, StackError
from chronos.telemetry.endpoints import metrics_urls, pick_metrics_base
from chronos.runtime import orphans
from chronos.up import EMBEDDED_PARTITIONS, EXTERNAL_PARTITIONS, PARTITIONS_PER_CELL, cells, recovery
from chronos.up.datadir import DataDir
from chronos.up.programs import Programs, live_counts
from chronos.up.supervisor import Supervisor, SupervisorError, spawn_supervisord

log = logging.getLogger("chronos.up")

# What each child gets when `chronos up` dies: PostgreSQL a fast shutdown, the broker (memory
# only, nothing to save) its immediate exit, supervisord a graceful stop of the programs.
PARENT_DEATH_SIGNAL = {"postgres": signal.SIGINT, "broker": signal.SIGINT, "supervisord": signal.SIGTERM}

def broker_offset_reader(bootstrap: str, s: Settings) -> OffsetReaderProcess:
    """What the broker watch reads offsets with: a reader in a process of its own, since librdkafka can
    crash on the embedded broker's answers when a topic is deleted (chronos.adapters.kafka.offset_process)."""
    return OffsetReaderProcess(bootstrap, s.consumer_group, s.input_topic, s.kafka_config, secrets=s.secrets())


@dataclass(frozen=True)
class Options:
    """What `chronos up` was asked for: its settings, data directory and processes per role, and the
    choices of its own command line."""

    settings: Settings
    data_dir: Path
    counts: dict[str, int]
    partitions: int | None = None  # None: EMBEDDED_PARTITIONS or EXTERNAL_PARTITIONS, by the broker
    pg_port: int | None = None
    kafka_port: int | None = None
    ready_file: Path | None = None
    kafka_properties_file: str | None = None
    broker_warning_bytes: int | None = None  # None: default_warning_bytes of this machine
    cells: int = 1  # embedded PostgreSQL servers, each a cell; 1: the stack's one database, no cells


class Stack:
    """The services of one `chronos up`, started by `start`, kept by `watch`, stopped by `stop`. `settings`
    become the programs' own as the services start (the embedded ones' addresses, the pool mode, the
    metrics port). The web console, when one is to run, is set in `console` before `start`."""

    def __init__(self, options: Options):
        self.options = options
        self.settings = options.settings
        # with cells, each runs its firers and detectors, which serve the cells in turn by process number
        cells = max(options.cells, len(options.settings.cells))
        self.counts = {role: n * (cells if role != "consumer" else 1) for role, n in options.counts.items()}
        self.data = DataDir(options.data_dir)
        self.console: ConsoleProcess | None = None
        self.partitions = options.partitions
        self.input_partitions = options.partitions
        self.postgres: EmbeddedPostgres | None = None  # the one embedded PostgreSQL, the first cell's with cells
        self.cell_servers: dict[str, EmbeddedPostgres] = {}  # with cells: each cell's embedded PostgreSQL
        self.cell_map: CellMap | None = None  # with cells, once assigned
        self.broker: EmbeddedBroker | None = None
        self.broker_watch: BrokerWatch | None = None
        self.supervisord: subprocess.Popen | None = None
        self.programs: Programs | None = None  # with supervisord

    # -- start -----------------------------------------------------------------------------

    def start(self, life_check: Callable[[], None]) -> None:
        """Start everything in order; `life_check` between the steps raises to give up."""
        self.data.claim(self.options.ready_file)
        if self.console is not None:
            self.console.reserve()  # after the leftovers stopped: one of them may be an old console
        s = self.settings
        if s.cells:
            s = self.use_cells(s)
        elif self.options.cells > 1:
            if s.database_url:
                raise ConfigError("--cells runs an embedded PostgreSQL per cell: not with --database-url")
            self.cell_servers = cells.start_servers(self.data.path, self.data.logs, self.options.cells,
                                                    self.options.pg_port, PARENT_DEATH_SIGNAL["postgres"])
            self.postgres = next(iter(self.cell_servers.values()))
            s = config.replace(s, cells=tuple((cell, pg.url) for cell, pg in self.cell_servers.items()),
                               database_pool_mode=(pooling.SESSION if s.database_pool_mode == pooling.AUTO
                                                   else s.database_pool_mode))
        elif s.database_url:
            print(f"using PostgreSQL at {redact_url(s.database_url)}", flush=True)
            connection.wait_for_database(s.database_url, timeout=10)
            # settled here, once, for the programs; session refused if the probe finds a pooler in transaction mode
            mode = pooling.resolve_pool_mode(s.database_url, s.database_pool_mode, check=True)
            if mode == pooling.TRANSACTION:
                print("PostgreSQL is reached through a pooler in transaction mode: the programs prepare no "
                      "statement and make their settings in each transaction", flush=True)
            s = config.replace(s, database_pool_mode=mode)
        else:
            cells.check_data(self.data.path, 1)
            self.postgres = EmbeddedPostgres(self.data.path / "pgdata", port=self.options.pg_port,
                                             log_path=self.data.logs / "postgres.log",
                                             die_with_parent=PARENT_DEATH_SIGNAL["postgres"])
            self.postgres.start()
            s = config.replace(s, database_url=self.postgres.url, database_pool_mode=(
                pooling.SESSION if s.database_pool_mode == pooling.AUTO else s.database_pool_mode))  # no pooler
            print(f"started embedded PostgreSQL on port {self.postgres.port} (data in {self.data.path / 'pgdata'})",
                  flush=True)
        life_check()
        kafka_extra = dict(s.kafka_properties)
        if s.kafka_bootstrap_servers:
            check_reachable(s.kafka_bootstrap_servers, s.kafka_config, secrets=s.secrets())
        else:
            self.broker = EmbeddedBroker(port=self.options.kafka_port, log_path=self.data.logs / "broker.log",
                                         die_with_parent=PARENT_DEATH_SIGNAL["broker"])
            self.broker.start()
            kafka_extra = {**EMBEDDED_PROFILE, **kafka_extra}
            s = config.replace(s, kafka_bootstrap_servers=self.broker.bootstrap_servers)
            print(f"started embedded Kafka-compatible broker on {self.broker.bootstrap_servers} "
                  f"(memory only; {KNOWN_CLIENTS})", flush=True)
        s = config.replace(s, kafka_properties=kafka_extra)
        self.settings = s
        # both were given or the embedded services were started above
        assert s.kafka_bootstrap_servers is not None and (s.database_url is not None or s.cells)
        life_check()
        if self.partitions is None:
            self.partitions = EXTERNAL_PARTITIONS if self.broker is None else EMBEDDED_PARTITIONS
        if self.input_partitions is None:
            self.input_partitions = PARTITIONS_PER_CELL * len(s.cells) if s.cells else self.partitions
        for cell, url in s.databases().items():
            applied = migrations.migrate(url)
            print(("" if not cell else f"cell {cell}: ") + f"schema at version {migrations.LATEST_VERSION}"
                  + (f" (applied {', '.join(map(str, applied))})" if applied else ""), flush=True)
        if s.cells:
            self.cell_map = cells.assign(s.cells, s.database_pool_mode, s.input_topic, self.input_partitions,
                                         asked=self.options.partitions is not None)
            self.input_partitions = self.cell_map.partitions  # the map's, as the first start assigned it
        self.create_topics()
        if self.broker is not None:
            self.watch_broker()
        life_check()
        if self.console is not None and not s.metrics_port:
            # the console's rates and lateness come from the programs' /metrics
            self.settings = s = config.replace(s, metrics_port=pick_metrics_base(live_counts(self.counts)))
        programs = self.start_supervisord()

        def still_starting() -> None:
            life_check()
            if self.supervisord is not None and self.supervisord.poll() is not None:
                err = (self.data.logs / "supervisord.err").read_text(errors="replace").strip().splitlines()[-3:]
                raise StackError(f"supervisord exited with code {self.supervisord.returncode}: {' '.join(err)}")
        programs.wait_started(still_starting)
        if self.console is not None:
            self.console.settings = config.replace(s, console_metrics_urls=metrics_urls(s.metrics_port,
                                                                                        live_counts(self.counts)))
            print(f"console on {self.console.start(self.environ())} ("
                  + ("read-only: no CHRONOS_CONSOLE_TOKEN" if s.console_token is None else "actions need the token")
                  + ")", flush=True)

    def use_cells(self, s: Settings) -> Settings:
        """The settings on the cells CHRONOS_CELLS names (PostgreSQL servers of the user's own), each waited for
        and its pool mode settled, once, for the programs: one mode for every cell."""
        modes = {}
        for cell, url in s.cells:
            print(f"cell {cell}: using PostgreSQL at {redact_url(url)}", flush=True)
            connection.wait_for_database(url, timeout=10)
            modes[cell] = pooling.resolve_pool_mode(url, s.database_pool_mode, check=True)
        if len(set(modes.values())) > 1:
            raise ConfigError("the cells are reached in different pool modes (" + ", ".join(
                f"{cell} {mode}" for cell, mode in modes.items()) + "): set CHRONOS_DATABASE_POOL_MODE for all")
        mode = next(iter(modes.values()))
        if mode == pooling.TRANSACTION:
            print("PostgreSQL is reached through a pooler in transaction mode: the programs prepare no "
                  "statement and make their settings in each transaction", flush=True)
        return config.replace(s, database_pool_mode=mode)

    def create_topics(self) -> None:
        s = self.settings
        assert s.kafka_bootstrap_servers is not None  # given, or the embedded broker's
        assert self.partitions is not None and self.input_partitions is not None  # chosen by start()
        create_topics(s.kafka_bootstrap_servers, {s.input_topic: self.input_partitions,
                                                  **{t: self.partitions for t in (s.output_topic, s.dlq_topic)}},
                      client_config=s.kafka_config)
        if s.cells:
            self.check_input_topic()

    def check_input_topic(self) -> None:
        """With cells, the input topic must have the map's partitions: a given Kafka's existing topic may not."""
        s = self.settings
        assert s.kafka_bootstrap_servers is not None and self.cell_map is not None  # assigned by start()
        self.cell_map.check_topic(s.input_topic, partition_count(s.kafka_bootstrap_servers, s.input_topic,
                                                                 s.kafka_config))

    def watch_broker(self) -> None:
        """Sample the embedded broker from now on (its memory, what it holds, what a restart would lose)."""
        assert self.broker is not None
        s = self.settings
        bootstrap = self.broker.bootstrap_servers
        warning = self.options.broker_warning_bytes or default_warning_bytes(machine_memory_bytes())
        self.broker_watch = BrokerWatch(
            self.data.run / "broker-stats.json", s.input_topic, say=self.say, warning_bytes=warning,
            reader=lambda: broker_offset_reader(bootstrap, s))
        self.broker_watch.started(self.broker.pid, self.broker.port)

    def say(self, line: str) -> None:
        """Tell the operator about the embedded broker: printed, and noted in the broker's log."""
        print(line, flush=True)
        if self.broker is not None:
            self.broker.note(line)

    def environ(self) -> dict[str, str]:
        """The programs' and the console's environment: the settings, where to run and log, how many of each."""
        env = dict(os.environ)
        env.update(config.to_environ(self.settings))
        env.update({
            "CHRONOS_BIN": f"{sys.executable} -m chronos",
            "CHRONOS_RUN_DIR": str(self.data.supervisor_dir),
            "CHRONOS_LOG_DIR": str(self.data.logs),
            "CHRONOS_CONSUMERS": str(max(1, self.counts["consumer"])),
            "CHRONOS_FIRERS": str(max(1, self.counts["firer"])),
            "CHRONOS_DETECTORS": str(max(1, self.counts["detector"])),
            "CHRONOS_CONSOLES": "0",  # its console is started beside supervisord (self.console), not by it
        })
        if self.settings.cells:
            env.pop("CHRONOS_CELL", None)  # each firer and detector serves the cells in turn by process number
        if self.broker_watch is not None:
            env[STATS_ENV] = str(self.broker_watch.path)  # the detector exports it, the console shows it
        if self.options.kafka_properties_file:
            # the programs read the file themselves, so its secrets stay out of their environment
            env["CHRONOS_KAFKA_PROPERTIES_FILE"] = self.options.kafka_properties_file
        env.pop("CHRONOS_READY_FILE", None)
        env.pop("CHRONOS_CONSOLE_TOKEN", None)  # only the console needs it
        return env

    def start_supervisord(self) -> Programs:
        """supervisord with the programs: what follows them."""
        self.supervisord = spawn_supervisord(self.data.supervisor_dir, self.data.logs, self.environ(),
                                             PARENT_DEATH_SIGNAL["supervisord"])
        self.programs = Programs(Supervisor(self.data.socket), self.counts, self.data.logs)
        return self.programs

    # -- ready -----------------------------------------------------------------------------

    def ready_info(self) -> dict:
        """What the ready file says: where everything is, and the pids of what `chronos up` started."""
        s = self.settings
        info = {"bootstrap_servers": s.kafka_bootstrap_servers, "database_url": s.database_url,
                "cells": dict(s.cells) or None,
                "cell_postgres_pids": {cell: pg.pid for cell, pg in self.cell_servers.items()} or None,
                "input_topic": s.input_topic, "output_topic": s.output_topic, "dlq_topic": s.dlq_topic,
                "data_dir": str(self.data.path), "log_dir": str(self.data.logs),
                "supervisor_socket": str(self.data.socket),
                "supervisord_pid": self.supervisord.pid if self.supervisord else None,
                "postgres_pid": self.postgres.pid if self.postgres else None,
                "broker_pid": self.broker.pid if self.broker else None,
                "broker_stats_file": str(self.broker_watch.path) if self.broker_watch else None,
                "kafka_properties": s.kafka_properties, "pid": os.getpid(),
                "console_url": self.console.url if self.console else None,
                "console_pid": self.console.proc.pid if self.console and self.console.proc else None,
                "metrics_urls": list(metrics_urls(s.metrics_port, live_counts(self.counts))) if s.metrics_port else []}
        return info

    def announce(self) -> None:
        """The ready line, and the ready file."""
        info = self.ready_info()
        databases = f"database_url={redact_url(info['database_url'])}" if not info["cells"] else \
            "cells=" + ",".join(f"{cell}={redact_url(url)}" for cell, url in info["cells"].items())
        print(f"ready bootstrap_servers={info['bootstrap_servers']} {databases} input_topic={info['input_topic']} "
              f"output_topic={info['output_topic']} dlq_topic={info['dlq_topic']}", flush=True)
        self.write_ready_file(info)

    def write_ready_file(self, info: dict) -> None:
        """`info` into the ready file (if one was asked for), readable by its owner only, replaced at once."""
        ready_file = self.options.ready_file
        if ready_file is not None:
            ready_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = ready_file.with_suffix(ready_file.suffix + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(orjson.dumps(info, option=orjson.OPT_INDENT_2))
            os.replace(tmp, ready_file)

    # -- run and stop ----------------------------------------------------------------------

    def postgres_servers(self) -> dict[str, EmbeddedPostgres]:
        """The embedded PostgreSQL servers it started, by cell (the one without cells under "")."""
        return self.cell_servers or ({"": self.postgres} if self.postgres is not None else {})

    def watch(self, stopping: threading.Event) -> None:
        """Until asked to stop: restart a dead embedded PostgreSQL or broker, sample the broker; fail
        loudly if a program or supervisord dies for good."""
        programs = self.programs
        assert programs is not None  # started with supervisord
        while not stopping.wait(1.0):
            if self.supervisord is not None and self.supervisord.poll() is not None:
                raise StackError(f"supervisord exited unexpectedly (code {self.supervisord.returncode})")
            dead = [(cell, pg) for cell, pg in self.postgres_servers().items() if not pg.running]
            if dead:
                cell, pg = dead[0]
                log_path = self.data.logs / (f"postgres-{cell}.log" if cell else "postgres.log")
                if recovery.restart_postgres(pg, stopping, log_path, cell):
                    self.write_ready_file(self.ready_info())
                continue
            if self.broker is not None and not self.broker.running:
                assert self.broker_watch is not None  # started with the broker
                if recovery.restart_broker(self.broker, self.broker_watch, programs, self.create_topics,
                                           stopping, self.say):
                    self.write_ready_file(self.ready_info())
                continue
            try:
                infos = programs.supervisor.programs()
            except SupervisorError as exc:
                log.warning("cannot ask supervisord for program states: %s", exc)
                continue
            if self.console is not None and self.console.exited() is not None:
                log.warning("the console stopped (exit code %s); see %s", self.console.exited(),
                            self.console.log_path)
                self.console = None
            programs.check(infos)
            if self.broker_watch is not None:
                self.broker_watch.tick(time.monotonic())

    def stop(self) -> None:
        """Stop everything it started, in the reverse order, and give the data directory up."""
        if not self.data.held:
            return  # refused the data directory: everything there belongs to someone else
        ready_file = self.options.ready_file
        if ready_file is not None and ready_file.exists():
            ready_file.unlink()
        if self.console is not None:
            self.console.stop()
        if self.supervisord is not None and self.supervisord.poll() is None:
            print("stopping programs ...", flush=True)
            if self.programs is not None:
                # all at once (each within its stopwaitsecs), where supervisord's own shutdown would stop one
                # role after another, waiting for each: seconds more for every stop of the stack
                self.programs.stop_all()
            orphans.stop_child(self.supervisord, 60)
        if self.broker_watch is not None:
            self.broker_watch.close()
        if self.broker is not None:
            print("stopping the embedded broker ...", flush=True)
            self.broker.stop()
        for cell, pg in self.postgres_servers().items():
            print(f"stopping the embedded PostgreSQL{f' of cell {cell}' if cell else ''} ...", flush=True)
            pg.stop()
        self.data.release()
