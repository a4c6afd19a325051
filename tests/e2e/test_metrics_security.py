"""A real process with its /metrics behind TLS and a password, on one address of the host: Prometheus's
web configuration read as the settings say, the health probe still open, and `chronos health` and
`chronos status` reaching it with the scrape settings."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import yaml

from chronos.embedded.procs import free_port
from chronos.telemetry.scrape import ScrapeConfig, Scraper
from kits.tls import Authority

TIMEOUT = 5.0


def cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chronos", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60)


SECURITY = Path(__file__).resolve().parents[2] / "docs" / "operations" / "security.md"
PAGE_PASSWORD = "correct horse battery staple"  # the password of the page's example hash


def page_yaml(tag: str) -> dict:
    """The YAML block of the security page marked `<!-- docs-test: TAG -->`."""
    (block,) = re.findall(rf"<!-- docs-test: {tag} -->\n```yaml\n(.*?)\n```", SECURITY.read_text(), re.S)
    return yaml.safe_load(block)


@pytest.fixture
def files(tmp_path):
    """The security page's web configuration and scrape settings, with this test's certificate (for
    chronos-1.internal and 127.0.0.2, by an authority of its own) and password file where the page names a
    host's files."""
    authority = Authority("metrics", tmp_path)
    cert, key = authority.issue("chronos-1", hosts=("chronos-1.internal", "127.0.0.2"))
    web = page_yaml("web config")
    web["tls_server_config"].update(cert_file=str(cert), key_file=str(key))
    (tmp_path / "web.yml").write_text(yaml.safe_dump(web))
    (tmp_path / "password").write_text(PAGE_PASSWORD + "\n")
    scrape = page_yaml("scrape config")
    scrape["basic_auth"]["password_file"] = str(tmp_path / "password")
    scrape["tls_config"]["ca_file"] = str(authority.ca_file)
    (tmp_path / "scrape.yml").write_text(yaml.safe_dump(scrape))
    return {"CHRONOS_METRICS_ADDRESS": "127.0.0.2", "CHRONOS_METRICS_WEB_CONFIG_FILE": str(tmp_path / "web.yml"),
            "CHRONOS_METRICS_SCRAPE_CONFIG_FILE": str(tmp_path / "scrape.yml")}, authority


def test_a_process_serves_https_with_a_password_and_chronos_health_and_status_reach_it(processes, chronos_env, files):
    settings, authority = files
    port = free_port()
    detector = processes.start("detector", CHRONOS_METRICS_PORT=str(port), **settings)
    processes.wait_for_log(detector, f"serving /metrics and /healthz on port {port} (127.0.0.2, https, "
                                     f"/metrics with a password)")
    anonymous = Scraper(ScrapeConfig(ca_file=str(authority.ca_file)))
    assert anonymous.get(f"https://127.0.0.2:{port}/metrics", TIMEOUT)[0] == 401
    assert anonymous.get(f"https://127.0.0.2:{port}/healthz", TIMEOUT)[0] in (200, 503)  # a probe needs no password

    env = {**chronos_env, **settings}
    health = cli(env, "health", "--metrics-port", str(port))
    assert health.returncode == 0, health.stdout + health.stderr
    assert orjson.loads(health.stdout)["role"] == "detector"
    url = f"https://127.0.0.2:{port}/metrics"
    status = cli({**env, "CHRONOS_CONSOLE_METRICS_URLS": url}, "status", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    (reported,) = orjson.loads(status.stdout)["postgres"]["reported"]
    assert (reported["url"], reported["answered"], reported["role"]) == (url, True, "detector")
    # without the scrape settings the system's authorities do not know the certificate: no answer, and why
    bare = {k: v for k, v in env.items() if k != "CHRONOS_METRICS_SCRAPE_CONFIG_FILE"}
    refused = cli(bare, "health", "--metrics-port", str(port))
    assert refused.returncode == 3 and "certificate verify failed" in refused.stderr, refused.stderr


def test_a_web_configuration_the_process_cannot_honour_stops_it_with_a_configuration_error(processes, tmp_path):
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  prometheus: plain-password\n")
    detector = processes.start("detector", CHRONOS_METRICS_PORT=str(free_port()),
                               CHRONOS_METRICS_WEB_CONFIG_FILE=str(web))
    assert detector.wait(30) == 2
    assert "the password of user 'prometheus' is not a bcrypt hash" in processes.log_of(detector)
