"""A fleet on one machine: Chronos on several hosts, a replicated PostgreSQL and a Kafka broker on
others, each host a network namespace on one bridge (harness.netns), and partitions between them.

    client      the load, the reader and every probe of the tests (the test process's own threads)
    etcd-1      etcd, Patroni's consensus store, on a host of its own (two members) ...
    db-1, db-2  Patroni members, each with its PostgreSQL (synchronous replication); with three
                members each runs an etcd member too, so a cut-off member leaves a quorum
    kafka-1     the broker, advertising its bridge address
    chronos-1 ...  Chronos hosts, installed as docs/operations/host-install.md says

A Chronos host is installed and run by the commands of the install page itself, as written, as root:
the blocks marked `<!-- fleet: release -->` and `<!-- fleet: once -->` (the system user, the virtual
environment from the wheel built from the checkout: one environment, shared by every host), `<!-- fleet:
host -->` (the shipped files) on each host, `<!-- fleet: migrate -->` (as the database's owner) on the
first; the block marked `<!-- fleet: start -->` is what runs supervisord on each host; `<!-- fleet:
check -->` runs on each host once it is up. What the page cannot give verbatim (the database's address
and passwords, the Kafka client's settings, the process counts) is the host's two environment files,
written here with the page's variables; the database's two roles are the production checklist's (an
owner, and the processes' role, which owns nothing). Each host has its own /etc/chronos, /run/chronos,
/var/log/chronos, /var/lib/chronos and /etc/hosts (bind mounts in the host's own mount namespace, made by
`ip netns exec`), its own /opt/chronos, where the environments installed once (`venv-<version>`) are
mounted and the link `venv` is the host's (during a rolling upgrade each host runs the release its link
names), and its own `systemctl`, a stand-in for systemd, which does not run there: a page's `systemctl
restart chronos` asks the kit to restart the host's supervisord (`Fleet._systemctl`).

Everything the fleet starts runs inside a namespace of its own prefix, so `close` (and the next
`start`, after a kit killed outright) ends it all.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from benchmarks.harness.netns import Network, NetworkError
from benchmarks.harness.stack import http_get

ROOT = Path(__file__).resolve().parents[2]
INSTALL_PAGE = ROOT / "docs" / "operations" / "host-install.md"
UPGRADE_PAGE = ROOT / "docs" / "operations" / "upgrading.md"
PATRONI_VENV = ROOT / ".patroni-venv"
ETCD = Path("/usr/bin/etcd")
PG_PORT, REST_PORT, ETCD_PORT, KAFKA_PORT, METRICS_PORT, PROMETHEUS_PORT = 5432, 8008, 2379, 9092, 9400, 9090
SCRAPE = ROOT / "monitoring" / "prometheus-scrape.yml"
ROLE_OFFSET = {"consumer": 0, "firer": 100, "detector": 200}
# what a host's mount namespace gives it of its own (mount point -> directory under the host's folder)
OWN_DIRS = {"/etc/chronos": "etc", "/run/chronos": "run", "/var/log/chronos": "log", "/var/lib/chronos": "home",
            "/etc/systemd/system": "systemd"}
SHARED_DIR = "/opt/chronos"
SYSTEMCTL = "/usr/bin/systemctl"  # a host's own is the fleet's stand-in for systemd (Fleet._systemctl)
SYSTEMCTL_REQUEST, SYSTEMCTL_REPLY = "systemctl.request", "systemctl.reply"  # its FIFOs, in the host's folder
APP_USER = APP_DATABASE = "chronos"
OWNER = "chronos_owner"  # the database's owner, which migrates; the processes run as APP_USER, which owns nothing
GROUP = "chronos"  # the hosts' consumer group (CHRONOS_CONSUMER_GROUP's default)
BLOCK = re.compile(r"^(?P<indent>[ \t]*)<!-- fleet: (?P<tag>[\w ]+) -->\n(?P=indent)```(?P<lang>sh|bash|yaml)\n(?P<code>.*?)\n"
                   r"(?P=indent)```", re.S | re.M)


class FleetError(RuntimeError):
    pass


def page_blocks(page: Path, tag: str, lang: tuple[str, ...] = ("sh", "bash")) -> list[str]:
    """The shell blocks (or blocks of `lang`) of `page` marked `<!-- fleet: TAG -->`, in page order."""
    blocks = [textwrap.dedent(m["code"]) for m in BLOCK.finditer(page.read_text())
              if m["tag"].strip() == tag and m["lang"] in lang]  # a block in a list item is indented with it
    if not blocks:
        raise FleetError(f"{page.relative_to(ROOT)} has no block marked <!-- fleet: {tag} -->")
    return blocks


def _write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)
    return path


def wait(condition: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        last = condition()
        if last:
            return last
        time.sleep(every)
    raise FleetError(f"{what}: not within {timeout:.0f}s (last: {last!r})")


# -- the hosts' file systems ----------------------------------------------------------------------


def mount_script(path: Path, binds: dict[str, Path]) -> Path:
    """A script that bind-mounts each directory (or file) on its place, then runs its arguments: run
    in a mount namespace of its own (`ip netns exec` makes one), the mounts are that host's alone."""
    lines = ["#!/bin/sh", "set -e"]
    lines += [f"mount --bind {shlex.quote(str(src))} {shlex.quote(target)}" for target, src in binds.items()]
    lines.append('exec "$@"')
    return _write(path, "\n".join(lines) + "\n", 0o755)


