"""Monitoring on the fleet: Prometheus on the client host with the shipped configuration
(monitoring/prometheus-scrape.yml, its alert rules, its file-based discovery: a targets file per Chronos
host, as the shipped examples are written), scraping and evaluating every 2 s instead of 15; and what the
tests read of it: which alerts were pending or firing, and which targets it could not scrape."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chronos.ops.targets import groups
from kits.fleet.common import METRICS_PORT, PROMETHEUS_PORT, ROOT, Servers, wait, write_file
from kits.network import Network
from kits.stack import http_get

if TYPE_CHECKING:
    from kits.fleet.hosts import ChronosHost

SCRAPE = ROOT / "monitoring" / "prometheus-scrape.yml"


class Prometheus:
    """Prometheus in `host` (the client), when a `prometheus` is at hand (on PATH or beside this Python, where
    `make test` puts it); without one it is not started, and no alerts are read."""

    def __init__(self, net: Network, servers: Servers, folder: Path, *, host: str = "client"):
        self.net, self.servers, self.folder, self.host = net, servers, folder, host

    @property
    def running(self) -> bool:
        return "prometheus" in self.servers

    def start(self, hosts: list["ChronosHost"]) -> None:
        binary = shutil.which("prometheus") or str(Path(sys.executable).parent / "prometheus")
        if not os.access(binary, os.X_OK):
            return
        for h in hosts:  # what `chronos targets` prints on the host: a group per role it runs
            write_file(self.folder / "chronos-targets" / f"{h.name}.yml",
                       json.dumps(groups(h.address, METRICS_PORT, h.counts, host=h.name), indent=2))
        import yaml  # a dev dependency, like the benchmarks
        config = yaml.safe_load(SCRAPE.read_text())
        config["global"].update(scrape_interval="2s", scrape_timeout="1s", evaluation_interval="2s")
        config["rule_files"] = [str(SCRAPE.parent / f) for f in config["rule_files"]]
        write_file(self.folder / "prometheus.yml", json.dumps(config, indent=2))
        self.servers.spawn("prometheus", self.host, [
            binary, f"--config.file={self.folder / 'prometheus.yml'}", f"--storage.tsdb.path={self.folder / 'data'}",
            "--log.level=warn", f"--web.listen-address={self.net[self.host].address}:{PROMETHEUS_PORT}"])
        wait(lambda: self.api("/-/ready") is not None, 30, "Prometheus ready")

    def api(self, path: str) -> Any:
        """An answer of Prometheus's HTTP API (decoded JSON, or the text), asked from its host; None when it does
        not run or does not answer 200."""
        if not self.running:
            return None
        with self.net.inside(self.host):
            status, body = http_get(f"http://{self.net[self.host].address}:{PROMETHEUS_PORT}{path}", 5.0)
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
        if not self.running:
            return None
        answer = self.api(f"/api/v1/query_range?query=ALERTS&start={since:.3f}&end={until:.3f}&step=2")
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
        if not self.running:
            return {}
        answer = self.api(f"/api/v1/query_range?query=up%3D%3D0&start={since:.3f}&end={until:.3f}&step=2")
        return {s["metric"]["instance"]: 2.0 * len(s["values"]) for s in (answer or {}).get("data", {}).get("result", [])}
