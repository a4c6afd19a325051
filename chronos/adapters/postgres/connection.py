"""Connections to PostgreSQL as production runs it: one server, or a replicated cluster reached through a
libpq multi-host URL or an address that moves (a proxy, a virtual IP), any of which may die, fail over,
or hang without a word.

- `connect` opens a connection with TCP keepalives and `tcp_user_timeout` (a peer that stops
  acknowledging is given up by the kernel within seconds instead of about fifteen minutes), a connect
  timeout per host, `target_session_attrs=read-write` unless the URL says otherwise (a standby is passed
  over), and the hosts of a multi-host URL in an order that tries the one that just failed last.
- `Deadlines` gives every statement a client-side deadline. A server that hangs (a frozen VM, a network
  partition that drops packets) answers nothing, not even a cancel request, so past its deadline the
  connection is dropped: its socket is shut down under the waiting statement, which then fails at once
  like any broken connection. What the statement did is unknown: callers treat it as not done.
- `chronos.ports.Link`, kept by each store, is what metrics and logs say of its server: which one the
  connection reached, and how often the store reconnected, landed on another server, gave up a
  statement or found the server read-only.
- `translate` turns driver errors into the project's: the connection's trouble (`StoreUnavailable`, also
  for a server that became read-only, a demoted primary) apart from the data's (`StoreRejected`).

A store's connection, kept open and used under these rules, is `chronos.adapters.postgres.session.Session`.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from chronos.config import database_passwords, redact_url
from chronos.errors import StoreRefused, StoreRejected, StoreUnavailable, UnavailableError

log = logging.getLogger("chronos.store")

# Per host, unless the URL sets connect_timeout. With several hosts (a replicated cluster) a host that does
# not answer is passed over after libpq's floor of 2 s, so a hung member costs a reconnection little; a
# single server is given longer, which a loaded machine may need to start a backend.
CONNECT_TIMEOUT_S = 5
CONNECT_TIMEOUT_PER_HOST_S = 2

# Set on every connection unless the URL names them. A dead or partitioned peer: keepalive probes after 5 s
# idle, 3 unanswered 2 s apart; data sent and not acknowledged for 10 s (tcp_user_timeout) ends the
# connection too. A server that hangs but whose kernel still answers (SIGSTOP, a stuck process) passes
# both: the statement deadline covers that.
TCP_SETTINGS = {"keepalives": "1", "keepalives_idle": "5", "keepalives_interval": "2", "keepalives_count": "3",
                "tcp_user_timeout": "10000"}

# What libpq says when the server refused this client, rather than could not be reached: its
# authentication (a wrong password, no pg_hba.conf entry) and the TLS checks either side makes. A failed
# connection carries no SQLSTATE: the words are all there is.
_REFUSED = ("password authentication failed", "no pg_hba.conf entry", "pg_hba.conf rejects", "no password supplied",
            "certificate verify failed", "does not match host name", "root certificate file", "certificate file",
            "private key file", "SSL is not supported", "SSL was required", "sslmode value", "tlsv1 alert",
            "wrong version number")

# SQLSTATE classes of errors about the data a statement carried (a bad value, a constraint, a row too big,
# one id twice in an upsert): the same data fails again, other data may pass. Every other server error is
# about the server or the connection (read-only, out of disk, shutting down, permissions) and passes, if
# at all, with time: it never counts against a message.
_DATA_CLASSES = ("21", "22", "23", "54")
_READ_ONLY = "25006"          # read_only_sql_transaction: a standby, or a primary demoted under us
_PRIVILEGE = "42501"          # insufficient_privilege: the role's rights, not the data


def refused(exc: psycopg.Error) -> bool:
    """Whether a failed connection was a refusal of this client's credentials or TLS settings (or of the
    server's certificate by this client): something only new settings fix."""
    return any(words in str(exc) for words in _REFUSED)


