"""Who may act in the console, and protection of its actions against cross-site requests.

Without a token the console is read-only. With one, an operator signs in by typing it; the
console then sets a session cookie (`HttpOnly`, `SameSite=Strict`) holding a random session id
and its HMAC under the token, so it cannot be forged without the token and a new token ends
every session. Each action form carries a second HMAC bound to that session id, and an action
must also come from the console's own origin (`Origin`, `Sec-Fetch-Site`). The token itself is
never stored in the cookie, a page or a log.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Mapping
from urllib.parse import urlsplit

COOKIE = "chronos_console"


def _mac(token: str, purpose: str, value: str) -> str:
    return hmac.new(token.encode(), f"{purpose}|{value}".encode(), hashlib.sha256).hexdigest()


class Auth:
    """Sessions and form tokens under the console token (None: read-only, nobody may act)."""

    def __init__(self, token: str | None):
        self.token = token

    @property
    def read_only(self) -> bool:
        return self.token is None

    def check_token(self, offered: str) -> bool:
        return self.token is not None and hmac.compare_digest(offered.encode(), self.token.encode())

    def new_session(self) -> str:
        """A fresh cookie value: session id and its MAC."""
        assert self.token is not None
        sid = secrets.token_urlsafe(18)
        return f"{sid}.{_mac(self.token, 'session', sid)}"

    def session(self, cookie: str | None) -> str | None:
        """The session id of a valid cookie, else None."""
        if self.token is None or not cookie or "." not in cookie:
            return None
        sid, mac = cookie.rsplit(".", 1)
        return sid if hmac.compare_digest(mac, _mac(self.token, "session", sid)) else None

    def form_token(self, sid: str) -> str:
        assert self.token is not None
        return _mac(self.token, "form", sid)

    def check_form(self, sid: str | None, offered: str | None) -> bool:
        return (sid is not None and offered is not None
                and hmac.compare_digest(offered, self.form_token(sid)))


def same_origin(headers: Mapping[str, str], scheme: str, host: str) -> bool:
    """Whether a state-changing request comes from the console's own pages.

    Browsers send `Sec-Fetch-Site` and `Origin` with every form POST; a request that has them
    must name this origin. A request without either is not from a browser page (a cross-site
    form always carries at least one of them in every browser the console supports), and the
    session cookie and form token still guard it.
    """
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = headers.get("origin")
    if origin is not None:
        if origin == "null":
            return False
        parts = urlsplit(origin)
        if parts.scheme != scheme or parts.netloc.lower() != host.lower():
            return False
    return True