def mount_points(targets: list[str]) -> None:
    """The mount points must exist in the machine's own file system (empty directories are made)."""
    for target in targets:
        if target != "/etc/hosts":
            Path(target).mkdir(parents=True, exist_ok=True)


def build_wheel(workdir: Path, timeout: float = 600.0) -> Path:
    """The wheel `pip wheel` builds from a clean copy of the checkout: the files git tracks (and new files
    it does not ignore, symbolic links as links), so no build output of the working tree leaks in; the
    native codec is compiled by the build itself."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, text=True, check=True).stdout
    src, dist = workdir / "checkout", workdir / "dist"
    for name in filter(None, listed.split("\0")):
        origin, copy = ROOT / name, src / name
        if not origin.is_symlink() and not origin.exists():
            continue  # deleted in the working tree, not yet in git
        copy.parent.mkdir(parents=True, exist_ok=True)
        if origin.is_symlink():
            copy.symlink_to(os.readlink(origin))
        else:
            copy.write_bytes(origin.read_bytes())
    return _pip_wheel(src, dist, "*", timeout)


def _pip_wheel(src: Path, dist: Path, version: str, timeout: float) -> Path:
    """`pip wheel` of the source tree `src` into `dist`, with nothing of this test run's environment; the wheel."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CHRONOS_") and k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(dist),
                           str(src)], capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0:
        raise FleetError(f"pip wheel of {src} failed:\n{done.stdout}\n{done.stderr}")
    (built,) = dist.glob(f"chronos_scheduler-{version}-*.whl")
    return built


CHANGELOG = ROOT / "CHANGELOG.md"


def release_commit(version: str) -> str:
    """The commit a release was built from, as CHANGELOG.md records it under the release's heading."""
    section = re.search(rf"^## {re.escape(version)}\b.*?(?=^## |\Z)", CHANGELOG.read_text(), re.S | re.M)
    found = section and re.search(r"commit `([0-9a-f]{40})`", section[0])
    if not found:
        raise FleetError(f"CHANGELOG.md names no commit for release {version}")
    return found[1]


def previous_release() -> str:
    """The release before this checkout's, the second in CHANGELOG.md (newest first)."""
    versions = re.findall(r"^## (\d+\.\d+\.\d+)\b", CHANGELOG.read_text(), re.M)
    if len(versions) < 2:
        raise FleetError("CHANGELOG.md names no release before this one")
    return versions[1]


def release_wheel(version: str, workdir: Path, timeout: float = 600.0) -> Path:
    """The wheel of an earlier release, built by `pip wheel` from its commit's files (`git archive`), as a
    site that keeps its releases' wheels would have it."""
    commit = release_commit(version)
    known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    if known.returncode != 0:
        raise FleetError(f"release {version}'s commit {commit} is not in this clone (a shallow clone?): "
                         "clone the repository with its history")
    src, dist = workdir / f"release-{version}", workdir / "dist"
    src.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit], capture_output=True,
                             check=True, timeout=120).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True, timeout=120)
    return _pip_wheel(src, dist, version, timeout)


def wheel_version(wheel: Path) -> str:
    return wheel.name.split("-")[1]


def install_chronos(wheel: Path, opt_dir: Path, workdir: Path, *, timeout: float = 600.0) -> Path:
    """Install the package on the fleet's shared /opt/chronos as the install page says (its blocks
    marked `once`, after its `release`), from the directory that holds `wheel`, with the machine's network
    (the package registry). Returns the environment the page links as /opt/chronos/venv (here under `opt_dir`).

    A wheel of another release than the page's is installed by the upgrade page's `install beside`, with
    RELEASE its version, in an environment of its own beside the others, and the link is left as it was.

    pip also finds the wheels `make test` built into this venv's `wheelhouse` (psycopg-c, compiled against
    the same libpq): the page's command runs as written, as on a site with a wheelhouse, without a
    minute of compiling psycopg-c again."""
    from chronos import __version__ as page_version
    version = wheel_version(wheel)
    opt_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(opt_dir, 0o755)
    home = workdir / "install-home"
    home.mkdir(parents=True, exist_ok=True)
    binds = {SHARED_DIR: opt_dir, "/var/lib/chronos": home}
    mount_points(list(binds))
    script = mount_script(workdir / "install-mounts", binds)
    wheelhouse = _with_wheelhouse(Path(sys.prefix) / "wheelhouse")
    if version == page_version:
        (release,) = page_blocks(INSTALL_PAGE, "release")
        blocks, variables = [f"{release}\n{code}" for code in page_blocks(INSTALL_PAGE, "once")], {}
    else:  # the reader's one place for the release: the variable the upgrade page's blocks use
        blocks, variables = page_blocks(UPGRADE_PAGE, "install beside"), {"RELEASE": version}
    for code in blocks:
        if "useradd" in code and _user_exists("chronos"):
            continue  # one system user serves every host of this machine
        done = subprocess.run(["unshare", "--mount", "--propagation", "slave", str(script), "bash", "-euo",
                               "pipefail", "-c", code], cwd=wheel.parent, capture_output=True, text=True,
                              timeout=timeout, env=_plain_env(**wheelhouse, **variables))
        if done.returncode != 0:
            raise FleetError(f"the install page's block failed ({done.returncode}):\n{code}\n{done.stdout}\n{done.stderr}")
    if version != page_version:
        return opt_dir / f"venv-{version}"
    link = opt_dir / "venv"
    if not link.is_symlink():
        raise FleetError(f"the install page's blocks made no {SHARED_DIR}/venv")
    return opt_dir / os.readlink(link).removeprefix(SHARED_DIR + "/")


