"""`chronos up`: the whole stack in the foreground on one machine.

PostgreSQL (embedded under the data directory unless a URL is given), a Kafka-compatible
broker (embedded unless bootstrap servers are given), topics, migrations, then supervisord
running the consumer, firer and detector programs of the project's supervisord.conf, and the
web console (unless --no-console or its extra is missing).

One `chronos up` per data directory (a lock file). Everything it starts dies with it, even when
it is killed outright, and the next one stops whatever an earlier killed one left behind (see
chronos.runtime.orphans). An embedded PostgreSQL that dies is started again on the same port (crash
recovery); the programs reconnect by themselves, and the memory-only broker keeps its messages. An
embedded broker that dies is started again on the same port with the topics recreated, and the
programs with it; it had its messages in memory only, and `chronos up` says how many input messages
not yet read were lost with it (from the offsets it samples every few seconds: chronos.embedded.watch).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import xmlrpc.client
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import cast

import orjson

from chronos import config

from chronos.runtime import orphans

from chronos.adapters.kafka.admin import check_reachable, create_topics
from chronos.adapters.kafka.clients import EMBEDDED_PROFILE
from chronos.adapters.kafka.offset_process import OffsetReaderProcess
from chronos.adapters.postgres import pooling, store
from chronos.config import Settings, redact_url
from chronos.console.launch import ConsoleProcess
from chronos.embedded.broker import KNOWN_CLIENTS, EmbeddedBroker
from chronos.embedded.postgres import EmbeddedPostgres
from chronos.embedded.procs import EmbeddedError
from chronos.embedded.watch import STATS_ENV, BrokerWatch, default_warning_bytes, machine_memory_bytes
from chronos.ops.endpoints import metrics_urls, pick_metrics_base
from chronos.errors import EXIT_CONFIG, EXIT_EMBEDDED, EXIT_SCHEMA, ChronosError, UnavailableError
from chronos.runtime.backoff import Backoff

log = logging.getLogger("chronos.up")

ROLES = ("consumer", "firer", "detector")

# What each child gets when `chronos up` dies: PostgreSQL a fast shutdown, the broker (memory
# only, nothing to save) its immediate exit, supervisord a graceful stop of the programs.
PARENT_DEATH_SIGNAL = {"postgres": signal.SIGINT, "broker": signal.SIGINT, "supervisord": signal.SIGTERM}
# Partitions of the topics `chronos up` creates: one on the embedded broker, whose every fetch lists all the
# batches a partition holds (docs/operations/embedded-stack.md: fewer partitions, fewer batches to list per
# fetch: measured by benchmarks.broker_growth); four on a real Kafka, so several consumers share the input.
EMBEDDED_PARTITIONS, EXTERNAL_PARTITIONS = 1, 4
# a program is taken as started once it has run this long (it checked its settings and the schema)
PROGRAM_SETTLE_S = 2.0
# exit codes of a program that restarting cannot help: it is not restarted (supervisord.conf)
FINAL_EXITS = {EXIT_CONFIG: "a configuration error", EXIT_SCHEMA: "the database is not migrated"}


class StackError(ChronosError):
    exit_code = EXIT_EMBEDDED


def supervisord_conf() -> Path:
    """The project's supervisord.conf: beside the source tree, or shipped in the package."""
    beside = Path(__file__).resolve().parent.parent / "supervisord.conf"
    if beside.is_file():
        return beside
    return Path(str(resources.files("chronos") / "supervisord.conf"))


SOCKET_PATH_MAX = 100  # bytes: a Unix socket's path must fit sun_path (108 on Linux, 104 on BSDs)


