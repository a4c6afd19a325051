"""The web configuration of /metrics (chronos.telemetry.webconfig) and the scrape settings of Chronos's own
scrapers (chronos.telemetry.scrape): what they accept, what they refuse and how, and the password check."""

from __future__ import annotations

import base64

import bcrypt
import pytest

from chronos.errors import ConfigError
from chronos.telemetry.scrape import ScrapeConfig, Scraper
from chronos.telemetry.webconfig import BasicAuth, WebConfig

NAME = "CHRONOS_METRICS_WEB_CONFIG_FILE"
# htpasswd -nBC 10 writes $2y$ hashes; the bcrypt package writes $2b$: both are read
HASHED = bcrypt.hashpw(b"s3cret pass", bcrypt.gensalt(4)).decode().replace("$2b$", "$2y$", 1)


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_no_file_content_is_plain_http_without_a_password():
    config = WebConfig.parse(NAME, None, "web.yml")
    assert not config.tls and config.users == {} and config.server_context() is None


def test_the_users_of_basic_authentication_are_read():
    config = WebConfig.parse(NAME, {"basic_auth_users": {"prometheus": HASHED}}, "web.yml")
    assert config.users == {"prometheus": HASHED} and not config.tls


@pytest.mark.parametrize("data, says", [
    ({"http_server_config": {"http2": False}}, "http_server_config not supported"),
    ({"tls_server_config": {"cert_file": "a.crt"}}, "needs both cert_file and key_file"),
    ({"tls_server_config": {"cert_file": "a.crt", "key_file": "a.key", "client_ca_file": "ca.crt"}},
     "client_ca_file not supported"),
    ({"tls_server_config": {"cert_file": "a.crt", "key_file": "a.key", "min_version": "TLS10"}},
     "min_version must be TLS12 or TLS13"),
    ({"tls_server_config": {"cert_file": "/nonexistent.crt", "key_file": "/nonexistent.key"}},
     "cannot load the certificate /nonexistent.crt"),
    ({"basic_auth_users": {"prometheus": "s3cret pass"}}, "the password of user 'prometheus' is not a bcrypt hash"),
    ({"basic_auth_users": ["prometheus"]}, "basic_auth_users must map user names to bcrypt hashes"),
    (["tls_server_config"], "must be a mapping"),
])
def test_what_chronos_cannot_honour_is_refused_by_name(data, says):
    with pytest.raises(ConfigError, match=says) as refused:
        WebConfig.parse(NAME, data, "web.yml")
    assert str(refused.value).startswith(f"{NAME}: ")


def test_only_the_right_password_of_a_known_user_passes():
    auth = BasicAuth({"prometheus": HASHED})
    assert auth.allows(header("prometheus", "s3cret pass"))
    assert not auth.allows(header("prometheus", "s3cret"))
    assert not auth.allows(header("someone", "s3cret pass"))
    assert not auth.allows(None)
    assert not auth.allows("Bearer abc")
    assert not auth.allows("Basic not-base64!")
    assert not auth.allows("Basic " + base64.b64encode(b"no colon").decode())


def test_a_right_password_is_checked_with_bcrypt_once_and_remembered_only_as_a_digest(monkeypatch):
    auth = BasicAuth({"prometheus": HASHED})
    checks = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda password, hashed: checks.append(password) or real(password, hashed))
    for _ in range(5):
        assert auth.allows(header("prometheus", "s3cret pass"))
    assert not auth.allows(header("prometheus", "wrong"))
    assert not auth.allows(header("prometheus", "wrong"))
    assert checks == [b"s3cret pass", b"wrong", b"wrong"]  # a wrong one is checked each time
    assert all(b"s3cret" not in known for known in auth._right)


def test_the_scrape_settings_carry_a_user_and_password_from_a_file(tmp_path):
    (tmp_path / "password").write_text("s3cret pass\n")
    config = ScrapeConfig.parse("S", {"basic_auth": {"username": "prometheus", "password_file": str(tmp_path / "password")},
                                      "tls_config": {"server_name": "metrics.internal"}}, "scrape.yml")
    assert (config.username, config.password, config.server_name) == ("prometheus", "s3cret pass", "metrics.internal")
    assert Scraper(config).headers["Authorization"] == header("prometheus", "s3cret pass")
    assert "Authorization" not in Scraper().headers


@pytest.mark.parametrize("data, says", [
    ({"basic_auth": {"username": "prometheus"}}, "needs a username and a password"),
    ({"basic_auth": {"username": "p", "password_file": "/nonexistent"}}, "cannot read password_file /nonexistent"),
    ({"tls_config": {"cert_file": "client.crt"}}, "tls_config: cert_file not supported"),
    ({"tls_config": {"ca_file": "/nonexistent.crt"}}, "cannot load ca_file /nonexistent.crt"),
    ({"scrape_interval": "15s"}, "scrape_interval not supported"),
])
def test_scrape_settings_chronos_cannot_honour_are_refused_by_name(data, says):
    with pytest.raises(ConfigError, match=says):
        ScrapeConfig.parse("S", data, "scrape.yml")
