"""A fleet on one machine: Chronos on several hosts, a replicated PostgreSQL and a Kafka broker on
others, each host a network namespace on one bridge (kits.network), and partitions between them.

    client      the load, the reader and every probe of the tests (the test process's own threads),
                and Prometheus with the shipped rules (kits.fleet.prometheus)
    etcd-1      etcd, Patroni's consensus store, on a host of its own (two members) ...
    db-1, db-2  Patroni members, each with its PostgreSQL (synchronous replication); with three
                members each runs an etcd member too, so a cut-off member leaves a quorum
                (kits.fleet.postgres)
    db-3, db-4  with two cells, the second cell's Patroni cluster (etcd-2 its etcd): each cell a cluster
                of its own, the Chronos hosts' CHRONOS_CELLS naming both
    kafka-1     the broker, advertising its bridge address (kits.fleet.broker)
    chronos-1 ...  Chronos hosts, installed as docs/operations/host-install.md says (kits.fleet.hosts,
                kits.fleet.install)

`Fleet` puts the parts together: `net`, `db` (the first cell's cluster; `cells` every cell's, by name, with
`cells=2`), `kafka`, `hosts` (and `chronos`, the hosts' list), `prometheus`; it starts them in order, cuts and
heals, and ends everything. Everything the fleet starts runs inside a namespace of its own prefix, so `close`
(and the next `start`, after a kit killed outright) ends it all. The scenarios under load and their verdicts
are kits.fleet.scenarios.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

from kits.fleet.broker import Broker
from kits.fleet.common import ROOT, FleetError, Servers, wait, write_file
from kits.fleet.hosts import SYSTEMCTL, ChronosHost, ChronosHosts
from kits.fleet.install import build_wheel, install_chronos, page_blocks, previous_release, release_wheel
from kits.fleet.postgres import ETCD, PatroniCluster
from kits.fleet.prometheus import Prometheus
from kits.network import PREFIX, Network, NetworkError

__all__ = ["ROOT", "ChronosHost", "Fleet", "FleetError", "build_wheel", "install_chronos", "page_blocks",
           "previous_release", "release_wheel", "require_fleet_tools", "wait"]


class Fleet:
    """The whole fleet; `start` builds and starts it, `close` ends and removes everything it made.

    `members` 2: etcd on a host of its own; 3: an etcd member on each PostgreSQL host. `per_host` is
    (consumers, firers, detectors) on each Chronos host (with cells, firers and detectors of each cell).
    `settings` are more CHRONOS_* lines of every host's environment file (the hold time, say). `release` is
    the release every host runs at first. `cells` 2: two cells, each a Patroni cluster of its own (`cells`,
    by name), the input partitions assigned among them by the install page's first migration."""

    def __init__(self, workdir: Path, opt_dir: Path, *, chronos_hosts: int = 2, per_host: tuple[int, int, int] = (1, 1, 1),
                 members: int = 2, partitions: int = 4, prefix: str = PREFIX, settings: dict[str, str] | None = None,
                 kafka_properties: dict[str, str] | None = None, release: str | None = None, archive: bool = False,
                 cells: int = 1):
        if cells not in (1, 2):
            raise FleetError(f"the fleet has one cell or two, not {cells}")
        self.workdir = Path(workdir).absolute()
        self.net = Network(prefix)
        self.servers = Servers(self.net, self.workdir / "logs")
        self.db = PatroniCluster(self.net, self.servers, self.workdir, members=members, archive=archive)
        self.cells = {"cell1": self.db}
        if cells == 2:
            self.cells["cell2"] = PatroniCluster(self.net, self.servers, self.workdir, members=members, archive=archive,
                                                 first=members + 1, etcd_host="etcd-2", passwords=self.db.passwords)
        self.kafka = Broker(self.net, self.servers, partitions=partitions)
        self.hosts = ChronosHosts(self.net, self.workdir, opt_dir, self.db, self.kafka, count=chronos_hosts,
                                  per_host=per_host, settings=settings, kafka_properties=kafka_properties,
                                  release=release, cells=self.cells if cells > 1 else None)
        self.prometheus = Prometheus(self.net, self.servers, self.workdir / "prometheus")

    @property
    def chronos(self) -> list[ChronosHost]:
        return self.hosts.all

    def address(self, host: str) -> str:
        return self.net[host].address

    def cell_of(self, partition: int) -> str:
        """The cell of an input partition, as the install page's first migration assigns them."""
        from chronos.domain.cells import assign
        shares = assign(list(self.cells), self.kafka.partitions)
        return next(cell for cell, share in shares.items() if partition in share)

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> None:
        t0 = time.monotonic()
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        self.net.start()
        try:
            clusters = list(self.cells.values())
            for name in ["client", *(h for db in clusters for h in db.hosts), self.kafka.host,
                         *(h.name for h in self.chronos)]:
                self.net.add(name)
            for host in self.chronos:
                host.address = self.address(host.name)
            write_file(self.workdir / "hosts", self.net.hosts_file())
            for db in clusters:
                db.start()
            self.kafka.start()
            for db in clusters:
                db.ready(timeout=timeout - (time.monotonic() - t0))
            self.kafka.create_topics()
            for host in self.chronos:
                self.hosts.install(host)
            self.hosts.migrate()
            for host in self.chronos:
                self.hosts.start(host)
            for host in self.chronos:
                self.hosts.wait_started(host)
            self.prometheus.start(self.chronos)
        except BaseException:
            self.close()
            raise

    def close(self) -> list[str]:
        """End everything and delete the namespaces; what would not end."""
        self.hosts.close_systemd()
        running = [h for h in self.chronos if h.supervisord is not None and h.supervisord.poll() is None]
        if running:  # every host's supervisord stops its programs at the same time, as in a fleet
            with ThreadPoolExecutor(max_workers=len(running)) as pool:
                list(pool.map(lambda h: self.hosts.stop(h, timeout=20), running))
        stuck = self.net.close()
        self.servers.kill_all()
        return stuck

    def __enter__(self) -> "Fleet":
        self.start()
        return self

    @contextlib.contextmanager
    def serving(self) -> Iterator["Fleet"]:
        """Started for the block, closed after it; a FleetError if anything it started outlives the close."""
        self.start()
        try:
            yield self
        finally:
            stuck = self.close()
        if stuck:
            raise FleetError(f"processes of the fleet outlive its close: {stuck}")

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- partitions ----------------------------------------------------------------------------------

    def cut(self, host: str, peers: list[str] | None = None, **how: bool) -> float:
        """Cut `host` off (kits.network.Network.cut); when (time.time())."""
        self.net.cut(host, peers, **how)
        return time.time()

    def heal(self, host: str | None = None) -> float:
        if host is None:
            self.net.heal_all()
        else:
            self.net.heal(host)
        return time.time()

    def heal_everything(self, timeout: float = 120.0) -> None:
        """Back to whole: no cut, every member running with a leader and a synchronous standby, every
        Chronos host's supervisord running."""
        self.net.heal_all()
        for db in self.cells.values():
            db.wait_leader(timeout=timeout)
            db.wait_sync_standby(timeout=timeout)
        for h in self.chronos:
            if h.supervisord is None or h.supervisord.poll() is not None:
                self.hosts.start(h)
                self.hosts.wait_started(h)


def require_fleet_tools() -> None:
    """What the fleet needs on this machine, or a FleetError that says what to install."""
    from kits.network import require_tools
    try:
        require_tools()
    except NetworkError as exc:
        raise FleetError(str(exc)) from None
    for path, hint in ((ETCD, "apt-get install etcd-server (make patroni)"),
                       (Path("/usr/bin/python3"), "apt-get install python3-venv python3-dev")):
        if not path.exists():
            raise FleetError(f"{path} is missing: {hint}")
    if shutil.which("setpriv") is None or shutil.which("unshare") is None:
        raise FleetError("setpriv and unshare (util-linux) are missing")
    if not Path(SYSTEMCTL).exists():  # the hosts' stand-in for systemd is mounted over it
        raise FleetError(f"{SYSTEMCTL} is missing: apt-get install systemd")
