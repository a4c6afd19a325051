"""The fleet's Chronos hosts (chronos-1, chronos-2, ...), installed and run by the commands of the install
page itself (kits.fleet.install), and what the tests do on them: a script as root in the host (its network,
its own directories), the page's shell functions (`chronos`, `supervisorctl`), supervisord started, stopped
and restarted as `systemctl` would, a page's block run as written, each program's /healthz.

What the page cannot give verbatim (the database's address and password, the Kafka client's settings, the
process counts) is the host's environment file, written here with the page's variables. Each host has its
own /opt/chronos, where the environments installed once (`venv-<version>`) are mounted and the link `venv`
is the host's: during a rolling upgrade each host runs the release its link names. Each host has its own
`systemctl` too, a stand-in for systemd, which does not run there: a page's `systemctl restart chronos`
asks the kit to restart the host's supervisord (`ChronosHosts.systemctl`). The database's two roles are
the production checklist's: an owner, which migrates from the host's root-only owner.env, and the
processes' role, which owns nothing.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chronos.telemetry import endpoints
from kits.fleet.broker import Broker
from kits.fleet.common import METRICS_PORT, PG_PORT, FleetError, plain_env, tell, wait, write_file
from kits.fleet.install import INSTALL_PAGE, OWN_DIRS, SHARED_DIR, mount_points, mount_script, page_blocks
from kits.fleet.postgres import APP_DATABASE, APP_USER, OWNER, PatroniCluster
from kits.network import Network
from kits.stack import http_get

SYSTEMCTL = "/usr/bin/systemctl"  # a host's own is the fleet's stand-in for systemd (ChronosHosts.systemctl)
SYSTEMCTL_REQUEST, SYSTEMCTL_REPLY = "systemctl.request", "systemctl.reply"  # its FIFOs, in the host's folder

@dataclass
class ChronosHost:
    """One Chronos host: its folder (what it has of its own), its supervisord, its settings."""

    name: str
    address: str
    folder: Path
    counts: dict[str, int]
    supervisord: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)  # each program's starts logged before the last start

    @property
    def log_dir(self) -> Path:
        return self.folder / "log"

    def log(self, program: str) -> str:
        path = self.log_dir / f"{program}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def programs(self) -> list[str]:
        return [f"{role}_{i:02d}" for role in ("consumer", "firer", "detector") for i in range(self.counts[role])]

    def metrics_port(self, program: str) -> int:
        """The port the program serves /metrics on, as the product works it out (supervisord's process number)."""
        role, num = program.rsplit("_", 1)
        return endpoints.metrics_port(role, METRICS_PORT, {"CHRONOS_PROCESS_NUM": str(int(num))})


class ChronosHosts:
    """Every Chronos host of the fleet. `per_host` is (consumers, firers, detectors) on each; `settings` are
    more CHRONOS_* lines of every host's environment file (the hold time, say); `release` is the release
    every host runs at first (its environment's version; None: the one the install linked)."""

    def __init__(self, net: Network, workdir: Path, opt_dir: Path, db: PatroniCluster, kafka: Broker, *,
                 count: int = 2, per_host: tuple[int, int, int] = (1, 1, 1), settings: dict[str, str] | None = None,
                 kafka_properties: dict[str, str] | None = None, release: str | None = None,
                 cells: dict[str, PatroniCluster] | None = None):
        """`cells`: with cells, each cell's cluster by name (`db` the first's); the hosts' CHRONOS_CELLS names
        them, and `per_host`'s firers and detectors are each cell's (process n serves the cell at n modulo
        their count)."""
        self.net, self.workdir, self.opt_dir, self.db, self.kafka = net, workdir, opt_dir, db, kafka
        self.cells = cells or {}
        consumers, firers, detectors = per_host
        each = max(1, len(self.cells))
        self.all = [ChronosHost(f"chronos-{i + 1}", "", workdir / f"chronos-{i + 1}",
                                {"consumer": consumers, "firer": firers * each, "detector": detectors * each})
                    for i in range(count)]
        self.settings = settings or {}
        self.kafka_properties = kafka_properties or {}
        self.release = release
        self.console_token = f"fleet console {secrets.token_hex(8)}"
        self.systemd: list[threading.Thread] = []  # each host's stand-in for systemd (`answer_systemctl`)

    def __iter__(self):
        return iter(self.all)

    def host(self, host: ChronosHost | str) -> ChronosHost:
        if isinstance(host, ChronosHost):
            return host
        return next(h for h in self.all if h.name == host)

    # -- the install --------------------------------------------------------------------------------

    def mounts(self, host: ChronosHost) -> Path:
        """The host's mount script: its own directories, its own /opt/chronos with every environment
        installed once mounted in it, and its own `venv` link (to `release`'s environment, or to the one the
        install linked)."""
        binds: dict[str, Path] = {target: host.folder / sub for target, sub in OWN_DIRS.items()}
        binds["/etc/hosts"] = self.workdir / "hosts"
        own_opt = binds[SHARED_DIR] = host.folder / "opt"
        for target, src in binds.items():
            if src.suffix == "" and target != "/etc/hosts":
                src.mkdir(parents=True, exist_ok=True)
        mount_points(list(binds))
        for env in sorted(self.opt_dir.glob("venv-*")):
            (own_opt / env.name).mkdir(exist_ok=True)  # the mount point, inside the host's /opt/chronos
            binds[f"{SHARED_DIR}/{env.name}"] = env
        link = own_opt / "venv"
        if not link.is_symlink():
            link.symlink_to(f"{SHARED_DIR}/venv-{self.release}" if self.release else os.readlink(self.opt_dir / "venv"))
        binds[SYSTEMCTL] = self.systemctl(host)
        return mount_script(host.folder / "mounts", binds)

    # -- systemd's stand-in: systemd is not PID 1 on the fleet's hosts -----------------------------------

    def systemctl(self, h: ChronosHost) -> Path:
        """The host's `systemctl`, mounted over the machine's in the host's own mount namespace, so that a
        page's `systemctl restart chronos` runs as written: it asks the kit (`answer_systemctl`), which does
        to the host's supervisord what systemd does with chronos.service; anything else fails, saying so."""
        request, reply = h.folder / SYSTEMCTL_REQUEST, h.folder / SYSTEMCTL_REPLY
        for fifo in (request, reply):
            if not fifo.exists():
                os.mkfifo(fifo, 0o600)
        return write_file(h.folder / "systemctl", f"""#!/bin/sh
# systemd's stand-in on a host of the fleet (kits/fleet/hosts.py), where systemd is not PID 1
if [ "$#" -ne 2 ] || [ "$1" != restart ] || [ "${{2%.service}}" != chronos ]; then
    echo "systemctl $*: the fleet's stand-in for systemd knows only restart chronos" >&2
    exit 1
fi
echo "$1" > {shlex.quote(str(request))}
read -r status < {shlex.quote(str(reply))}
exit "$status"
""", 0o755)

    def answer_systemctl(self, h: ChronosHost) -> None:
        """Answer the host's `systemctl` stand-in until `close_systemd` (on a thread of its own): `restart
        chronos` is `restart`, which stops supervisord (its programs gracefully) and starts it again, as
        systemd does."""
        while True:
            with open(h.folder / SYSTEMCTL_REQUEST) as fifo:  # until the stand-in (or `close_systemd`) writes
                verb = fifo.read().strip()
            if verb == "close":
                return
            try:
                self.restart(h)
                status = 0
            except Exception as exc:  # noqa: BLE001 - the stand-in's caller gets the failure, as systemctl's would
                print(f"systemctl {verb} chronos on {h.name}: {exc}", file=sys.stderr, flush=True)
                status = 1
            tell(h.folder / SYSTEMCTL_REPLY, f"{status}\n", timeout=30.0)

    def close_systemd(self) -> None:
        """Every host's stand-in for systemd ended (before the hosts are stopped)."""
        for h in self.all:
            if (h.folder / SYSTEMCTL_REQUEST).exists():
                try:
                    tell(h.folder / SYSTEMCTL_REQUEST, "close\n")
                except FleetError as exc:  # in the middle of a restart: the thread ends with the process
                    print(f"the stand-in for systemd of {h.name} did not stop: {exc}", file=sys.stderr)
        for thread in self.systemd:
            thread.join(10)

    def environment(self, host: ChronosHost) -> dict[str, str]:
        """The host's /etc/chronos/env: the page's variables, with this fleet's servers."""
        consumers, firers, detectors = (host.counts[r] for r in ("consumer", "firer", "detector"))
        return {
            "CHRONOS_BIN": "/opt/chronos/venv/bin/chronos",
            "CHRONOS_RUN_DIR": "/run/chronos",
            "CHRONOS_LOG_DIR": "/var/log/chronos",
            "CHRONOS_CONSUMERS": str(consumers),
            "CHRONOS_FIRERS": str(firers),
            "CHRONOS_DETECTORS": str(detectors),
            "CHRONOS_CONSOLES": "0",
            **self.databases(),
            "PGPASSFILE": "/etc/chronos/pgpass",
            "CHRONOS_KAFKA_BOOTSTRAP_SERVERS": self.kafka.bootstrap_by_name,
            "CHRONOS_KAFKA_PROPERTIES_FILE": "/etc/chronos/kafka.properties",
            "CHRONOS_METRICS_PORT": str(METRICS_PORT),
            # a secret with a space, as a quoted value: no command line may show it, every process gets it whole
            "CHRONOS_CONSOLE_TOKEN": self.console_token,
            **self.settings,
        }

    def databases(self, user: str = APP_USER) -> dict[str, str]:
        """The environment's database: CHRONOS_DATABASE_URL, or with cells CHRONOS_CELLS (as `user`)."""
        if not self.cells:
            return {"CHRONOS_DATABASE_URL": self.db.database_url(user)}
        return {"CHRONOS_CELLS": " ".join(f"{cell}={db.database_url(user)}" for cell, db in self.cells.items())}

    def install(self, host: ChronosHost) -> None:
        """The install page's `host` blocks on the host, then its environment file, pgpass and Kafka properties."""
        from chronos.adapters.kafka.clients import EMBEDDED_PROFILE
        self.mounts(host)
        answer = threading.Thread(target=self.answer_systemctl, args=(host,), name=f"systemctl {host.name}",
                                  daemon=True)
        answer.start()
        self.systemd.append(answer)
        for code in page_blocks(INSTALL_PAGE, "host"):
            self.on(host, code)
        host.env = self.environment(host)
        env_text = "".join(f"{k}={shlex.quote(v)}\n" for k, v in host.env.items())
        owner_text = "".join(f"{k}={shlex.quote(v)}\n" for k, v in (
            *self.databases(OWNER).items(), ("PGPASSWORD", self.db.passwords["owner"])))
        props = {**EMBEDDED_PROFILE, **self.kafka_properties}
        self.on(host, "install -o chronos -g chronos -m 0600 /dev/null /etc/chronos/pgpass\n"
                      f"echo '*:{PG_PORT}:{APP_DATABASE}:{APP_USER}:{self.db.passwords['app']}' > /etc/chronos/pgpass\n"
                      "install -o chronos -g chronos -m 0600 /dev/null /etc/chronos/kafka.properties\n"
                      f"cat > /etc/chronos/kafka.properties <<'EOF'\n"
                      + "".join(f"{k}={v}\n" for k, v in props.items()) + "EOF\n"
                      "install -m 0600 /dev/null /etc/chronos/env\n"
                      f"cat > /etc/chronos/env <<'EOF'\n{env_text}EOF\n"
                      "install -m 0600 /dev/null /etc/chronos/owner.env\n"
                      f"cat > /etc/chronos/owner.env <<'EOF'\n{owner_text}EOF\n")

    def migrate(self) -> None:
        """The install page's migration, as the database's owner, from the first host (with cells, its first
        migration of the cells, which assigns the input partitions among them)."""
        (code,) = page_blocks(INSTALL_PAGE, "migrate cells" if self.cells else "migrate")
        self.on(self.all[0], code)

    def chronos_function(self) -> str:
        """The shell functions of the install page (`chronos`, `supervisorctl`), as a script's first lines."""
        code = page_blocks(INSTALL_PAGE, "check")[0]
        return "\n".join(line for line in code.splitlines() if re.match(r"^\w+\(\) [{(]", line)) + "\n"

    # -- on a host -----------------------------------------------------------------------------------

    def on(self, host: ChronosHost | str, script: str, *, timeout: float = 120.0, check: bool = True,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run a bash script as root on a Chronos host (its network, its own directories)."""
        h = self.host(host)
        argv = self.net.command(h.name, [str(h.folder / "mounts"), "bash", "-euo", "pipefail", "-c", script])
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env or plain_env(),
                              cwd="/")
        if check and done.returncode != 0:
            raise FleetError(f"on {h.name}, ({done.returncode}):\n{script}\n{done.stdout}\n{done.stderr}")
        return done

    def supervisorctl(self, host: ChronosHost | str, *args: str, check: bool = True) -> str:
        """The install page's `supervisorctl` function, on the host."""
        return self.on(host, self.chronos_function() + "supervisorctl " + " ".join(map(shlex.quote, args)),
                       check=check).stdout

    def run_block(self, host: ChronosHost | str, code: str, *, timeout: float = 240.0,
                  variables: dict[str, str] | None = None) -> str:
        """A page's block on a host, as written, with the install page's shell functions and the `variables`
        the page has its reader set (its `systemctl restart chronos` reaches the host's stand-in for systemd).
        Its output."""
        return self.on(host, self.chronos_function() + code, timeout=timeout, env=plain_env(**(variables or {}))).stdout

    def health(self, host: ChronosHost | str, program: str, timeout: float = 1.0) -> tuple[int, dict[str, Any]]:
        """A program's /healthz, asked from the client host: (status, report); (0, {}) when it does not answer."""
        h = self.host(host)
        with self.net.inside("client"):
            status, body = http_get(f"http://{h.address}:{h.metrics_port(program)}/healthz", timeout)
        try:
            return status, json.loads(body) if body else {}
        except ValueError:
            return status, {}

    # -- supervisord, as systemd would run it ------------------------------------------------------------

    def start(self, host: ChronosHost | str) -> None:
        """Run supervisord on the host as the install page's `start` block does (in the foreground, as
        its own child here)."""
        h = self.host(host)
        env_file = h.folder / "etc" / "env"
        if env_file.exists():  # supervisord's numprocs: the counts of the environment file it starts with
            for role, count in re.findall(r"^CHRONOS_(CONSUMER|FIRER|DETECTOR)S=(\d+)$", env_file.read_text(), re.M):
                h.counts[role.lower()] = int(count)
        h.starts = {p: h.log(p).count("starting: node") for p in h.programs()}
        (code,) = page_blocks(INSTALL_PAGE, "start")
        argv = self.net.command(h.name, [str(h.folder / "mounts"), "bash", "-euo", "pipefail", "-c", code])
        log = self.workdir / "logs" / f"{h.name}-supervisord.out"
        h.supervisord = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=open(log, "ab"),
                                         stderr=subprocess.STDOUT, env=plain_env(), cwd="/", start_new_session=True)

    def wait_started(self, host: ChronosHost | str, timeout: float = 60.0) -> None:
        """Until every program of the host has logged its start since `start`."""
        h = self.host(host)

        def started() -> bool:
            if h.supervisord is not None and h.supervisord.poll() is not None:
                raise FleetError(f"supervisord of {h.name} exited ({h.supervisord.returncode})")
            return all(h.log(p).count("starting: node") > h.starts.get(p, 0) for p in h.programs())
        wait(started, timeout, f"the programs of {h.name} started ({ {p: h.log(p)[-300:] for p in h.programs()} })")

    def stop(self, host: ChronosHost | str, timeout: float = 60.0) -> int | None:
        """SIGTERM the host's supervisord (it stops its programs gracefully) and wait for it."""
        h = self.host(host)
        if h.supervisord is None:
            return None
        pid_file = h.folder / "run" / "supervisord.pid"
        try:
            os.kill(int(pid_file.read_text().strip()), 15)
        except (OSError, ValueError):
            h.supervisord.terminate()
        try:
            return h.supervisord.wait(timeout)
        except subprocess.TimeoutExpired:
            h.supervisord.kill()
            return h.supervisord.wait(5)

    def restart(self, host: ChronosHost | str, timeout: float = 60.0) -> None:
        """What `systemctl restart chronos` does to the host: supervisord stopped (its programs gracefully),
        then started again, here until every program has logged its start. On the embedded broker its
        consumers leave the group one at a time first (`leave_group_one_at_a_time`)."""
        h = self.host(host)
        self.leave_group_one_at_a_time(h)
        self.stop(h, timeout=timeout)
        self.start(h)
        self.wait_started(h, timeout=timeout)

    def leave_group_one_at_a_time(self, host: ChronosHost | str) -> None:
        """Stop the host's consumers one after another, each once the group has settled: the embedded
        broker (Tansu 0.6.0) keeps a leader that leaves while the group rebalances as its leader for ever,
        so that no member gets a partition again (docs/explanations/embedded-broker.md, behaviour 8). A
        Kafka cluster has no such need; an operator's `systemctl stop` stops them together."""
        h = self.host(host)
        for i in range(h.counts["consumer"]):
            self.kafka.wait_group_settled()
            self.supervisorctl(h, "stop", f"consumer:consumer_{i:02d}")
        self.kafka.wait_group_settled()

    # -- releases ----------------------------------------------------------------------------------------

    def release_of(self, host: ChronosHost | str) -> str:
        """The release the host's `venv` link names."""
        return os.readlink(self.host(host).folder / "opt" / "venv").rsplit("venv-", 1)[-1]

    def running_releases(self, host: ChronosHost | str) -> dict[str, str]:
        """The release each program of the host runs: program -> the version of the environment its process
        loaded its files from (the link resolved when it started), "-" for one not running."""
        h = self.host(host)
        script = self.chronos_function() + "".join(
            f"pid=$(supervisorctl pid {p.rsplit('_', 1)[0]}:{p} || true)\n"
            f"echo {p} $(grep -o '{SHARED_DIR}/venv-[0-9][^/]*/' /proc/$pid/maps 2>/dev/null | sort -u | head -1)\n"
            for p in h.programs())
        out = {}
        for line in self.on(h, script).stdout.splitlines():
            program, _, path = line.partition(" ")
            out[program] = path.strip().rstrip("/").rsplit("venv-", 1)[-1] if path.strip() else "-"
        return out
