"""TLS and basic authentication for a process's /metrics: the web configuration file of Prometheus's
exporters (the exporter toolkit's web-config.yml), of which Chronos reads the common part.

    tls_server_config:            # HTTPS instead of HTTP
      cert_file: /etc/chronos/metrics.crt
      key_file: /etc/chronos/metrics.key
      min_version: TLS12          # or TLS13; TLS12 when unset
    basic_auth_users:             # a user name and password for /metrics
      prometheus: $2y$10$...      # bcrypt hashes (htpasswd -B, or the bcrypt package)

/healthz (and /health) answer without a password, so that the health probes of a supervisor or an
orchestrator work unchanged; over HTTPS too, with the same certificate. Anything else the toolkit knows
(client certificates, HTTP headers, ...) is refused by name rather than ignored.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chronos.errors import ConfigError

_TLS_KEYS = {"cert_file", "key_file", "min_version"}
_TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")
# a password hash no user has, checked when the user is unknown, so that a wrong name costs what a wrong
# password does (no telling which users exist by the time an answer takes)
_NOBODY = "$2b$10$" + "." * 53
_REMEMBERED = 16  # passwords checked right, kept (as digests) so that a scrape every second costs no bcrypt


def read_yaml(name: str, path: str) -> Any:
    """A YAML file a setting names, or a one-line ConfigError."""
    import yaml  # only where a file is given: the processes do without it otherwise

    try:
        return yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{name}: {path} is not YAML: {exc}") from None


@dataclass(frozen=True)
class WebConfig:
    """A parsed web configuration file: the TLS certificate and key (None: plain HTTP), the lowest TLS
    version, and the users of basic authentication (name -> bcrypt hash; none: no password asked)."""

    cert_file: str | None = None
    key_file: str | None = None
    min_version: str = "TLS12"
    users: dict[str, str] = field(default_factory=dict)

    @property
    def tls(self) -> bool:
        return self.cert_file is not None

    @classmethod
    def parse(cls, name: str, data: Any, where: str) -> "WebConfig":
        """The web configuration in `data` (the file `where`, read as YAML), checked: a ConfigError
        names what is wrong."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ConfigError(f"{name}: {where} must be a mapping (tls_server_config, basic_auth_users)")
        unknown = sorted(set(data) - {"tls_server_config", "basic_auth_users"})
        if unknown:
            raise ConfigError(f"{name}: {where}: {', '.join(unknown)} not supported (Chronos reads "
                              f"tls_server_config and basic_auth_users)")
        tls = data.get("tls_server_config") or {}
        if not isinstance(tls, dict):
            raise ConfigError(f"{name}: {where}: tls_server_config must be a mapping")
        unknown = sorted(set(tls) - _TLS_KEYS)
        if unknown:
            raise ConfigError(f"{name}: {where}: tls_server_config: {', '.join(unknown)} not supported (Chronos "
                              f"reads {', '.join(sorted(_TLS_KEYS))})")
        cert, key = tls.get("cert_file"), tls.get("key_file")
        if bool(cert) != bool(key):
            raise ConfigError(f"{name}: {where}: tls_server_config needs both cert_file and key_file")
        version = str(tls.get("min_version") or "TLS12")
        if version not in _TLS_VERSIONS:
            raise ConfigError(f"{name}: {where}: min_version must be TLS12 or TLS13, got {version!r}")
        users = data.get("basic_auth_users") or {}
        if not isinstance(users, dict):
            raise ConfigError(f"{name}: {where}: basic_auth_users must map user names to bcrypt hashes")
        for user, hashed in users.items():
            if not isinstance(hashed, str) or not hashed.startswith(_BCRYPT_PREFIXES) or len(hashed) != 60:
                raise ConfigError(f"{name}: {where}: the password of user {user!r} is not a bcrypt hash "
                                  f"($2y$..., 60 characters: htpasswd -nBC 10 \"\" | tr -d ':\\n')")
        config = cls(str(cert) if cert else None, str(key) if key else None, version,
                     {str(u): h for u, h in users.items()})
        config.server_context(name)  # a certificate or key that does not load stops the process at start
        if config.users:
            import bcrypt  # noqa: F401 - checked at start, not at the first scrape
        return config

    def server_context(self, name: str = "CHRONOS_METRICS_WEB_CONFIG_FILE") -> ssl.SSLContext | None:
        """The TLS context the server wraps its connections in; None for plain HTTP."""
        if not self.tls:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = _TLS_VERSIONS[self.min_version]
        try:
            context.load_cert_chain(str(self.cert_file), str(self.key_file))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"{name}: cannot load the certificate {self.cert_file} and key {self.key_file}: "
                              f"{getattr(exc, 'strerror', None) or exc}") from None
        return context


def load(name: str, path: str) -> WebConfig:
    """The web configuration file a setting names (empty: none)."""
    if not path:
        return WebConfig()
    return WebConfig.parse(name, read_yaml(name, path), path)


class BasicAuth:
    """Checks an Authorization header against the users' bcrypt hashes. A right password is remembered
    (as a digest, never as given) for the next requests of the same scraper."""

    def __init__(self, users: dict[str, str]):
        self.users = {user: hashed.encode() for user, hashed in users.items()}
        self._right: dict[bytes, None] = {}
        self._lock = threading.Lock()

    def allows(self, header: str | None) -> bool:
        """Whether `header` (the request's Authorization, or None) names a user with the right password."""
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, sep, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        if not sep:
            return False
        hashed = self.users.get(user)
        key = hashlib.sha256(b"%s\0%s\0%s" % (user.encode(), password.encode(), hashed or b"")).digest()
        with self._lock:
            if any(hmac.compare_digest(key, known) for known in self._right):
                return True
        import bcrypt
        right = bcrypt.checkpw(password.encode(), hashed or _NOBODY.encode()) and hashed is not None
        if right:
            with self._lock:
                self._right[key] = None
                while len(self._right) > _REMEMBERED:
                    del self._right[next(iter(self._right))]
        return right