def short(exc: BaseException, url: str | None = None) -> str:
    """A driver error in one line, without anything that might echo a password: libpq's errors can quote
    the connection string, or the piece of a badly escaped URL it choked on. A connection that tried
    several hosts says what each one answered."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    attempts = [line[2:] for line in lines if line.startswith("- host: ")]
    text = "; ".join(attempts) if len(attempts) > 1 else lines[0]
    return redact_url(text, database_passwords(url) if url else ())


def hosts_of(url: str) -> list[tuple[str, str]]:
    """(host, port) of each server a URL names, in its order (a port of '' is libpq's default)."""
    params = conninfo_to_dict(url)
    hosts = str(params.get("host") or "").split(",")
    ports = str(params.get("port") or "").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    return list(zip(hosts, ports)) if len(ports) == len(hosts) else []


def connect(url: str, *, autocommit: bool = True, application_name: str = "chronos", avoid: str | None = None,
            connect_timeout: int | None = None, prepared: bool = True) -> psycopg.Connection:
    """A connection to `url`: StoreRefused when PostgreSQL refuses this client (password, TLS),
    StoreUnavailable when no server can be reached or none is writable; both one line without the
    password. `avoid` ("host:port"), the server a connection just failed on, is tried last.
    `prepared=False` for a connection through a pooler in transaction mode (chronos.adapters.postgres.pooling):
    psycopg then prepares no statement by itself, however often it runs."""
    params = conninfo_to_dict(url)
    extra: dict[str, Any] = {k: v for k, v in TCP_SETTINGS.items() if k not in params}
    if not prepared:
        extra["prepare_threshold"] = None
    hosts = hosts_of(url)
    if connect_timeout is not None or "connect_timeout" not in params:
        extra["connect_timeout"] = connect_timeout or (CONNECT_TIMEOUT_PER_HOST_S if len(hosts) > 1 else
                                                       CONNECT_TIMEOUT_S)
    if "target_session_attrs" not in params:
        extra["target_session_attrs"] = "read-write"
    if "application_name" not in params:
        extra["application_name"] = application_name
    if avoid and len(hosts) > 1 and "hostaddr" not in params:
        hosts.sort(key=lambda hp: f"{hp[0]}:{hp[1]}" == avoid)  # stable: the others keep their order
        extra["host"] = ",".join(h for h, _ in hosts)
        extra["port"] = ",".join(p for _, p in hosts)
    try:
        return psycopg.connect(url, autocommit=autocommit, **extra)
    except psycopg.Error as exc:
        if refused(exc):
            raise StoreRefused(f"PostgreSQL at {redact_url(url)} refused the connection: {short(exc, url)}") from None
        raise StoreUnavailable(f"cannot connect to PostgreSQL at {redact_url(url)}: {short(exc, url)}") from None


def wait_for_database(url: str, timeout: float) -> None:
    """Block until PostgreSQL answers, or raise UnavailableError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        try:
            connect(url, connect_timeout=max(1, int(min(5, timeout)))).close()
            return
        except StoreUnavailable as exc:
            last = str(exc)
        if time.monotonic() >= deadline:
            raise UnavailableError(last)
        time.sleep(0.5)


def one(cursor: psycopg.Cursor) -> tuple[Any, ...]:
    """The row of a query that always returns exactly one (an aggregate, or a SELECT without FROM)."""
    row = cursor.fetchone()
    assert row is not None, "a single-row query returned no row"
    return row


def server_of(conn: psycopg.Connection) -> str:
    """The server a connection reached, as "host:port" (of the URL's host list: the address a client
    knows it by)."""
    info = conn.info
    return f"{info.host}:{info.port}"


def local_address(conn: psycopg.Connection) -> str:
    """This end's IP address of a connection to PostgreSQL (the host's address on the network toward the
    server); 127.0.0.1 over a Unix socket, which only a process on the server's own host uses."""
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return "127.0.0.1"
        return str(sock.getsockname()[0])


def translate(exc: psycopg.Error, url: str, server: str | None) -> StoreUnavailable | StoreRejected:
    """The project's error for a driver error raised by a statement: StoreRejected when PostgreSQL refused
    the data, else StoreUnavailable (the caller drops the connection when `connection_lost`)."""
    state = exc.sqlstate
    if state == _READ_ONLY:
        return StoreUnavailable(f"PostgreSQL at {server} is read-only (a standby, or a primary demoted in a "
                                f"failover): {short(exc, url)}")
    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
        return StoreUnavailable(short(exc, url))
    if state is None or state[:2] in _DATA_CLASSES or (state[:2] == "42" and state != _PRIVILEGE):
        return StoreRejected(short(exc, url))
    return StoreUnavailable(short(exc, url))


def connection_lost(exc: psycopg.Error) -> bool:
    """Whether the connection that raised `exc` is of no more use: broken, or on a read-only server."""
    return exc.sqlstate == _READ_ONLY or isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))


# -- statement deadlines ------------------------------------------------------------------------


@dataclass(order=True)
class _Watch:
    due: float                                   # monotonic
    number: int
    fd: int = field(compare=False)
    armed: bool = field(default=True, compare=False)
    fired: bool = field(default=False, compare=False)


class Deadlines:
    """One thread per process that drops connections whose statement outlived its deadline.

    `arm` before a statement, `disarm` after it, on the thread that owns the connection; a connection
    is only ever shut down while armed, under the lock `disarm` takes, so never after its owner moved on
    (and never a descriptor the system has since given to something else)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._heap: list[_Watch] = []
        self._numbers = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, conn: psycopg.Connection, seconds: float) -> _Watch:
        watch = _Watch(time.monotonic() + seconds, next(self._numbers), conn.pgconn.socket)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="postgres-deadlines", daemon=True)
                self._thread.start()
            first = not self._heap or watch < self._heap[0]
            heapq.heappush(self._heap, watch)
            if first:
                self._wake.notify()
        return watch

    def disarm(self, watch: _Watch) -> None:
        with self._lock:
            watch.armed = False  # left in the heap; popped when its time comes or sooner, see _run

    def _run(self) -> None:
        with self._lock:
            while True:
                heap = self._heap
                while heap and not heap[0].armed:
                    heapq.heappop(heap)
                if not heap:
                    self._wake.wait()
                    continue
                wait = heap[0].due - time.monotonic()
                if wait > 0:
                    self._wake.wait(wait)
                    continue
                watch = heapq.heappop(heap)
                watch.fired = True
                self._drop(watch.fd)

    @staticmethod
    def _drop(fd: int) -> None:
        """Shut the socket down for both directions: the statement waiting on it wakes with an error at
        once, and the server, when it answers again, finds the connection gone."""
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError as exc:
            log.warning("cannot drop a connection past its deadline: %s", exc)
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError as exc:  # already closed by the peer: the statement fails by itself
            log.debug("dropping a connection past its deadline: %s", exc)
        finally:
            sock.close()


DEADLINES = Deadlines()
