"""How `chronos up` runs the console beside its programs (no web framework imported here).

`chronos up` binds the console's socket itself and hands it to a `chronos console` child, so a
taken port is found before anything starts and never raced for. The console's rates and
lateness come from the programs' /metrics (chronos.telemetry.endpoints: when CHRONOS_METRICS_PORT is not
set, `chronos up` picks a base port whose every program port is free).
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Mapping

from chronos import config

from chronos.runtime import orphans
from chronos.config import Settings
from chronos.console import INSTALL_HINT, missing_extra
from chronos.errors import ConfigError

log = logging.getLogger("chronos.up")

def listen_socket(host: str, port: int) -> socket.socket:
    """A listening socket for the console, or a one-line configuration error when the address is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"the console cannot listen on {host}:{port} (CHRONOS_CONSOLE_PORT): {exc.strerror}") \
            from None
    sock.listen(128)
    return sock


class ConsoleProcess:
    """The `chronos console` child of `chronos up`."""

    def __init__(self, settings: Settings, log_dir: Path, *, port_chosen: bool):
        self.settings = settings
        self.log_path = log_dir / "console.log"
        self.port_chosen = port_chosen  # the user named the port: a taken one is an error, not a fallback
        self.sock: socket.socket | None = None
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None

    @staticmethod
    def available() -> str | None:
        """Why the console cannot run here (its extra is missing), or None."""
        missing = missing_extra()
        return None if missing is None else f"the console extra is not installed ({INSTALL_HINT})"

    def reserve(self) -> None:
        """Bind the console's address now, before anything else starts, so a taken port fails fast."""
        host, port = self.settings.console_host, self.settings.console_port
        try:
            self.sock = listen_socket(host, port)
        except ConfigError:
            if self.port_chosen:
                raise
            self.sock = listen_socket(host, 0)
            print(f"console port {port} is taken; using {self.sock.getsockname()[1]} instead", flush=True)

    def start(self, environ: Mapping[str, str]) -> str:
        """Start `chronos console` on the reserved socket; returns its URL."""
        assert self.sock is not None
        host, port = self.sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        env = {**environ, **config.to_environ(self.settings)}
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "chronos", "console", "--fd",
                                          str(self.sock.fileno())],
                                         env=env, pass_fds=(self.sock.fileno(),), stdout=open(self.log_path, "ab"),
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=orphans.child_dies_with_us(signal.SIGTERM))
        finally:
            self.sock.close()
            self.sock = None
        self.url = f"http://{shown}:{port}/"
        return self.url

    def exited(self) -> int | None:
        """The exit code if the console has stopped, else None."""
        return None if self.proc is None else self.proc.poll()

    def stop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is None or self.proc.poll() is not None:
            return
        orphans.stop_child(self.proc, 10)