def _user_exists(name: str) -> bool:
    import pwd
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _with_wheelhouse(built: Path) -> dict[str, str]:
    """PIP_FIND_LINKS with `built` first, then the links this machine's pip has already (its environment's
    and its configuration's, which the variable would otherwise replace); {} without `built`."""
    if not built.is_dir():
        return {}
    configured = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"],
                                capture_output=True, text=True, timeout=60).stdout.split()
    links = dict.fromkeys([str(built), *os.environ.get("PIP_FIND_LINKS", "").split(), *configured])
    return {"PIP_FIND_LINKS": " ".join(links)}


def _tell(fifo: Path, text: str, timeout: float = 10.0) -> None:
    """Write `text` to a FIFO once its reader has it open (within `timeout`; a reader gone is not waited for
    longer)."""
    end = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:  # ENXIO: no reader yet
            if time.monotonic() > end:
                raise FleetError(f"nobody reads {fifo}: {exc}") from None
            time.sleep(0.05)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _as_user(user: tuple[int, int], argv: list[str]) -> list[str]:
    """`argv` run as `user` (uid, gid) with no supplementary groups."""
    return ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups", "--", *argv]


def _plain_env(**extra: str) -> dict[str, str]:
    """A root shell's environment: nothing of this test run's (its virtual environment, CHRONOS_*)."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8",
           "HOME": "/root"}
    if "TZ" in os.environ:
        env["TZ"] = os.environ["TZ"]
    return {**env, **extra}


# -- the servers ------------------------------------------------------------------------------------


@dataclass
class Proc:
    """A server the fleet started in a host."""

    name: str
    host: str
    popen: subprocess.Popen
    log: Path

    def tail(self, lines: int = 15) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


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
        role, num = program.rsplit("_", 1)
        return METRICS_PORT + ROLE_OFFSET[role] + int(num)


class Fleet:
    """The whole fleet; `start` builds and starts it, `close` ends and removes everything it made.

    `members` 2: etcd on a host of its own; 3: an etcd member on each PostgreSQL host. `per_host` is
    (consumers, firers, detectors) on each Chronos host. `settings` are more CHRONOS_* lines of every
    host's environment file (the hold time, say)."""

    def __init__(self, workdir: Path, opt_dir: Path, *, chronos_hosts: int = 2, per_host: tuple[int, int, int] = (1, 1, 1),
                 members: int = 2, partitions: int = 4, prefix: str = "chf", settings: dict[str, str] | None = None,
                 kafka_properties: dict[str, str] | None = None, release: str | None = None, archive: bool = False):
        if members not in (2, 3):
            raise FleetError(f"the fleet's PostgreSQL has 2 or 3 members, not {members}")
        self.workdir = Path(workdir).absolute()
        self.opt_dir = opt_dir
        self.net = Network(prefix)
        self.members = [f"db-{i + 1}" for i in range(members)]
        self.etcd_hosts = self.members if members == 3 else ["etcd-1"]
        self.chronos = [ChronosHost(f"chronos-{i + 1}", "", self.workdir / f"chronos-{i + 1}",
                                    dict(zip(("consumer", "firer", "detector"), per_host)))
                        for i in range(chronos_hosts)]
        self.partitions = partitions
        self.settings = settings or {}
        self.kafka_properties = kafka_properties or {}
        self.release = release  # the release every host runs at first (its environment's version); None: the link's
        # every member archives its finished WAL files here (Backups and restore), shared as a network file system would be
        self.archive = self.workdir / "wal-archive" if archive else None
        self.passwords = {role: secrets.token_hex(12) for role in ("superuser", "replication", "app", "owner")}
        self.console_token = f"fleet console {secrets.token_hex(8)}"
        self.procs: dict[str, Proc] = {}
        self.topics = {"input": "chronos.input", "output": "chronos.output", "dlq": "chronos.dlq"}
        self.systemd: list[threading.Thread] = []  # each host's stand-in for systemd (`_answer_systemctl`)

    # -- addresses -------------------------------------------------------------------------------

    def address(self, host: str) -> str:
        return self.net[host].address

    @property
    def bootstrap(self) -> str:
        """The broker, by address: for clients that run in the test process (which knows no host names)."""
        return f"{self.address('kafka-1')}:{KAFKA_PORT}"

    @property
    def database_url(self) -> str:
        """The application's multi-host URL by name, as the Chronos hosts have it (password in pgpass)."""
        hosts = ",".join(f"{m}:{PG_PORT}" for m in self.members)
        return f"postgresql://{APP_USER}@{hosts}/{APP_DATABASE}?target_session_attrs=read-write&connect_timeout=2"

    def url(self, *, admin: bool = False, member: str | None = None) -> str:
        """A URL by address with its password, for the test process (in the client host)."""
        user, password, db = (("postgres", self.passwords["superuser"], "postgres") if admin
                              else (APP_USER, self.passwords["app"], APP_DATABASE))
        hosts = ",".join(f"{self.address(m)}:{PG_PORT}" for m in ([member] if member else self.members))
        return (f"postgresql://{user}:{password}@{hosts}/{db}?connect_timeout=2"
                + ("" if member else "&target_session_attrs=read-write"))

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> None:
        t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.net.start()
        try:
            for name in ["client", *([] if self.etcd_hosts == self.members else self.etcd_hosts), *self.members,
                         "kafka-1", *(h.name for h in self.chronos)]:
                self.net.add(name)
            for host in self.chronos:
                host.address = self.address(host.name)
            _write(self.workdir / "hosts", self.net.hosts_file())
            self._start_etcd()
            self._start_members()
            self._start_broker()
            self.wait_leader(timeout=max(10.0, timeout - (time.monotonic() - t0)))
            self.wait_sync_standby(timeout=60)
            self._app_database()
            self._topics()
            for host in self.chronos:
                self._install_host(host)
            self._migrate()
            for host in self.chronos:
                self.start_host(host)
            for host in self.chronos:
                self.wait_host(host)
            self._start_prometheus()
        except BaseException:
            self.close()
            raise

    def close(self) -> list[str]:
        """End everything and delete the namespaces; what would not end."""
        for h in self.chronos:
            if (h.folder / SYSTEMCTL_REQUEST).exists():
                try:
                    _tell(h.folder / SYSTEMCTL_REQUEST, "close\n")
                except FleetError as exc:  # in the middle of a restart: the thread ends with the process
                    print(f"the stand-in for systemd of {h.name} did not stop: {exc}", file=sys.stderr)
        for thread in self.systemd:
            thread.join(10)
        running = [h for h in self.chronos if h.supervisord is not None and h.supervisord.poll() is None]
        if running:  # every host's supervisord stops its programs at the same time, as in a fleet
            with ThreadPoolExecutor(max_workers=len(running)) as pool:
                list(pool.map(lambda h: self.stop_host(h, timeout=20), running))
        stuck = self.net.close()
        for proc in self.procs.values():
            if proc.popen.poll() is None:
                proc.popen.kill()
            proc.popen.wait(5)
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

    # -- servers ---------------------------------------------------------------------------------

    def _spawn(self, name: str, host: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        log = self.workdir / "logs" / f"{name}.log"
        popen = subprocess.Popen(self.net.command(host, argv), stdin=subprocess.DEVNULL, stdout=open(log, "ab"),
                                 stderr=subprocess.STDOUT, env=env or _plain_env(), start_new_session=True)
        proc = self.procs[name] = Proc(name, host, popen, log)
        return proc

    def _start_etcd(self) -> None:
        cluster = ",".join(f"etcd-{h}=http://{self.address(h)}:{ETCD_PORT + 1}" for h in self.etcd_hosts)
        for host in self.etcd_hosts:
            a = self.address(host)
            data = self.workdir / host / "etcd"
            data.mkdir(parents=True, exist_ok=True)
            os.chmod(data, 0o700)
            self._spawn(f"etcd-{host}", host, [
                str(ETCD), "--name", f"etcd-{host}", "--data-dir", str(data),
                "--listen-client-urls", f"http://{a}:{ETCD_PORT}", "--advertise-client-urls", f"http://{a}:{ETCD_PORT}",
                "--listen-peer-urls", f"http://{a}:{ETCD_PORT + 1}",
                "--initial-advertise-peer-urls", f"http://{a}:{ETCD_PORT + 1}",
                "--initial-cluster", cluster, "--initial-cluster-state", "new", "--initial-cluster-token", "chronos-fleet",
                "--logger", "zap", "--log-outputs", "stderr"])

    def _start_members(self) -> None:
        from chronos.embedded.patroni import patroni_command
        from chronos.embedded.postgres import ensure_traversable, postgres_bin_dir, server_user
        user = server_user()
        if user is None:
            raise FleetError("the fleet runs as root (namespaces), so PostgreSQL has a user of its own")
        bin_dir, command = postgres_bin_dir(), patroni_command()
        ensure_traversable(bin_dir)
        ensure_traversable(command)
        if self.archive is not None:
            self.archive.mkdir(parents=True, exist_ok=True)
            os.chown(self.archive, *user)
        for name in self.members:
            self._start_member(name)

    def member_config(self, name: str, bootstrap: dict[str, Any] | None = None) -> Path:
        """Write the member's Patroni configuration (with a bootstrap method of `bootstrap`'s, for a cluster
        made from a backup); its path."""
        from chronos.embedded.patroni import patroni_config
        from chronos.embedded.postgres import ensure_traversable, postgres_bin_dir, server_user
        user = server_user()
        assert user is not None
        node = self.workdir / name / "pg"
        node.mkdir(parents=True, exist_ok=True)
        ensure_traversable(node)
        etcd = [f"{self.address(h)}:{ETCD_PORT}" for h in self.etcd_hosts]
        config = patroni_config(name=name, pg_port=PG_PORT, restapi_port=REST_PORT, etcd_port=ETCD_PORT,
                                node_dir=node, bin_dir=postgres_bin_dir(), passwords=self.passwords, ttl=20, loop_wait=1,
                                retry_timeout=4, strict=False, fast=True, host=self.address(name),
                                etcd_hosts=etcd, clients=str(self.net.net))
        if self.archive is not None:
            config["postgresql"]["parameters"].update(
                archive_mode="on", archive_command=f"test ! -f {self.archive}/%f && cp %p {self.archive}/%f")
        if bootstrap is not None:
            config["bootstrap"].update(bootstrap)
        path = node / "patroni.yml"
        _write(path, json.dumps(config, indent=2), 0o600)
        for p in (node, path):
            os.chown(p, *user)
        os.chmod(node, 0o700)
        return path

    def _start_member(self, name: str, bootstrap: dict[str, Any] | None = None) -> None:
        from chronos.embedded.patroni import patroni_command
        from chronos.embedded.postgres import server_user
        user = server_user()
        assert user is not None
        path = self.member_config(name, bootstrap)
        self._spawn(name, name, _as_user(user, [str(patroni_command()), str(path)]),
                    _plain_env(HOME=str(path.parent), LC_ALL="C"))

    def as_server_user(self, host: str, argv: list[str], *, timeout: float = 120.0,
                       input: str | None = None) -> subprocess.CompletedProcess:
        """A command run in `host`'s network as PostgreSQL's user (the members' files are its)."""
        from chronos.embedded.postgres import server_user
        user = server_user()
        assert user is not None
        return subprocess.run(self.net.command(host, _as_user(user, argv)), capture_output=True, text=True,
                              timeout=timeout, input=input, env=_plain_env(HOME=str(self.workdir), LC_ALL="C"), cwd="/")

    # -- backups and a restore into a fresh cluster (Backups and restore) ------------------------------

    def base_backup(self, dest: Path) -> None:
        """`pg_basebackup` of the leader, from the client host, as the replication user."""
        from chronos.embedded.patroni import REPLICATION_USER
        from chronos.embedded.postgres import postgres_bin_dir
        leader = self.leader()
        if leader is None:
            raise FleetError("no leader to back up")
        done = self.as_server_user("client", [
            "env", f"PGPASSWORD={self.passwords['replication']}", str(postgres_bin_dir() / "pg_basebackup"),
            "--host", self.address(leader), "--port", str(PG_PORT), "--username", REPLICATION_USER,
            "--pgdata", str(dest), "--checkpoint=fast", "--wal-method=stream"])
        if done.returncode != 0:
            raise FleetError(f"pg_basebackup failed: {done.stderr}")

    def stop_members(self, timeout: float = 60.0) -> None:
        """Patroni stopped on every member (its PostgreSQL with it), as `systemctl stop patroni` does."""
        for name in self.members:
            self.procs[name].popen.terminate()
        for name in self.members:
            self.procs[name].popen.wait(timeout)

    def patronictl(self, member: str, *args: str, input: str | None = None) -> str:
        from chronos.embedded.patroni import patroni_command
        ctl = patroni_command().parent / "patronictl"
        done = self.as_server_user(member, [str(ctl), "-c", str(self.workdir / member / "pg" / "patroni.yml"), *args],
                                   input=input)
        if done.returncode != 0:
            raise FleetError(f"patronictl {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout

    def restore_cluster(self, bootstrap: dict[str, Any], timeout: float = 120.0) -> str:
        """A fresh cluster made from a backup, as Backups and restore says for Patroni: every member
        stopped, the cluster's keys removed from etcd, every data directory moved aside, the first member
        started with `bootstrap` (a method that makes its data directory from the backup and replays the
        archive), the others once it leads (each copies it). The leader."""
        from chronos.embedded.patroni import SCOPE
        self.stop_members()
        self.patronictl(self.members[0], "remove", SCOPE, input=f"{SCOPE}\nYes I am aware\n")
        for name in self.members:
            data = self.workdir / name / "pg" / "data"
            if data.exists():
                data.rename(data.with_name(f"data.before-restore-{int(time.time())}"))
        self._start_member(self.members[0], bootstrap)
        leader, _ = self.wait_leader(timeout=timeout)
        for name in self.members[1:]:
            self._start_member(name)
        self.wait_sync_standby(timeout=timeout)
        return leader

    def _start_broker(self) -> None:
        from chronos.embedded.broker import BROKER_STORAGE, broker_bin
        listener = f"tcp://{self.bootstrap}"
        self._spawn("kafka-1", "kafka-1", [broker_bin(), "broker", "--listener-url", listener,
                                           "--advertised-listener-url", listener, "--storage-engine", BROKER_STORAGE],
                    _plain_env(RUST_LOG="warn", NO_COLOR="1"))

    def _topics(self) -> None:
        from chronos.adapters.kafka.admin import create_topics
        with self.net.inside("client"):
            wait(lambda: self._broker_answers(), 30, "the broker answering")
            create_topics(self.bootstrap, {t: self.partitions for t in self.topics.values()})

    def _broker_answers(self) -> bool:
        from confluent_kafka.admin import AdminClient
        try:
            AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=2)
            return True
        except Exception:  # noqa: BLE001 - not up yet: asked again
            return False

    # -- Patroni, as the client host sees it --------------------------------------------------------

    def rest(self, member: str, path: str, timeout: float = 2.0) -> Any:
        """A member's REST API answer (decoded JSON), asked from the client host; None when it does not answer."""
        with self.net.inside("client"):
            status, body = http_get(f"http://{self.address(member)}:{REST_PORT}{path}", timeout)
        if status == 0:
            return None
        try:
            return json.loads(body)
        except ValueError:
            return None

    def cluster(self, exclude: tuple[str, ...] = ()) -> list[dict[str, Any]] | None:
        for member in self.members:
            if member in exclude:
                continue
            answer = self.rest(member, "/cluster", timeout=1.0)
            if isinstance(answer, dict):
                return list(answer.get("members", []))
        return None

    def leader(self, exclude: tuple[str, ...] = ()) -> str | None:
        """The member whose PostgreSQL is the writable leader, as the members that answer (not `exclude`) say."""
        for m in self.cluster(exclude) or []:
            if m.get("role") == "leader" and m.get("state") == "running" and m["name"] not in exclude:
                answer = self.rest(m["name"], "/patroni", timeout=1.0)
                if isinstance(answer, dict) and answer.get("role") == "primary" and answer.get("state") == "running":
                    return m["name"]
        return None

    def wait_leader(self, not_name: str | None = None, timeout: float = 90.0) -> tuple[str, float]:
        """(leader, when it was first seen so) once a member other than `not_name` leads and takes writes."""
        exclude = (not_name,) if not_name else ()
        name = wait(lambda: self.leader(exclude), timeout, f"a leader other than {not_name}" if not_name else "a leader",
                    every=0.05)
        return name, time.time()

    def sync_standby(self) -> str | None:
        for m in self.cluster() or []:
            if m.get("role") == "sync_standby" and m.get("state") == "streaming":
                return m["name"]
        return None

    def wait_sync_standby(self, timeout: float = 90.0) -> str:
        return wait(self.sync_standby, timeout, "a synchronous standby streaming", every=0.2)

    def _app_database(self) -> None:
        """The database and its two roles, as the production checklist's least-privilege role says: the owner,
        which migrates, and the application's, which reads and writes the rows of the owner's tables."""
        import psycopg
        from psycopg import sql
        owner, app = sql.Identifier(OWNER), sql.Identifier(APP_USER)
        with self.net.inside("client"):
            with psycopg.connect(self.url(admin=True), autocommit=True) as conn:
                for role, password in ((owner, self.passwords["owner"]), (app, self.passwords["app"])):
                    conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(role, sql.Literal(password)))
                conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(APP_DATABASE), owner))
                conn.execute(sql.SQL("GRANT CONNECT, TEMPORARY ON DATABASE {} TO {}").format(
                    sql.Identifier(APP_DATABASE), app))
            with psycopg.connect(self.url(admin=True).replace("/postgres?", f"/{APP_DATABASE}?"),
                                 autocommit=True) as conn:
                conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(app))
                conn.execute(sql.SQL("ALTER DEFAULT PRIVILEGES FOR ROLE {} IN SCHEMA public "
                                     "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {}").format(owner, app))

    # -- Chronos hosts ------------------------------------------------------------------------------

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
        binds[SYSTEMCTL] = self._systemctl(host)
        return mount_script(host.folder / "mounts", binds)

    # -- systemd's stand-in: systemd is not PID 1 on the fleet's hosts -----------------------------------

    def _systemctl(self, h: ChronosHost) -> Path:
        """The host's `systemctl`, mounted over the machine's in the host's own mount namespace, so that a
        page's `systemctl restart chronos` runs as written: it asks the kit (`_answer_systemctl`), which does
        to the host's supervisord what systemd does with chronos.service; anything else fails, saying so."""
        request, reply = h.folder / SYSTEMCTL_REQUEST, h.folder / SYSTEMCTL_REPLY
        for fifo in (request, reply):
            if not fifo.exists():
                os.mkfifo(fifo, 0o600)
        return _write(h.folder / "systemctl", f"""#!/bin/sh
# systemd's stand-in on a host of the fleet (benchmarks/harness/fleet.py), where systemd is not PID 1
if [ "$#" -ne 2 ] || [ "$1" != restart ] || [ "${{2%.service}}" != chronos ]; then
    echo "systemctl $*: the fleet's stand-in for systemd knows only restart chronos" >&2
    exit 1
fi
echo "$1" > {shlex.quote(str(request))}
read -r status < {shlex.quote(str(reply))}
exit "$status"
""", 0o755)

    def _answer_systemctl(self, h: ChronosHost) -> None:
        """Answer the host's `systemctl` stand-in until `close` (on a thread of its own): `restart chronos` is
        `restart_host`, which stops supervisord (its programs gracefully) and starts it again, as systemd does."""
        while True:
            with open(h.folder / SYSTEMCTL_REQUEST) as fifo:  # until the stand-in (or `close`) writes
                verb = fifo.read().strip()
            if verb == "close":
                return
            try:
                self.restart_host(h)
                status = 0
            except Exception as exc:  # noqa: BLE001 - the stand-in's caller gets the failure, as systemctl's would
                print(f"systemctl {verb} chronos on {h.name}: {exc}", file=sys.stderr, flush=True)
                status = 1
            _tell(h.folder / SYSTEMCTL_REPLY, f"{status}\n", timeout=30.0)

    def on(self, host: ChronosHost | str, script: str, *, timeout: float = 120.0, check: bool = True,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run a bash script as root on a Chronos host (its network, its own directories)."""
        h = self.host(host)
        argv = self.net.command(h.name, [str(h.folder / "mounts"), "bash", "-euo", "pipefail", "-c", script])
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env or _plain_env(),
                              cwd="/")
        if check and done.returncode != 0:
            raise FleetError(f"on {h.name}, ({done.returncode}):\n{script}\n{done.stdout}\n{done.stderr}")
        return done

    def host(self, host: ChronosHost | str) -> ChronosHost:
        if isinstance(host, ChronosHost):
            return host
        return next(h for h in self.chronos if h.name == host)

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
            "CHRONOS_DATABASE_URL": self.database_url,
            "PGPASSFILE": "/etc/chronos/pgpass",
            "CHRONOS_KAFKA_BOOTSTRAP_SERVERS": f"kafka-1:{KAFKA_PORT}",
            "CHRONOS_KAFKA_PROPERTIES_FILE": "/etc/chronos/kafka.properties",
            "CHRONOS_METRICS_PORT": str(METRICS_PORT),
            # a secret with a space, as a quoted value: no command line may show it, every process gets it whole
            "CHRONOS_CONSOLE_TOKEN": self.console_token,
            **self.settings,
        }

    def _install_host(self, host: ChronosHost) -> None:
        from chronos.adapters.kafka.clients import EMBEDDED_PROFILE
        self.mounts(host)
        answer = threading.Thread(target=self._answer_systemctl, args=(host,), name=f"systemctl {host.name}",
                                  daemon=True)
        answer.start()
        self.systemd.append(answer)
        for code in page_blocks(INSTALL_PAGE, "host"):
            self.on(host, code)
        host.env = self.environment(host)
        env_text = "".join(f"{k}={shlex.quote(v)}\n" for k, v in host.env.items())
        owner_text = "".join(f"{k}={shlex.quote(v)}\n" for k, v in (
            ("CHRONOS_DATABASE_URL", self.database_url.replace(f"//{APP_USER}@", f"//{OWNER}@")),
            ("PGPASSWORD", self.passwords["owner"])))
        props = {**EMBEDDED_PROFILE, **self.kafka_properties}
        self.on(host, "install -o chronos -g chronos -m 0600 /dev/null /etc/chronos/pgpass\n"
                      f"echo '*:{PG_PORT}:{APP_DATABASE}:{APP_USER}:{self.passwords['app']}' > /etc/chronos/pgpass\n"
                      "install -o chronos -g chronos -m 0600 /dev/null /etc/chronos/kafka.properties\n"
                      f"cat > /etc/chronos/kafka.properties <<'EOF'\n"
                      + "".join(f"{k}={v}\n" for k, v in props.items()) + "EOF\n"
                      "install -m 0600 /dev/null /etc/chronos/env\n"
                      f"cat > /etc/chronos/env <<'EOF'\n{env_text}EOF\n"
                      "install -m 0600 /dev/null /etc/chronos/owner.env\n"
                      f"cat > /etc/chronos/owner.env <<'EOF'\n{owner_text}EOF\n")

    def _migrate(self) -> None:
        """The install page's migration, as the database's owner, from the first host."""
        (code,) = page_blocks(INSTALL_PAGE, "migrate")
        self.on(self.chronos[0], code)

    def chronos_function(self) -> str:
        """The shell functions of the install page (`chronos`, `supervisorctl`), as a script's first lines."""
        code = page_blocks(INSTALL_PAGE, "check")[0]
        return "\n".join(line for line in code.splitlines() if re.match(r"^\w+\(\) [{(]", line)) + "\n"

    def start_host(self, host: ChronosHost | str) -> None:
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
                                         stderr=subprocess.STDOUT, env=_plain_env(), cwd="/", start_new_session=True)

    def wait_host(self, host: ChronosHost | str, timeout: float = 60.0) -> None:
        """Until every program of the host has logged its start since `start_host`."""
        h = self.host(host)

        def started() -> bool:
            if h.supervisord is not None and h.supervisord.poll() is not None:
                raise FleetError(f"supervisord of {h.name} exited ({h.supervisord.returncode})")
            return all(h.log(p).count("starting: node") > h.starts.get(p, 0) for p in h.programs())
        wait(started, timeout, f"the programs of {h.name} started ({ {p: h.log(p)[-300:] for p in h.programs()} })")

    def stop_host(self, host: ChronosHost | str, timeout: float = 60.0) -> int | None:
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

    def restart_host(self, host: ChronosHost | str, timeout: float = 60.0) -> None:
        """What `systemctl restart chronos` does to the host: supervisord stopped (its programs gracefully),
        then started again, here until every program has logged its start. On the embedded broker its
        consumers leave the group one at a time first (`leave_group_one_at_a_time`)."""
        h = self.host(host)
        self.leave_group_one_at_a_time(h)
        self.stop_host(h, timeout=timeout)
        self.start_host(h)
        self.wait_host(h, timeout=timeout)

    def group_state(self) -> str:
        """The consumer group's state on the broker (STABLE, EMPTY, ...: ConsumerGroupState's names), asked
        from the client host."""
        from confluent_kafka.admin import AdminClient
        with self.net.inside("client"):
            admin = AdminClient({"bootstrap.servers": self.bootstrap})
            try:
                (future,) = admin.describe_consumer_groups([GROUP], request_timeout=5).values()
                described = future.result()
            except Exception as exc:  # noqa: BLE001 - an answer of its own: asked again by the caller
                return f"no answer ({exc})"
        return described.state.name

    def wait_group_settled(self, timeout: float = 30.0) -> str:
        """Until the consumer group is STABLE (its members hold their partitions) or EMPTY (no member)."""
        return wait(lambda: (state := self.group_state()) in ("STABLE", "EMPTY") and state, timeout,
                    "the consumer group settled")

    def leave_group_one_at_a_time(self, host: ChronosHost | str) -> None:
        """Stop the host's consumers one after another, each once the group has settled: the embedded
        broker (Tansu 0.6.0) keeps a leader that leaves while the group rebalances as its leader for ever,
        so that no member gets a partition again (docs/explanations/embedded-broker.md, behaviour 8). A
        Kafka cluster has no such need; an operator's `systemctl stop` stops them together."""
        h = self.host(host)
        for i in range(h.counts["consumer"]):
            self.wait_group_settled()
            self.supervisorctl(h, "stop", f"consumer:consumer_{i:02d}")
        self.wait_group_settled()

    def run_block(self, host: ChronosHost | str, code: str, *, timeout: float = 240.0,
                  variables: dict[str, str] | None = None) -> str:
        """A page's block on a host, as written, with the install page's shell functions and the `variables`
        the page has its reader set (its `systemctl restart chronos` reaches the host's stand-in for systemd).
        Its output."""
        return self.on(host, self.chronos_function() + code, timeout=timeout,
                       env=_plain_env(**(variables or {}))).stdout

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

    def supervisorctl(self, host: ChronosHost | str, *args: str, check: bool = True) -> str:
        """The install page's `supervisorctl` function, on the host."""
        return self.on(host, self.chronos_function() + "supervisorctl " + " ".join(map(shlex.quote, args)),
                       check=check).stdout

    def health(self, host: ChronosHost | str, program: str, timeout: float = 1.0) -> tuple[int, dict[str, Any]]:
        """A program's /healthz, asked from the client host: (status, report); (0, {}) when it does not answer."""
        h = self.host(host)
        with self.net.inside("client"):
            status, body = http_get(f"http://{h.address}:{h.metrics_port(program)}/healthz", timeout)
        try:
            return status, json.loads(body) if body else {}
        except ValueError:
            return status, {}

    # -- monitoring: Prometheus on the client host, with the shipped alert rules -------------------------

    def _start_prometheus(self) -> None:
        """Prometheus on the client host with the shipped configuration (monitoring/prometheus-scrape.yml, its
        alert rules, its file-based discovery: a targets file per Chronos host, as the shipped examples
        are written), scraping and evaluating every 2 s instead of 15, when a `prometheus` is at hand (on
        PATH or beside this Python, where `make test` puts it); without one, no alerts are read."""
        binary = shutil.which("prometheus") or str(Path(sys.executable).parent / "prometheus")
        if not os.access(binary, os.X_OK):
            return
        folder = self.workdir / "prometheus"
        for h in self.chronos:
            groups = [{"targets": [f"{h.address}:{h.metrics_port(f'{role}_{i:02d}')}"
                                   for i in range(max(h.counts[role], 1))],
                       "labels": {"host": h.name, "program": role}} for role in ROLE_OFFSET]
            _write(folder / "chronos-targets" / f"{h.name}.yml", json.dumps(groups, indent=2))
        import yaml  # a dev dependency, like the benchmarks
        config = yaml.safe_load(SCRAPE.read_text())
        config["global"].update(scrape_interval="2s", scrape_timeout="1s", evaluation_interval="2s")
        config["rule_files"] = [str(SCRAPE.parent / f) for f in config["rule_files"]]
        _write(folder / "prometheus.yml", json.dumps(config, indent=2))
        self._spawn("prometheus", "client", [binary, f"--config.file={folder / 'prometheus.yml'}",
                                             f"--storage.tsdb.path={folder / 'data'}", "--log.level=warn",
                                             f"--web.listen-address={self.address('client')}:{PROMETHEUS_PORT}"])
        wait(lambda: self._prometheus("/-/ready") is not None, 30, "Prometheus ready")

    def _prometheus(self, path: str) -> Any:
        if "prometheus" not in self.procs:
            return None
        with self.net.inside("client"):
            status, body = http_get(f"http://{self.address('client')}:{PROMETHEUS_PORT}{path}", 5.0)
        if status != 200:
            return None
        try:
            return json.loads(body)
        except ValueError:
            return body

    def alerts(self, since: float, until: float, zero: float) -> dict[str, dict[str, Any]] | None:
        """The shipped rules' alerts between two times, as Prometheus evaluated them: alert name -> when
        (seconds after `zero`) it was first pending and first firing, and `before: True` for one already
        active at `since` (left by an earlier fault); None without Prometheus."""
        if "prometheus" not in self.procs:
            return None
        answer = self._prometheus(f"/api/v1/query_range?query=ALERTS&start={since:.3f}&end={until:.3f}&step=2")
        out: dict[str, dict[str, Any]] = {}
        for series in (answer or {}).get("data", {}).get("result", []):
            name, state = series["metric"].get("alertname", "?"), series["metric"].get("alertstate", "?")
            first = min(float(t) for t, _ in series["values"])
            seen = out.setdefault(name, {})
            seen[state] = round(min(seen.get(state, first - zero), first - zero), 1)
            if first <= since + 2.0:  # the first evaluation step of the window: it was active already
                seen["before"] = True
        return dict(sorted(out.items()))

    def scrape_gaps(self, since: float, until: float) -> dict[str, float]:
        """The targets Prometheus could not scrape between two times: target -> seconds it was down."""
        if "prometheus" not in self.procs:
            return {}
        answer = self._prometheus(f"/api/v1/query_range?query=up%3D%3D0&start={since:.3f}&end={until:.3f}&step=2")
        return {s["metric"]["instance"]: 2.0 * len(s["values"]) for s in (answer or {}).get("data", {}).get("result", [])}

    # -- partitions ----------------------------------------------------------------------------------

    def cut(self, host: str, peers: list[str] | None = None, **how: bool) -> float:
        """Cut `host` off (harness.netns.Network.cut); when (time.time())."""
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
        self.wait_leader(timeout=timeout)
        self.wait_sync_standby(timeout=timeout)
        for h in self.chronos:
            if h.supervisord is None or h.supervisord.poll() is not None:
                self.start_host(h)
                self.wait_host(h)


def require_fleet_tools() -> None:
    """What the fleet needs on this machine, or a FleetError that says what to install."""
    from benchmarks.harness.netns import require_tools
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
