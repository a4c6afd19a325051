"""Hosts of their own on one machine: network namespaces on a bridge, and real partitions between them.

Each host is a network namespace with one interface (`eth0`), an address of its own on a private
subnet and a name; the bridge that joins them lives in a namespace of its own (the switch), so nothing
of the machine's own network is used and nothing outside the namespaces made here is ever addressed.
A partition is an nftables table inside a host's namespace that drops packets silently (no RST, no
ICMP: the peer hears nothing, as from a frozen VM or a cut cable), both ways or one way, from every
peer or from some; deleting the table heals it.

Processes run in a host with `ip netns exec`. The test process itself goes to a host for a while with
`Network.inside(host)`: only the calling thread moves (setns), and the threads and Kafka clients it
starts meanwhile stay there, so a load generator or a reader is a client on the bridge like any other.

Deleting a namespace does not end the processes in it: `close` ends every process of every host
first (`ip netns pids`), then deletes the namespaces. A kit that was killed outright leaves both
behind; the next `start` with the same prefix removes them. Needs root, iproute2 and nftables.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import ipaddress
import os
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

CLONE_NEWNET = 0x40000000
SUBNET = "198.18.7.0/24"  # RFC 2544's range for network tests: never a real peer of this machine
TABLE = "chronos_partition"
_libc = ctypes.CDLL(None, use_errno=True)


class NetworkError(RuntimeError):
    pass


def _run(*argv: str, check: bool = True, timeout: float = 30.0, stdin: str | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=stdin)
    if check and done.returncode != 0:
        raise NetworkError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return done


def require_tools() -> None:
    """Root, `ip` and `nft`, or a NetworkError that says what is missing."""
    if os.geteuid() != 0:
        raise NetworkError("hosts as network namespaces need root")
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            raise NetworkError(f"{tool} is not installed: apt-get install {package} (make test installs it)")


def namespaces() -> list[str]:
    """Names of the network namespaces `ip netns` knows."""
    return [line.split()[0] for line in _run("ip", "netns", "list").stdout.splitlines() if line.strip()]


def pids_in(ns: str) -> list[int]:
    """Every process whose network namespace is `ns`."""
    done = _run("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def end_processes(ns: str, grace: float = 5.0) -> list[int]:
    """SIGTERM every process of namespace `ns`, SIGKILL what is left after `grace` seconds; those that
    survive SIGKILL too (none should)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        pids = pids_in(ns)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        end = time.monotonic() + wait
        while pids_in(ns) and time.monotonic() < end:
            time.sleep(0.05)
    return pids_in(ns)


@dataclass(frozen=True)
class Host:
    """One host: its name (also in every host's /etc/hosts), address and namespace."""

    name: str
    address: str
    ns: str


# One prefix per checkout: a kit removes what an earlier kit of its prefix left, so two checkouts' suites
# running at once on one machine would otherwise delete each other's hosts.
PREFIX = "ch" + hashlib.sha256(os.fsencode(Path(__file__).resolve().parents[1])).hexdigest()[:4]