def short_run_dir(run_dir: Path) -> Path:
    """Where supervisord may put its socket: the run directory, or, when the socket's path there
    would be too long for a Unix socket (a deep data directory), a short link to it in /tmp named
    after it. supervisord cannot bind a longer path at all, and says only "AF_UNIX path too long"."""
    if len(os.fsencode(run_dir / "supervisor.sock")) <= SOCKET_PATH_MAX:
        return run_dir
    link = Path("/tmp") / f"chronos-run-{hashlib.sha256(os.fsencode(run_dir.resolve())).hexdigest()[:16]}"
    if link.is_symlink() or link.exists():
        link.unlink()  # a link a killed `chronos up` of this data directory left
    link.symlink_to(run_dir.resolve(), target_is_directory=True)
    return link


def broker_offset_reader(bootstrap: str, s: Settings) -> OffsetReaderProcess:
    """What the broker watch reads offsets with: a reader in a process of its own, since librdkafka can
    crash on the embedded broker's answers when a topic is deleted (chronos.adapters.kafka.offset_process)."""
    return OffsetReaderProcess(bootstrap, s.consumer_group, s.input_topic, s.kafka_config, secrets=s.secrets())


@dataclass
class Stack:
    settings: Settings
    data_dir: Path
    counts: dict[str, int]
    partitions: int | None = None  # None: EMBEDDED_PARTITIONS or EXTERNAL_PARTITIONS, by the broker
    pg_port: int | None = None
    kafka_port: int | None = None
    ready_file: Path | None = None
    kafka_properties_file: str | None = None
    postgres: EmbeddedPostgres | None = None
    broker: EmbeddedBroker | None = None
    supervisord: subprocess.Popen | None = None
    console: ConsoleProcess | None = None
    broker_warning_bytes: int | None = None  # None: default_warning_bytes of this machine
    broker_watch: BrokerWatch | None = None
    run_dir: Path = field(init=False)
    supervisor_dir: Path = field(init=False)  # the run directory, by a short link when its path is too long
    log_dir: Path = field(init=False)
    lock: orphans.StackLock = field(init=False)
    program_pids: dict[str, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.run_dir = self.data_dir / "run"
        self.supervisor_dir = self.run_dir
        self.log_dir = self.data_dir / "logs"
        self.lock = orphans.StackLock(self.run_dir / "up.lock")

    # -- start -----------------------------------------------------------------------------

    def claim_data_dir(self) -> None:
        """Own the data directory: refuse if a live `chronos up` has it, stop what a dead one left.

        From here on every process started carries the data directory in its environment.
        """
        for d in (self.data_dir, self.run_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        if not self.lock.acquire():
            raise StackError(f"the data directory {self.data_dir} is in use by another chronos up "
                             f"(pid {self.lock.owner()}); stop it first, or give another --data-dir")
        os.environ[orphans.STACK_ENV] = str(self.data_dir)
        self.supervisor_dir = short_run_dir(self.run_dir)
        left = orphans.leftovers(self.data_dir)
        if left:
            print(f"an earlier chronos up of {self.data_dir} was killed and left {len(left)} processes "
                  f"running: {', '.join(map(str, left))}; stopping them", flush=True)
            stuck = orphans.stop_leftovers(left, self.data_dir)
            if stuck:
                raise StackError(f"processes left behind by an earlier chronos up of {self.data_dir} do not "
                                 f"stop: {', '.join(map(str, stuck))}; stop them yourself")
            print("stopped what the earlier chronos up left behind", flush=True)
        if self.ready_file is not None and self.ready_file.exists():
            self.ready_file.unlink()  # left by the killed one: nothing is ready yet

    def start(self, life_check) -> None:
        self.claim_data_dir()
        if self.console is not None:
            self.console.reserve()  # after the leftovers stopped: one of them may be an old console
        s = self.settings
        if s.database_url:
            print(f"using PostgreSQL at {redact_url(s.database_url)}", flush=True)
            store.wait_for_database(s.database_url, timeout=10)
            # settled here, once, for the programs; session refused if the probe finds a pooler in transaction mode
            mode = store.resolve_pool_mode(s.database_url, s.database_pool_mode, check=True)
            if mode == pooling.TRANSACTION:
                print("PostgreSQL is reached through a pooler in transaction mode: the programs prepare no "
                      "statement and make their settings in each transaction", flush=True)
            s = config.replace(s, database_pool_mode=mode)
        else:
            self.postgres = EmbeddedPostgres(self.data_dir / "pgdata", port=self.pg_port,
                                             log_path=self.log_dir / "postgres.log",
                                             die_with_parent=PARENT_DEATH_SIGNAL["postgres"])
            self.postgres.start()
            s = config.replace(s, database_url=self.postgres.url, database_pool_mode=(
                pooling.SESSION if s.database_pool_mode == pooling.AUTO else s.database_pool_mode))  # no pooler
            print(f"started embedded PostgreSQL on port {self.postgres.port} (data in {self.data_dir / 'pgdata'})",
                  flush=True)
        life_check()
        kafka_extra = dict(s.kafka_properties)
        if s.kafka_bootstrap_servers:
            check_reachable(s.kafka_bootstrap_servers, s.kafka_config, secrets=s.secrets())
        else:
            self.broker = EmbeddedBroker(port=self.kafka_port, log_path=self.log_dir / "broker.log",
                                         die_with_parent=PARENT_DEATH_SIGNAL["broker"])
            self.broker.start()
            kafka_extra = {**EMBEDDED_PROFILE, **kafka_extra}
            s = config.replace(s, kafka_bootstrap_servers=self.broker.bootstrap_servers)
            print(f"started embedded Kafka-compatible broker on {self.broker.bootstrap_servers} "
                  f"(memory only; {KNOWN_CLIENTS})", flush=True)
        s = config.replace(s, kafka_properties=kafka_extra)
        self.settings = s
        # both were given or the embedded services were started above
        assert s.kafka_bootstrap_servers is not None and s.database_url is not None
        life_check()
        if self.partitions is None:
            self.partitions = EXTERNAL_PARTITIONS if self.broker is None else EMBEDDED_PARTITIONS
        self.create_topics()
        if self.broker is not None:
            self.watch_broker()
        applied = store.migrate(s.database_url)
        print(f"schema at version {store.LATEST_VERSION}"
              + (f" (applied {', '.join(map(str, applied))})" if applied else ""), flush=True)
        life_check()
        if self.console is not None and not s.metrics_port:
            # the console's rates and lateness come from the programs' /metrics
            self.settings = s = config.replace(s, metrics_port=pick_metrics_base(self.live_counts()))
        self.start_supervisord()
        self.wait_programs_running(life_check)
        if self.console is not None:
            self.console.settings = config.replace(s, console_metrics_urls=metrics_urls(s.metrics_port,
                                                                                        self.live_counts()))
            print(f"console on {self.console.start(self.environ())} ("
                  + ("read-only: no CHRONOS_CONSOLE_TOKEN" if s.console_token is None else "actions need the token")
                  + ")", flush=True)

    def create_topics(self) -> None:
        s = self.settings
        assert s.kafka_bootstrap_servers is not None  # given, or the embedded broker's
        assert self.partitions is not None  # chosen by start()
        create_topics(s.kafka_bootstrap_servers, {t: self.partitions for t in
                                                  (s.input_topic, s.output_topic, s.dlq_topic)},
                      client_config=s.kafka_config)

    def watch_broker(self) -> None:
        """Sample the embedded broker from now on (its memory, what it holds, what a restart would lose)."""
        assert self.broker is not None
        s = self.settings
        bootstrap = self.broker.bootstrap_servers
        warning = self.broker_warning_bytes or default_warning_bytes(machine_memory_bytes())
        self.broker_watch = BrokerWatch(
            self.run_dir / "broker-stats.json", s.input_topic, say=self.say, warning_bytes=warning,
            reader=lambda: broker_offset_reader(bootstrap, s))
        self.broker_watch.started(self.broker.pid, self.broker.port)

    def say(self, line: str) -> None:
        """Tell the operator about the embedded broker: printed, and noted in the broker's log."""
        print(line, flush=True)
        if self.broker is not None:
            self.broker.note(line)

    def live_counts(self) -> dict[str, int]:
        return {role: n for role, n in self.counts.items() if n > 0}

    def environ(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(config.to_environ(self.settings))
        env.update({
            "CHRONOS_BIN": f"{sys.executable} -m chronos",
            "CHRONOS_RUN_DIR": str(self.supervisor_dir),
            "CHRONOS_LOG_DIR": str(self.log_dir),
            "CHRONOS_CONSUMERS": str(max(1, self.counts["consumer"])),
            "CHRONOS_FIRERS": str(max(1, self.counts["firer"])),
            "CHRONOS_DETECTORS": str(max(1, self.counts["detector"])),
            "CHRONOS_CONSOLES": "0",  # its console is started beside supervisord (self.console), not by it
        })
        if self.broker_watch is not None:
            env[STATS_ENV] = str(self.broker_watch.path)  # the detector exports it, the console shows it
        if self.kafka_properties_file:
            # the programs read the file themselves, so its secrets stay out of their environment
            env["CHRONOS_KAFKA_PROPERTIES_FILE"] = self.kafka_properties_file
        env.pop("CHRONOS_READY_FILE", None)
        env.pop("CHRONOS_CONSOLE_TOKEN", None)  # only the console needs it
        return env

    def start_supervisord(self) -> None:
        sock = self.supervisor_dir / "supervisor.sock"
        if sock.exists():
            sock.unlink()
        self.supervisord = subprocess.Popen(
            [sys.executable, "-m", "supervisor.supervisord", "-c", str(supervisord_conf()), "-n"],
            env=self.environ(), stdout=subprocess.DEVNULL, stderr=open(self.log_dir / "supervisord.err", "ab"),
            start_new_session=True, preexec_fn=orphans.child_dies_with_us(PARENT_DEATH_SIGNAL["supervisord"]))

    def rpc(self) -> xmlrpc.client.ServerProxy:
        from supervisor.xmlrpc import SupervisorTransport
        transport = SupervisorTransport(None, None, f"unix://{self.supervisor_dir / 'supervisor.sock'}")
        return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)

    def program_states(self) -> list[dict]:
        # XML-RPC answers are untyped; supervisord documents this one as a list of structs
        return cast(list[dict], self.rpc().supervisor.getAllProcessInfo())

    def wait_programs_running(self, life_check, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            life_check()
            if self.supervisord is not None and self.supervisord.poll() is not None:
                err = (self.log_dir / "supervisord.err").read_text(errors="replace").strip().splitlines()[-3:]
                raise StackError(f"supervisord exited with code {self.supervisord.returncode}: {' '.join(err)}")
            try:
                infos = self.program_states()
            except (OSError, xmlrpc.client.Fault):
                infos = None
            if infos is not None:
                for group, count in self.counts.items():
                    if count == 0:
                        self.rpc().supervisor.stopProcessGroup(group)
                self.check_failed(infos)
                wanted = [i for i in infos if self.counts.get(i["group"], 1) > 0]
                if wanted and all(i["statename"] == "RUNNING" and i["now"] - i["start"] >= PROGRAM_SETTLE_S
                                  for i in wanted):
                    self.program_pids = {i["name"]: i["pid"] for i in wanted}
                    return
            if time.monotonic() > deadline:
                raise StackError("the programs did not all reach RUNNING within "
                                 f"{timeout:.0f}s; see {self.log_dir}")
            time.sleep(0.2)

    def check_failed(self, infos: list[dict]) -> None:
        for info in infos:
            if info["statename"] == "FATAL" or (info["statename"] == "EXITED" and info["exitstatus"] != 0):
                tail = _tail(Path(info["stdout_logfile"]), 3)
                raise StackError(f"program {info['name']} failed ({info['statename']}, exit "
                                 f"{info['exitstatus']}): {tail}")

    def check_programs(self, infos: list[dict]) -> None:
        """While running: stop on a program that exited for good, say when one was restarted.

        A crashed program is restarted by supervisord (and waits longer after each crash in a row:
        chronos.runtime.process); one that exited with a configuration or schema error is not, and
        neither is one that could not be spawned (FATAL).
        """
        for info in infos:
            name, state = info["name"], info["statename"]
            why = "it cannot be spawned" if state == "FATAL" else \
                FINAL_EXITS.get(info["exitstatus"]) if state == "EXITED" else None
            if why:
                tail = _tail(Path(info["stdout_logfile"]), 3)
                raise StackError(f"program {name} stopped for good ({state}, exit {info['exitstatus']}: "
                                 f"{why}): {tail}")
            old = self.program_pids.get(name)
            if state == "RUNNING" and old and info["pid"] != old:
                print(f"program {name} was restarted by supervisord (pid {old} -> "
                      f"{info['pid']}); see {info['stdout_logfile']}", flush=True)
            if info["pid"]:
                self.program_pids[name] = info["pid"]

    # -- ready -----------------------------------------------------------------------------

    def ready_info(self) -> dict:
        s = self.settings
        info = {"bootstrap_servers": s.kafka_bootstrap_servers, "database_url": s.database_url,
                "input_topic": s.input_topic, "output_topic": s.output_topic, "dlq_topic": s.dlq_topic,
                "data_dir": str(self.data_dir), "log_dir": str(self.log_dir),
                "supervisor_socket": str(self.supervisor_dir / "supervisor.sock"),
                "supervisord_pid": self.supervisord.pid if self.supervisord else None,
                "postgres_pid": self.postgres.pid if self.postgres else None,
                "broker_pid": self.broker.pid if self.broker else None,
                "broker_stats_file": str(self.broker_watch.path) if self.broker_watch else None,
                "kafka_properties": s.kafka_properties, "pid": os.getpid(),
                "console_url": self.console.url if self.console else None,
                "console_pid": self.console.proc.pid if self.console and self.console.proc else None,
                "metrics_urls": list(metrics_urls(s.metrics_port, self.live_counts())) if s.metrics_port else []}
        return info

    def announce(self) -> None:
        info = self.ready_info()
        print(f"ready bootstrap_servers={info['bootstrap_servers']} "
              f"database_url={redact_url(info['database_url'])} input_topic={info['input_topic']} "
              f"output_topic={info['output_topic']} dlq_topic={info['dlq_topic']}", flush=True)
        self.write_ready_file(info)

    def write_ready_file(self, info: dict) -> None:
        if self.ready_file is not None:
            self.ready_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.ready_file.with_suffix(self.ready_file.suffix + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(orjson.dumps(info, option=orjson.OPT_INDENT_2))
            os.replace(tmp, self.ready_file)

    # -- run and stop ----------------------------------------------------------------------

    def watch(self, stopping: threading.Event) -> None:
        """Until asked to stop: restart a dead embedded PostgreSQL or broker, sample the broker; fail
        loudly if a program or supervisord dies for good."""
        while not stopping.wait(1.0):
            if self.supervisord is not None and self.supervisord.poll() is not None:
                raise StackError(f"supervisord exited unexpectedly (code {self.supervisord.returncode})")
            if self.postgres is not None and not self.postgres.running:
                self.restart_postgres(stopping)
                continue
            if self.broker is not None and not self.broker.running:
                self.restart_broker(stopping)
                continue
            try:
                infos = self.program_states()
            except (OSError, xmlrpc.client.Fault) as exc:
                log.warning("cannot ask supervisord for program states: %s", exc)
                continue
            if self.console is not None and self.console.exited() is not None:
                log.warning("the console stopped (exit code %s); see %s", self.console.exited(),
                            self.console.log_path)
                self.console = None
            self.check_programs(infos)
            if self.broker_watch is not None:
                self.broker_watch.tick(time.monotonic())

    def restart_postgres(self, stopping: threading.Event) -> None:
        """Start the embedded PostgreSQL again on its port, retrying with backoff until it runs.

        It recovers from its write-ahead log like after any crash. Meanwhile the programs wait and
        reconnect, the consumer commits nothing, and the broker keeps what it holds.
        """
        pg = self.postgres
        assert pg is not None
        how = _describe_exit(pg.returncode)
        old_pid = pg.pid
        down = time.monotonic()
        print(f"the embedded PostgreSQL (pid {old_pid}) stopped unexpectedly ({how}); starting it again on port "
              f"{pg.port}: it recovers from its write-ahead log while the programs wait and reconnect", flush=True)
        backoff = Backoff(first=1.0, cap=30.0)
        while not stopping.is_set():
            try:
                pg.start(timeout=60)
                break
            except EmbeddedError as exc:
                delay = backoff.failed()
                print(f"the embedded PostgreSQL does not start again ({exc}); retrying in {delay:.0f}s", flush=True)
                stopping.wait(delay)
        else:
            return
        print(f"the embedded PostgreSQL runs again (pid {pg.pid}) after {time.monotonic() - down:.1f}s; see "
              f"{self.log_dir / 'postgres.log'} for its recovery", flush=True)
        self.write_ready_file(self.ready_info())

    def restart_broker(self, stopping: threading.Event) -> None:
        """Start the embedded broker again on its port and recreate the topics, retrying with backoff;
        the programs are stopped meanwhile and started afresh after.

        It kept everything in memory: topics, messages, the groups' committed offsets are gone. The
        line it prints says how many input messages not yet read by the consumer group were lost, from
        the last sample of the offsets. The messages waiting in PostgreSQL are safe.

        The programs are restarted rather than left to reconnect because a restarted broker hands out
        idempotent producer ids again from the start: a producer that kept an id of the dead broker
        shares it with a new one, and its next message, taken for a duplicate, is acknowledged and
        stored nowhere (measured). While the broker is down they can do nothing anyway: the firer
        hands its claimed rows back as it stops.
        """
        broker, watch = self.broker, self.broker_watch
        assert broker is not None and watch is not None
        how = _describe_exit(broker.returncode)
        old_pid = broker.pid
        print(f"the embedded broker (pid {old_pid}) stopped unexpectedly ({how}); stopping the programs and "
              f"starting it again on port {broker.port}", flush=True)
        self.stop_programs()
        backoff = Backoff(first=1.0, cap=30.0)
        while not stopping.is_set():
            try:
                broker.start(timeout=30)  # returns at once when it runs and only the topics failed
                self.create_topics()
                break
            except (EmbeddedError, UnavailableError) as exc:
                delay = backoff.failed()
                print(f"the embedded broker does not start again ({exc}); retrying in {delay:.0f}s", flush=True)
                stopping.wait(delay)
        else:
            return
        self.start_programs()
        self.say(watch.restarted(old_pid, how, broker.pid, broker.port, time.time()))
        self.write_ready_file(self.ready_info())

    def stop_programs(self) -> None:
        """Stop every program (gracefully, as supervisord.conf says) and wait until they stopped."""
        try:
            self.rpc().supervisor.stopAllProcesses(True)
        except (OSError, xmlrpc.client.Fault) as exc:
            log.warning("cannot stop the programs through supervisord: %s", exc)

    def start_programs(self) -> None:
        """Start the programs of every role that runs (not those asked for 0) and note their new pids."""
        try:
            for group in self.live_counts():
                self.rpc().supervisor.startProcessGroup(group, True)
            self.program_pids = {i["name"]: i["pid"] for i in self.program_states() if i["pid"]}
        except (OSError, xmlrpc.client.Fault) as exc:
            log.warning("cannot start the programs through supervisord: %s", exc)

    def stop(self) -> None:
        if not self.lock.held:
            return  # refused the data directory: everything there belongs to someone else
        if self.ready_file is not None and self.ready_file.exists():
            self.ready_file.unlink()
        if self.console is not None:
            self.console.stop()
        if self.supervisord is not None and self.supervisord.poll() is None:
            print("stopping programs ...", flush=True)
            orphans.stop_child(self.supervisord, 60)
        if self.broker_watch is not None:
            self.broker_watch.close()
        if self.broker is not None:
            print("stopping the embedded broker ...", flush=True)
            self.broker.stop()
        if self.postgres is not None:
            print("stopping the embedded PostgreSQL ...", flush=True)
            self.postgres.stop()
        if self.supervisor_dir != self.run_dir:
            self.supervisor_dir.unlink(missing_ok=True)
        self.lock.release()


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _positive_mb(value: str | None) -> int | None:
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


def _tail(path: Path, lines: int) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", default=os.environ.get("CHRONOS_DATA_DIR", ".chronos"),
                        help="where the embedded PostgreSQL keeps its data, and logs go [env CHRONOS_DATA_DIR] "
                             "(default: .chronos)")
    parser.add_argument("--bootstrap-servers", dest="kafka_bootstrap_servers_alias", default=None,
                        help="same as --kafka-bootstrap-servers")
    for role in ROLES:
        parser.add_argument(f"--{role}s", type=int, default=1, dest=f"n_{role}",
                            help=f"number of {role} processes (default 1)")
    parser.add_argument("--partitions", type=int, default=None,
                        help=f"partitions of the topics it creates (default {EMBEDDED_PARTITIONS} on the embedded broker, "
                             f"whose fetches slow with every batch a partition holds; {EXTERNAL_PARTITIONS} on a real Kafka)")
    parser.add_argument("--pg-port", type=int, default=None, help="port of the embedded PostgreSQL (default: free)")
    parser.add_argument("--kafka-port", type=int, default=None, help="port of the embedded broker (default: free)")
    parser.add_argument("--broker-memory-warning-mb", metavar="MB",
                        default=os.environ.get("CHRONOS_BROKER_MEMORY_WARNING_MB"),
                        help="warn when the embedded broker's memory passes this many MB "
                             "[env CHRONOS_BROKER_MEMORY_WARNING_MB] (default: 2048, or half the machine's "
                             "memory when that is less)")
    parser.add_argument("--no-console", action="store_true",
                        help="do not start the web console (it serves on CHRONOS_CONSOLE_HOST:CHRONOS_CONSOLE_PORT)")


def run(args: argparse.Namespace) -> int:
    if args.kafka_bootstrap_servers_alias and not args.kafka_bootstrap_servers:
        args.kafka_bootstrap_servers = args.kafka_bootstrap_servers_alias
    data_dir = Path(args.data_dir).resolve()
    ready_file = Path(args.ready_file).resolve() if args.ready_file else data_dir / "ready.json"
    args.ready_file = None  # `up` writes the ready file; it does not read one
    settings = config.load(args, default_ready_file=False)
    counts = {role: getattr(args, f"n_{role}") for role in ROLES}
    for role, n in counts.items():
        if n < 0 or n > 64:
            raise config.ConfigError(f"--{role}s must be between 0 and 64, got {n}")
    if args.partitions is not None and args.partitions < 1:
        raise config.ConfigError(f"--partitions must be at least 1, got {args.partitions}")
    warning_mb = _positive_mb(args.broker_memory_warning_mb)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    stack = Stack(settings, data_dir, counts, partitions=args.partitions,
                  pg_port=args.pg_port, kafka_port=args.kafka_port, ready_file=ready_file,
                  kafka_properties_file=str(Path(args.kafka_properties_file).resolve())
                  if args.kafka_properties_file else None,
                  broker_warning_bytes=None if warning_mb is None else warning_mb * 2 ** 20)
    if not args.no_console:
        why_not = ConsoleProcess.available()
        if why_not:
            print(f"console not started: {why_not}", flush=True)
        else:
            stack.console = ConsoleProcess(settings, stack.log_dir, port_chosen=args.console_port is not None
                                           or "CHRONOS_CONSOLE_PORT" in os.environ)
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


