"""The console over plain HTTP: secrets, cross-site requests, host names, bad addresses.

Each test runs a real `chronos console` process against a fresh database of the session's
PostgreSQL; no broker is needed.
"""

from __future__ import annotations

import http.client
import urllib.parse
from urllib.parse import urlsplit

import pytest

from consolekit import TOKEN, Console, clean_env

PASSWORD = "s3cret-db-password"
SASL = "s3cret-sasl-password"


@pytest.fixture
def console(database_url, tmp_path):
    parts = urlsplit(database_url)
    with_password = parts._replace(netloc=f"{parts.username}:{PASSWORD}@{parts.hostname}:{parts.port}").geturl()
    props = tmp_path / "kafka.properties"
    props.write_text(f"sasl.password={SASL}\n")
    c = Console(tmp_path, env=clean_env(CHRONOS_DATABASE_URL=with_password, CHRONOS_CONSOLE_TOKEN=TOKEN,
                                        CHRONOS_KAFKA_PROPERTIES_FILE=str(props)))
    yield c
    c.stop()


def request(url: str, path: str, method: str = "GET", body: str | None = None,
            headers: dict | None = None) -> tuple[int, dict, str]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    text = response.read().decode(errors="replace")
    conn.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, text


def test_no_secret_on_any_page_response_or_log_line(console):
    bodies = []
    for path in ("/", "/api/overview", "/schedules", "/messages", "/messages/x", "/login", "/nowhere",
                 "/static/console.js"):
        status, headers, text = request(console.url, path)
        assert status in (200, 404), (path, status)
        assert "default-src 'none'" in headers["content-security-policy"]
        assert headers["x-content-type-options"] == "nosniff"
        bodies.append(text)
    status, headers, text = request(console.url, "/login", "POST", "token=wrong-token-value",
                                    {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 403
    bodies.append(text + str(headers))
    console.stop()
    bodies.append(console.log.read_text())
    for secret in (PASSWORD, SASL, TOKEN):
        assert not any(secret in body for body in bodies), secret


def test_sign_in_from_another_site_is_refused(console):
    form = urllib.parse.urlencode({"token": TOKEN})
    base = {"Content-Type": "application/x-www-form-urlencoded"}
    status, headers, _ = request(console.url, "/login", "POST", form,
                                 {**base, "Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
    assert status == 403 and "set-cookie" not in headers
    status, headers, _ = request(console.url, "/login", "POST", form, base)
    assert status == 303 and "HttpOnly" in headers["set-cookie"] and "SameSite=strict" in headers["set-cookie"]


def test_a_foreign_host_name_is_refused_on_loopback(console):
    # DNS rebinding: a page on evil.example whose name now points at 127.0.0.1 cannot read the console
    status, _, _ = request(console.url, "/api/overview", headers={"Host": "evil.example"})
    assert status == 400
    assert request(console.url, "/api/overview", headers={"Host": "localhost"})[0] == 200


@pytest.mark.parametrize("path", ["/static/../../etc/passwd", "/%FF%FE", "/schedules/%00", "/" + "x" * 5000,
                                  "/messages/%FF%FE", "/messages/a%00b", "/messages/" + "x" * 129,
                                  "/messages/no-such-id", "/messages/%2F%25%22%3Cscript%3E"])
def test_bad_addresses_get_a_404_page(console, path):
    status, headers, text = request(console.url, path)
    assert status == 404, text
    assert "Traceback" not in text and headers["content-type"].startswith("text/html")


def test_pages_say_when_postgresql_cannot_be_reached(tmp_path):
    c = Console(tmp_path, env=clean_env(CHRONOS_DATABASE_URL="postgresql://chronos@127.0.0.1:1/chronos"))
    try:
        status, _, text = request(c.url, "/")
        assert status == 200 and "cannot connect to PostgreSQL at postgresql://chronos@127.0.0.1:1/chronos" in text
        assert 'id="store-error" >' in text  # shown, not hidden
        status, _, text = request(c.url, "/schedules")
        assert status == 200 and "PostgreSQL: cannot connect to PostgreSQL" in text and "Traceback" not in text
    finally:
        c.stop()


def test_a_bad_search_is_a_400_page_and_an_action_without_a_session_is_refused(console):
    status, _, text = request(console.url, "/messages?state=sleeping")
    assert status == 400 and "unknown state &#39;sleeping&#39;" in text
    status, _, text = request(console.url, "/messages?limit=0")
    assert status == 400 and "limit must be between 1 and 500" in text
    form = urllib.parse.urlencode({"action": "cancel", "id_prefix": "", "expected": "1"})
    status, _, text = request(console.url, "/actions/apply", "POST", form,
                              {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 403 and "Sign in with the console token first." in text
