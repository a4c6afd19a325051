"""The members of a cluster as the kit started them and as Patroni's REST API shows them: who leads,
who is the synchronous standby, and the waits for either."""

from __future__ import annotations

import time
from typing import Any

from chronos.embedded.patroni.config import POLL, Leader, rest
from chronos.embedded.patroni.nodes import PatroniMember
from chronos.embedded.procs import EmbeddedError


class RestView:
    """What a cluster knows of its members (`names`, their ports, the nodes started) and asks their REST
    API; `ReplicatedPostgres` is one."""

    names: list[str]
    _ports: dict[str, Any]
    _members: dict[str, PatroniMember]

    def cluster(self) -> list[dict[str, Any]] | None:
        """The members as Patroni lists them (`GET /cluster`, asked of the first member that answers;
        members known to be down or frozen are not asked), or None when none answers."""
        for node in self._nodes():
            if not node.running or node.frozen:
                continue
            try:
                status, body = rest(node.port, "/cluster")
            except OSError:
                continue
            if status == 200 and isinstance(body, dict):
                return list(body.get("members", []))
        return None

    def leader(self) -> str | None:
        """The name of the member that holds the leader key, as the REST API says."""
        for m in self.cluster() or []:
            if m.get("role") == "leader":
                return m["name"]
        return None

    def sync_standby(self) -> str | None:
        """The name of the synchronous standby that streams from the leader, as the REST API says."""
        for m in self.cluster() or []:
            if m.get("role") == "sync_standby" and m.get("state") == "streaming":
                return m["name"]
        return None

    def wait_leader(self, not_name: str | None = None, timeout: float = 60.0) -> Leader:
        """Wait for a leader (other than `not_name`) whose PostgreSQL is out of recovery and accepts
        writes; it and the time it was first seen so (polled every 50 ms).

        `GET /patroni` says so (`role` comes from pg_is_in_recovery()): the leader key alone is not
        enough, since a member takes it before its PostgreSQL is promoted, and `GET /primary` answers
        200 from then on.
        """
        deadline = time.monotonic() + timeout
        members = None
        while True:
            members = self.cluster()
            for m in members or []:
                if m.get("role") == "leader" and m["name"] != not_name:
                    try:
                        status, body = rest(self._port(m["name"], "rest"), "/patroni")
                    except OSError:
                        continue
                    if status == 200 and isinstance(body, dict) and body.get("role") == "primary" \
                            and body.get("state") == "running":
                        return Leader(m["name"], time.time())
            if time.monotonic() >= deadline:
                other = f" other than {not_name}" if not_name else ""
                raise EmbeddedError(f"no leader{other} accepts writes within {timeout:.0f}s; members: "
                                    f"{self._describe(members)}; " + self._tails(self.names))
            time.sleep(POLL)

    def wait_sync_standby(self, timeout: float = 60.0) -> str:
        """Wait until a synchronous standby streams from a running leader; its name."""
        deadline = time.monotonic() + timeout
        members = None
        while True:
            members = self.cluster()
            leading = any(m.get("role") == "leader" and m.get("state") == "running" for m in members or [])
            for m in members or []:
                if leading and m.get("role") == "sync_standby" and m.get("state") == "streaming":
                    return m["name"]
            if time.monotonic() >= deadline:
                standbys = [m["name"] for m in members or [] if m.get("role") != "leader"] or self.names
                raise EmbeddedError(f"no synchronous standby streams within {timeout:.0f}s; members: "
                                    f"{self._describe(members)}; " + self._tails(standbys))
            time.sleep(POLL)

    def _nodes(self) -> list[PatroniMember]:
        return [self._members[n] for n in self.names if n in self._members]

    def _node(self, name: str) -> PatroniMember:
        self._port(name, "pg")
        if name not in self._members:
            raise EmbeddedError(f"member {name} was never started (call start())")
        return self._members[name]

    def _port(self, name: str, kind: str) -> int:
        if name not in self._ports or name == "etcd":
            raise EmbeddedError(f"no member {name!r}: the members are {', '.join(self.names)}")
        return self._ports[name][kind]

    def _describe(self, members: list[dict[str, Any]] | None) -> str:
        if members is None:
            return "no member's REST API answers"
        return ", ".join(f"{m.get('name')} {m.get('role')} {m.get('state')}" for m in members) or "none registered"

    def _tails(self, names: list[str]) -> str:
        parts = []
        for name in names:
            node = self._members.get(name)
            if node is not None:
                state = "frozen" if node.frozen else "running" if node.running else "not running"
                parts.append(f"{name} ({state}): {node.tail()}")
        return "; ".join(parts)