class Network:
    """Hosts on one bridge, all in namespaces named `<prefix>-...`."""

    def __init__(self, prefix: str = PREFIX, subnet: str = SUBNET):
        self.prefix = prefix
        self.net = ipaddress.ip_network(subnet)
        self.switch = f"{prefix}-switch"
        self.hosts: dict[str, Host] = {}
        self._next = 10
        self._cut: set[str] = set()  # hosts with a cut in place

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        """The switch: a namespace with a bridge, after removing what an earlier kit of this prefix left."""
        require_tools()
        self.remove_leftovers()
        _run("ip", "netns", "add", self.switch)
        self._in(self.switch, "ip", "link", "add", "br0", "type", "bridge")
        self._in(self.switch, "ip", "link", "set", "br0", "up")

    def remove_leftovers(self) -> list[str]:
        """End the processes of, and delete, every namespace of this prefix: a kit killed outright
        leaves them. The names removed."""
        left = [ns for ns in namespaces() if ns.startswith(f"{self.prefix}-")]
        for ns in left:
            end_processes(ns, grace=2.0)
            _run("ip", "netns", "del", ns, check=False)
        return left

    def add(self, name: str) -> Host:
        """A new host on the bridge, with the next free address."""
        if name in self.hosts:
            raise NetworkError(f"host {name} exists")
        index = self._next
        self._next += 1
        address = str(self.net.network_address + index)
        host = Host(name, address, f"{self.prefix}-{name}")
        port = f"p{index}"  # the switch's side of the pair; interface names are short
        _run("ip", "netns", "add", host.ns)
        try:
            _run("ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", host.ns)
            _run("ip", "link", "set", port, "netns", self.switch)
            self._in(self.switch, "ip", "link", "set", port, "master", "br0", "up")
            self._in(host.ns, "ip", "link", "set", "lo", "up")
            self._in(host.ns, "ip", "addr", "add", f"{address}/{self.net.prefixlen}", "dev", "eth0")
            self._in(host.ns, "ip", "link", "set", "eth0", "up")
        except BaseException:
            _run("ip", "netns", "del", host.ns, check=False)
            raise
        self.hosts[name] = host
        return host

    def close(self) -> list[str]:
        """End every process of every host and delete the namespaces; what could not be ended."""
        hosts = list(self.hosts.values())
        # every host's processes ended at the same time: one grace period, not one per host
        with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
            left = list(pool.map(lambda h: end_processes(h.ns), hosts))
        stuck = [f"{host.name}: pids {pids}" for host, pids in zip(hosts, left) if pids]
        for host in hosts:
            _run("ip", "netns", "del", host.ns, check=False)
        self.hosts.clear()
        end_processes(self.switch, grace=1.0)
        _run("ip", "netns", "del", self.switch, check=False)
        return stuck

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    # -- names ----------------------------------------------------------------------------------

    def hosts_file(self) -> str:
        """An /etc/hosts for every host: localhost and each host by name."""
        lines = ["127.0.0.1\tlocalhost"]
        lines += [f"{h.address}\t{h.name}" for h in self.hosts.values()]
        return "\n".join(lines) + "\n"

    # -- running things in a host ------------------------------------------------------------------

    def command(self, host: str | Host, argv: Sequence[str]) -> list[str]:
        """`argv` as run in `host`'s namespace."""
        ns = host.ns if isinstance(host, Host) else self.hosts[host].ns
        return ["ip", "netns", "exec", ns, *argv]

    def _in(self, ns: str, *argv: str) -> subprocess.CompletedProcess:
        return _run("ip", "netns", "exec", ns, *argv)

    @contextlib.contextmanager
    def inside(self, host: str) -> Iterator[Host]:
        """Move the calling thread into `host`'s network for the block: its sockets, and the threads it
        starts (Kafka clients' included), are that host's. The thread comes back at the end; what it
        made there stays there."""
        target = self.hosts[host]
        back = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            _setns(f"/run/netns/{target.ns}")
            try:
                yield target
            finally:
                if _libc.setns(back, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns back from {target.ns} ({threading.current_thread().name})")
        finally:
            os.close(back)

    # -- partitions ---------------------------------------------------------------------------------

    def cut(self, host: str, peers: Sequence[str] | None = None, *, inbound: bool = True,
            outbound: bool = True) -> None:
        """Drop `host`'s packets silently: from and to every peer (`peers` None) or only the named
        ones; `inbound=False` lets what arrives through (a one-way loss of what `host` sends),
        `outbound=False` lets what it sends through. Replaces a cut the host already has."""
        if not (inbound or outbound):
            raise NetworkError("a cut drops something: inbound, outbound or both")
        if peers is not None:
            addresses = ", ".join(self.hosts[p].address for p in peers)
            match_in, match_out = f"ip saddr {{ {addresses} }} drop", f"ip daddr {{ {addresses} }} drop"
        else:
            match_in = match_out = "drop"
        rules = [f"table inet {TABLE} {{",
                 "  chain input { type filter hook input priority 0; policy accept;",
                 '    iif "lo" accept', f"    {match_in if inbound else ''}", "  }",
                 "  chain output { type filter hook output priority 0; policy accept;",
                 '    oif "lo" accept', f"    {match_out if outbound else ''}", "  }", "}"]
        self.heal(host)
        _run("ip", "netns", "exec", self.hosts[host].ns, "nft", "-f", "-", stdin="\n".join(rules) + "\n")
        self._cut.add(host)

    def heal(self, host: str) -> None:
        """Remove `host`'s cut, if it has one."""
        ns = self.hosts[host].ns
        if _run("ip", "netns", "exec", ns, "nft", "list", "table", "inet", TABLE, check=False).returncode == 0:
            _run("ip", "netns", "exec", ns, "nft", "delete", "table", "inet", TABLE)
        self._cut.discard(host)

    def heal_all(self) -> None:
        for host in list(self._cut):
            self.heal(host)


def _setns(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)
