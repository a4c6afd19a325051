"""What a cluster's work directory keeps so that it starts again where it stopped: its passwords and its
ports, in cluster.json (mode 0600: it holds the passwords)."""

from __future__ import annotations

import json
import os
import secrets
import socket
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from chronos.embedded.procs import HOST, EmbeddedError


class ClusterState:
    """The passwords (superuser, replication, app) and ports (each member's PostgreSQL and REST API, etcd's
    client and peer) of the members `names`: read from `path` when it exists, else new ones; `save` writes
    them. With `base_port` B, member i's PostgreSQL listens on B+i and its REST API on B+10+i, etcd on B+20
    (peers B+21); without, free ports are chosen once and kept."""

    def __init__(self, path: Path, names: list[str], base_port: int | None):
        self.path = path
        self.names = names
        kept = self._read()
        self.passwords: dict[str, str] = kept.get("passwords") or {
            role: secrets.token_hex(16) for role in ("superuser", "replication", "app")}
        self.ports: dict[str, Any] = self._choose_ports(base_port, kept.get("ports") or {})

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"passwords": self.passwords, "ports": self.ports}, f, indent=2)
        os.replace(tmp, self.path)

    def _read(self) -> dict[str, Any]:
        try:
            state = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            raise EmbeddedError(f"{self.path} cannot be read ({e}): remove the work directory "
                                "to start a new cluster") from None
        return state if isinstance(state, dict) else {}

    def _choose_ports(self, base_port: int | None, kept: dict[str, Any]) -> dict[str, Any]:
        if base_port is not None:
            ports = {n: {"pg": base_port + i, "rest": base_port + 10 + i} for i, n in enumerate(self.names)}
            ports["etcd"] = {"client": base_port + 20, "peer": base_port + 21}
            return ports
        wanted = [*self.names, "etcd"]
        if all(n in kept for n in wanted):
            return {n: kept[n] for n in wanted}
        free = _free_ports(2 * len(wanted))
        ports = {n: {"pg": free[2 * i], "rest": free[2 * i + 1]} for i, n in enumerate(self.names)}
        ports["etcd"] = {"client": free[-2], "peer": free[-1]}
        return ports


def _free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports on 127.0.0.1 that were free a moment ago (held together while chosen)."""
    with ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind((HOST, 0))
            ports.append(s.getsockname()[1])
        return ports
