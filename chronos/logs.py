"""One line per event, with level, role and node id; text or JSON; secrets redacted."""

from __future__ import annotations

import logging
import sys
import time
from typing import Callable, Iterable

import orjson


class RedactFilter(logging.Filter):
    """Replaces every known secret value with *** in the formatted message."""

    def __init__(self, secrets: Iterable[str]):
        super().__init__()
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            message = record.getMessage()
            for secret in self.secrets:
                message = message.replace(secret, "***")
            record.msg, record.args = message, None
        return True


class TextFormatter(logging.Formatter):
    def __init__(self, role: str, node_id: str):
        super().__init__()
        self.prefix = f"{role}[{node_id[:8]}]"

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = f"{stamp}.{int(record.msecs):03d}Z {record.levelname:<7} {self.prefix} {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def __init__(self, role: str, node_id: str):
        super().__init__()
        self.role, self.node_id = role, node_id

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "role": self.role,
            "node": self.node_id,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


def setup(role: str, node_id: str, level: str = "info", fmt: str = "text", secrets: Iterable[str] = ()) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(role, node_id) if fmt == "json" else TextFormatter(role, node_id))
    handler.addFilter(RedactFilter(secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class RepeatFilter(logging.Filter):
    """Lets a logger's first record of a kind through, then at most one per `interval`, with a count.

    For chatty libraries: librdkafka logs every reconnect attempt while a broker is down. The kind
    is the level and the first argument (librdkafka's facility, e.g. FAIL) or the message template.
    """

    def __init__(self, interval: float = 30.0):
        super().__init__()
        self.interval = interval
        self.last: dict[tuple, float] = {}
        self.suppressed: dict[tuple, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.levelno, record.args[0] if isinstance(record.args, tuple) and record.args else record.msg)
        now = time.monotonic()
        if now - self.last.get(kind, -1e9) < self.interval:
            self.suppressed[kind] = self.suppressed.get(kind, 0) + 1
            return False
        self.last[kind] = now
        count = self.suppressed.pop(kind, 0)
        if count:
            record.msg = f"{record.msg} (and {count} more like it)"
        return True


class Throttle:
    """Aggregates a repeated warning: logs the first, then at most once per `interval` with a count."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.logger, self.interval, self.clock = logger, interval, clock
        self.last: dict[str, float] = {}
        self.suppressed: dict[str, int] = {}

    def warning(self, key: str, msg: str, *args: object) -> None:
        now = self.clock()
        if now - self.last.get(key, -1e9) >= self.interval:
            count = self.suppressed.pop(key, 0)
            suffix = f" (and {count} more like it)" if count else ""
            self.logger.warning(msg + suffix, *args)
            self.last[key] = now
        else:
            self.suppressed[key] = self.suppressed.get(key, 0) + 1
