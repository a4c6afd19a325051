"""How the console shows what a message holds, and how a message id travels in a URL.

Keys, values and header values are bytes: shown as text when they are printable UTF-8, else
as hex, always through the templates' escaping. Pure functions, tested without a server.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from urllib.parse import quote, unquote_to_bytes

PREVIEW_BYTES = 4096
MAX_ID_CHARS = 128  # as the consumer enforces for chronosMessageId


@dataclass(frozen=True)
class Shown:
    """Bytes as the page shows them."""

    kind: str        # "null", "text" or "hex"
    text: str
    size: int
    truncated: bool = False


def _printable(text: str) -> bool:
    """No control or unassigned characters, but line breaks and tabs (values are often text)."""
    return all(ch in "\n\r\t" or unicodedata.category(ch)[0] != "C" for ch in text)


def _decode(part: bytes, truncated: bool) -> str | None:
    # a multi-byte character cut by the preview limit is no reason to fall back to hex
    for cut in range(4 if truncated else 1):
        try:
            return part[:len(part) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


def show_bytes(data: bytes | None, limit: int = PREVIEW_BYTES, *, size: int | None = None) -> Shown:
    """Text when `data` is printable UTF-8, else hex (`00 ff ...`); at most `limit` bytes of it.
    `size` is the whole length when `data` is already a preview of something longer."""
    if data is None:
        return Shown("null", "(null)", 0)
    size = len(data) if size is None else size
    part = data[:limit]
    truncated = size > len(part)
    text = _decode(part, truncated)
    if text is not None and _printable(text):
        return Shown("text", text, size, truncated)
    return Shown("hex", part.hex(" "), size, truncated)


def message_url(message_id: str) -> str:
    """The stable address of a message's page: every character but unreserved ones escaped."""
    return "/messages/" + quote(message_id, safe="")


def id_from_path(raw_path: bytes, prefix: bytes = b"/messages/") -> str | None:
    """The message id of a `/messages/<url-encoded id>` request path, or None when the path
    cannot hold an id the consumer accepts (bad UTF-8, NUL, empty or too long)."""
    if not raw_path.startswith(prefix):
        return None
    try:
        message_id = unquote_to_bytes(raw_path[len(prefix):]).decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not message_id or len(message_id) > MAX_ID_CHARS or "\x00" in message_id:
        return None
    return message_id
