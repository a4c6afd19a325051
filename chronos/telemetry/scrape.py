"""How Chronos's own scrapers (the console, `chronos status`, `chronos health`) reach the processes'
/metrics and /healthz: plain HTTP, or HTTPS and basic authentication as the processes' web configuration
asks (chronos.telemetry.webconfig), with Prometheus's scrape settings in a file of their own:

    basic_auth:
      username: prometheus
      password_file: /etc/chronos/metrics-password    # or password: ...
    tls_config:
      ca_file: /etc/chronos/metrics-ca.crt            # else the system's authorities
      server_name: chronos-metrics.internal           # the name the certificate must carry, whatever the URL says
      insecure_skip_verify: false
"""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from chronos.errors import ConfigError
from chronos.telemetry.webconfig import read_yaml

__all__ = ["ScrapeConfig", "Scraper", "load", "read_yaml"]

_AUTH_KEYS = {"username", "password", "password_file"}
_TLS_KEYS = {"ca_file", "server_name", "insecure_skip_verify"}


@dataclass(frozen=True)
class ScrapeConfig:
    """The scrape settings: basic authentication's user and password, and how to check the processes'
    certificates."""

    username: str | None = None
    password: str | None = None
    ca_file: str | None = None
    server_name: str | None = None
    insecure_skip_verify: bool = False

    @classmethod
    def parse(cls, name: str, data: Any, where: str) -> "ScrapeConfig":
        """The settings in `data` (the file `where`, read as YAML), checked: a ConfigError names what is wrong."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ConfigError(f"{name}: {where} must be a mapping (basic_auth, tls_config)")
        unknown = sorted(set(data) - {"basic_auth", "tls_config"})
        if unknown:
            raise ConfigError(f"{name}: {where}: {', '.join(unknown)} not supported (Chronos reads basic_auth and "
                              f"tls_config)")
        auth, tls = data.get("basic_auth") or {}, data.get("tls_config") or {}
        for key, part, known in (("basic_auth", auth, _AUTH_KEYS), ("tls_config", tls, _TLS_KEYS)):
            if not isinstance(part, dict):
                raise ConfigError(f"{name}: {where}: {key} must be a mapping")
            if set(part) - known:
                raise ConfigError(f"{name}: {where}: {key}: {', '.join(sorted(set(part) - known))} not supported "
                                  f"(Chronos reads {', '.join(sorted(known))})")
        password = auth.get("password")
        if auth.get("password_file"):
            try:
                password = Path(str(auth["password_file"])).read_text().rstrip("\r\n")
            except OSError as exc:
                raise ConfigError(f"{name}: {where}: cannot read password_file {auth['password_file']}: "
                                  f"{exc.strerror}") from None
        if bool(auth.get("username")) != (password is not None):
            raise ConfigError(f"{name}: {where}: basic_auth needs a username and a password (or password_file)")
        config = cls(str(auth["username"]) if auth.get("username") else None,
                     None if password is None else str(password),
                     str(tls["ca_file"]) if tls.get("ca_file") else None,
                     str(tls["server_name"]) if tls.get("server_name") else None,
                     bool(tls.get("insecure_skip_verify", False)))
        config.context(name)  # an authority that does not load is said now
        return config

    def context(self, name: str = "CHRONOS_METRICS_SCRAPE_CONFIG_FILE") -> ssl.SSLContext:
        """The TLS context of an HTTPS request."""
        context = ssl.create_default_context()
        if self.ca_file:
            try:
                context.load_verify_locations(self.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"{name}: cannot load ca_file {self.ca_file}: "
                                  f"{getattr(exc, 'strerror', None) or exc}") from None
        if self.insecure_skip_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context


def load(name: str, path: str | None) -> ScrapeConfig:
    """The scrape settings file a setting names (None or empty: plain requests)."""
    if not path:
        return ScrapeConfig()
    return ScrapeConfig.parse(name, read_yaml(name, path), path)


class _HTTPSConnection(http.client.HTTPSConnection):
    """An HTTPS connection whose certificate must carry `server_name` when one is given, else the URL's host."""

    def __init__(self, host: str, port: int | None, *, timeout: float, context: ssl.SSLContext,
                 server_name: str | None):
        super().__init__(host, port, timeout=timeout, context=context)
        self.server_name = server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self.server_name or self.host)  # type: ignore[attr-defined]


class Scraper:
    """GETs a process's /metrics or /healthz as the scrape settings say."""

    def __init__(self, config: ScrapeConfig | None = None):
        self.config = config or ScrapeConfig()
        self._context: ssl.SSLContext | None = None
        self.headers = {"Accept": "text/plain"}
        if self.config.username is not None:
            token = base64.b64encode(f"{self.config.username}:{self.config.password}".encode()).decode()
            self.headers["Authorization"] = f"Basic {token}"

    def get(self, url: str, timeout: float) -> tuple[int, bytes]:
        """(HTTP status, body) of a GET of `url`, each step within `timeout` seconds; raises OSError (refused,
        timed out, a TLS failure) or ValueError (not an http(s) URL) when there is no answer."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            if self._context is None:
                self._context = self.config.context()
            conn = _HTTPSConnection(parts.hostname, parts.port, timeout=timeout, context=self._context,
                                    server_name=self.config.server_name)
        else:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
        try:
            conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), headers=self.headers)
            response = conn.getresponse()
            return response.status, response.read()
        except (http.client.HTTPException, socket.timeout) as exc:
            raise OSError(f"{type(exc).__name__}: {exc}") from None
        finally:
            conn.close()

    def text(self, url: str, timeout: float) -> str:
        """The body of a GET that must answer 200 (a /metrics scrape); OSError when it does not."""
        status, body = self.get(url, timeout)
        if status != 200:
            raise OSError(f"HTTP {status}" + (" (a password is needed: CHRONOS_METRICS_SCRAPE_CONFIG_FILE)"
                                              if status == 401 else ""))
        return body.decode("utf-8", errors="replace")
