"""A process's /metrics and /healthz server on real sockets: the address it listens on, HTTPS with the web
configuration's certificate, a password for /metrics and none for /healthz, and Chronos's own scraper
(chronos.telemetry.scrape) checking the certificate and giving the password."""

from __future__ import annotations

import socket
import ssl

import bcrypt
import orjson
import pytest
from prometheus_client import CollectorRegistry, Gauge

from chronos.telemetry.http import MetricsServer
from chronos.telemetry.scrape import ScrapeConfig, Scraper
from chronos.telemetry.webconfig import WebConfig
from kits.tls import Authority

TIMEOUT = 5.0


def registry() -> CollectorRegistry:
    r = CollectorRegistry()
    Gauge("chronos_test_gauge", "a gauge", registry=r).set(7)
    return r


@pytest.fixture
def serve():
    started = []

    def start(address: str, web: WebConfig | None = None) -> int:
        server = MetricsServer((address, 0), registry(), lambda: (True, {"status": "ok"}),
                               lambda: (True, {"status": "alive"}), web)
        server.start()
        started.append(server)
        return server.server_address[1]
    yield start
    for server in started:
        server.close()


def test_it_listens_on_the_address_given_and_no_other(serve):
    port = serve("127.0.0.2")
    status, body = Scraper().get(f"http://127.0.0.2:{port}/metrics", TIMEOUT)
    assert status == 200 and b"chronos_test_gauge 7.0" in body
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT).close()


@pytest.fixture
def secured(tmp_path, serve):
    """A server with a certificate for metrics.internal and 127.0.0.1, and a user prometheus."""
    authority = Authority("metrics", tmp_path)
    cert, key = authority.issue("metrics", hosts=("metrics.internal", "127.0.0.1"))
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
    port = serve("127.0.0.1", WebConfig(str(cert), str(key), "TLS12", {"prometheus": hashed}))
    return port, authority


def test_metrics_over_https_needs_the_password_and_the_health_probes_do_not(secured):
    port, authority = secured
    anonymous = Scraper(ScrapeConfig(ca_file=str(authority.ca_file)))
    status, body = anonymous.get(f"https://127.0.0.1:{port}/metrics", TIMEOUT)
    assert status == 401 and b"chronos_test_gauge" not in body
    with pytest.raises(OSError, match="HTTP 401 \\(a password is needed"):
        anonymous.text(f"https://127.0.0.1:{port}/metrics", TIMEOUT)
    status, body = anonymous.get(f"https://127.0.0.1:{port}/healthz", TIMEOUT)
    assert status == 200 and orjson.loads(body) == {"status": "ok"}
    status, body = anonymous.get(f"https://127.0.0.1:{port}/livez", TIMEOUT)
    assert status == 200 and orjson.loads(body) == {"status": "alive"}
    wrong = Scraper(ScrapeConfig("prometheus", "guess", ca_file=str(authority.ca_file)))
    assert wrong.get(f"https://127.0.0.1:{port}/metrics", TIMEOUT)[0] == 401
    right = Scraper(ScrapeConfig("prometheus", "s3cret", ca_file=str(authority.ca_file)))
    assert "chronos_test_gauge 7.0" in right.text(f"https://127.0.0.1:{port}/metrics", TIMEOUT)


def test_the_scraper_checks_the_certificate_against_its_authority_and_the_name_it_is_told(secured, tmp_path):
    port, authority = secured
    other = Authority("other", tmp_path / "other")
    with pytest.raises(ssl.SSLCertVerificationError):
        Scraper(ScrapeConfig(ca_file=str(other.ca_file))).get(f"https://127.0.0.1:{port}/healthz", TIMEOUT)
    # reached by another address than the certificate names: server_name says which name to expect
    with pytest.raises(ssl.SSLCertVerificationError):
        Scraper(ScrapeConfig(ca_file=str(authority.ca_file), server_name="elsewhere.internal")).get(
            f"https://127.0.0.1:{port}/healthz", TIMEOUT)
    named = Scraper(ScrapeConfig(ca_file=str(authority.ca_file), server_name="metrics.internal"))
    assert named.get(f"https://127.0.0.1:{port}/healthz", TIMEOUT)[0] == 200
    assert Scraper(ScrapeConfig(insecure_skip_verify=True)).get(f"https://127.0.0.1:{port}/healthz", TIMEOUT)[0] == 200
    with pytest.raises(OSError):  # plain HTTP to the HTTPS port gets no HTTP answer
        Scraper().get(f"http://127.0.0.1:{port}/healthz", TIMEOUT)


def test_a_client_that_never_shakes_hands_holds_up_no_other(secured):
    port, authority = secured
    silent = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    try:
        scraper = Scraper(ScrapeConfig(ca_file=str(authority.ca_file)))
        assert scraper.get(f"https://127.0.0.1:{port}/healthz", TIMEOUT)[0] == 200
    finally:
        silent.close()
