"""Settings: every one is a `CHRONOS_*` environment variable and a matching CLI flag.

Values are validated once, at start, so a bad value stops a process with a one-line message
and exit code 2 instead of failing later in the hot path.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping
from urllib.parse import unquote, urlsplit

import orjson

from chronos.errors import ConfigError
from chronos.domain.shares import SLICES
from chronos.domain.ratelimit import FireRateLimits, TopicRates, parse_rate, parse_topic_rates
from chronos.codec.topics import is_topic_name


# librdkafka properties whose values are secrets: never logged, redacted from messages.
SECRET_KAFKA_KEYS = ("sasl.password", "ssl.key.password", "ssl.keystore.password",
                     "ssl.key.pem", "sasl.oauthbearer.client.secret", "sasl.oauthbearer.config")


def _positive_int(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}") from None
    if value <= 0:
        raise ConfigError(f"{name} must be greater than 0, got {value}")
    return value


def _non_negative_int(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"{name} must be 0 or more, got {value}")
    return value


_BYTE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def _bytes(name: str, raw: str) -> int:
    """A size in bytes: a whole number, or one with a binary unit (`64M`, `512k`, `1G`)."""
    match = re.fullmatch(r"\s*(\d+)\s*([kmg]?)i?b?\s*", raw, re.IGNORECASE)
    if match is None:
        raise ConfigError(f"{name} must be a size in bytes, as a whole number or with a unit (512k, 64M, 1G), "
                          f"got {raw!r}")
    value = int(match.group(1)) * _BYTE_UNITS[match.group(2).lower()]
    if value < 1 << 20:
        raise ConfigError(f"{name} must be at least 1M (a batch of ordinary messages), got {raw!r}")
    return value


def _claimers(name: str, raw: str) -> int:
    """A firer's claimers: each needs at least one of the slices the due rows fall into."""
    value = _positive_int(name, raw)
    if value > SLICES:
        raise ConfigError(f"{name} must be at most {SLICES} (a claimer claims at least one of the {SLICES} slices "
                          f"of the due rows), got {value}")
    return value


def _optional_non_negative_int(name: str, raw: str) -> int | None:
    if raw.strip().lower() in ("", "none", "off"):
        return None
    return _non_negative_int(name, raw)


def _port(name: str, raw: str) -> int:
    value = _non_negative_int(name, raw)
    if value > 65535:
        raise ConfigError(f"{name} must be a TCP port (0-65535), got {value}")
    return value


def _topic(name: str, raw: str) -> str:
    if not is_topic_name(raw):
        raise ConfigError(f"{name} is not a valid Kafka topic name: {raw!r}")
    return raw


def _optional_str(name: str, raw: str) -> str | None:
    return raw or None


def _str(name: str, raw: str) -> str:
    if not raw:
        raise ConfigError(f"{name} must not be empty")
    return raw


def _console_token(name: str, raw: str) -> str | None:
    if not raw:
        return None
    if len(raw) < 12:
        raise ConfigError(f"{name} must be at least 12 characters long (it guards the console's actions)")
    return raw


def _urls(name: str, raw: str) -> tuple[str, ...]:
    urls = tuple(u.strip() for u in raw.split(",") if u.strip())
    for url in urls:
        if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
            raise ConfigError(f"{name} must be a comma-separated list of http:// URLs, got {url!r}")
    return urls


def _address(name: str, raw: str) -> str:
    """A host's address to listen on: an IP address (0.0.0.0 every IPv4 interface, :: every interface) or
    a host name, with no port."""
    value = raw.strip()
    if not value or any(c.isspace() for c in value) or "/" in value or (value.count(":") == 1):
        raise ConfigError(f"{name} must be an IP address or a host name, without a port, got {raw!r}")
    return value


def _readable_file(name: str, raw: str) -> str | None:
    """A file a process reads when it starts the part that needs it (where its content is checked): here, that
    it can be read."""
    if not raw:
        return None
    try:
        Path(raw).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read {raw}: {exc.strerror}") from None
    return raw


def _database_url(name: str, raw: str) -> str | None:
    if not raw:
        return None
    if not raw.startswith(("postgresql://", "postgres://")):  # libpq's own test of a URI
        raise ConfigError(f"{name} must be a postgresql:// URL, got {redact_url(raw)!r}")
    return raw


CELL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
# where a list of cells is cut: whitespace, or a comma followed by the next cell's `NAME=` (a comma inside a
# multi-host URL, `postgresql://h1,h2/db`, is followed by a host, never by `NAME=`)
_CELL_CUT = re.compile(r"\s+|,(?=\s*[A-Za-z0-9][A-Za-z0-9_-]*=)")


def parse_cells(name: str, raw: str) -> tuple[tuple[str, str], ...]:
    """`NAME=URL` pairs, separated by spaces (or commas): each cell's name and PostgreSQL URL, in order."""
    cells: list[tuple[str, str]] = []
    for item in filter(None, (part.strip(" ,") for part in _CELL_CUT.split(raw.strip()))):
        cell, sep, url = item.partition("=")
        if not sep or not CELL_NAME.fullmatch(cell):
            raise ConfigError(f"{name} must be NAME=URL pairs separated by spaces (a NAME of letters, digits, - "
                              f"and _), got {redact_url(item)!r}")
        if any(cell == known for known, _ in cells):
            raise ConfigError(f"{name} names cell {cell!r} twice")
        parsed = _database_url(f"{name} (cell {cell})", url)
        assert parsed is not None  # `url` is not empty: `item` was cut after its `=`
        cells.append((cell, parsed))
    return tuple(cells)


def _choice(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        value = raw.lower()
        if value not in choices:
            raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
        return value
    return parse


def _regex(name: str, raw: str) -> str | None:
    if not raw:
        return None
    try:
        re.compile(raw)
    except re.error as exc:
        raise ConfigError(f"{name} is not a valid regular expression: {exc}") from None
    return raw


def parse_kafka_properties(name: str, raw: str) -> dict[str, str]:
    """`k=v,k=v` pairs of librdkafka properties (values may not contain commas; use the file)."""
    props: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{name} must be a list of key=value pairs, got {item.split('=')[0]!r}")
        props[key.strip()] = value.strip()
    return props


def read_properties_file(name: str, raw: str) -> dict[str, str]:
    """A Java-style properties file (`key=value` lines, `#` comments) of librdkafka settings."""
    if not raw:
        return {}
    path = Path(raw)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read {raw}: {exc.strerror}") from None
    props: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ConfigError(f"{name}: {raw} line {number} is not key=value")
        props[key.strip()] = value.strip()
    return props


@dataclass(frozen=True)
class Option:
    attr: str
    help: str
    parse: Callable[[str, str], Any]
    default: str

    @property
    def env(self) -> str:
        return "CHRONOS_" + self.attr.upper()

    @property
    def flag(self) -> str:
        return "--" + self.attr.replace("_", "-")


OPTIONS: tuple[Option, ...] = (
    Option("database_url", "PostgreSQL URL (libpq; TLS via sslmode=, sslrootcert=, ... or PGSSL* variables); "
           "default: the embedded PostgreSQL of `chronos up`", _database_url, ""),
    Option("cells", "the cells, each a PostgreSQL with the input partitions it owns: NAME=URL pairs separated by "
           "spaces (cell1=postgresql://db-1/chronos cell2=postgresql://db-2/chronos); unset: one cell, "
           "CHRONOS_DATABASE_URL. The consumers write each message to its partition's cell, the operators' "
           "commands ask every cell, and a firer or detector serves one (CHRONOS_CELL)", parse_cells, ""),
    Option("cell", "the cell of CHRONOS_CELLS this firer or detector serves; unset, under supervisord, each "
           "serves the cells in turn by its process number (process n: the cell at n modulo their count)", _optional_str, ""),
    Option("database_timeout_ms", "a statement PostgreSQL has not answered within this long is given up: the "
           "connection is dropped (a hung server answers no cancel) and opened again, to whichever server of "
           "the URL is the primary then", _positive_int, "5000"),
    Option("database_pool_mode", "how to talk to PostgreSQL through a connection pooler: session (no pooler, or "
           "PgBouncer's pool_mode=session), transaction (pool_mode=transaction: no prepared statements, settings "
           "and the staging table per transaction), or auto: probe at start which one the URL leads to",
           _choice("auto", "session", "transaction"), "auto"),
    Option("kafka_bootstrap_servers", "Kafka bootstrap servers; default: the embedded broker of `chronos up`", _optional_str, ""),
    Option("input_topic", "topic Chronos consumes delayed messages from", _topic, "chronos.input"),
    Option("output_topic", "topic Chronos publishes messages to at their deadline", _topic, "chronos.output"),
    Option("dlq_topic", "dead-letter topic for invalid messages", _topic, "chronos.dlq"),
    Option("timing_advance_ms", "publish up to this early to make up for publish latency", _non_negative_int, "50"),
    Option("hold_time_ms", "how long a firer may hold a claimed message before a peer takes it over, and a "
           "consumer its partitions while PostgreSQL (or Kafka, for its late messages) does not answer", _positive_int, "5000"),
    Option("poll_interval_ms", "firer poll interval when nothing is due", _positive_int, "100"),
    Option("failure_detection_interval_ms", "detector scan interval", _positive_int, "500"),
    Option("lookahead_ms", "firer claims rows this far ahead and publishes each from memory at its deadline",
           _non_negative_int, "300"),
    Option("batch_size", "consumer batch (messages per poll) and firer claim limit", _positive_int, "2000"),
    Option("firer_max_held_bytes", "a firer claims no more while the messages it holds (claimed, not yet "
           "published, acknowledged and deleted) come to this many bytes of key, value and headers, or to "
           "sixteen batches; a claim may go over it by one batch (units k, M, G)", _bytes, "64M"),
    Option("firer_claimers", "claims a firer has on their way at once, each on a connection of its own and on "
           "its own part of the firer's share of the due rows, so the next claim runs while the last one's rows "
           "are published; 1 to 16 (one under fire-rate limits, whatever this says). More than one pays where "
           "PostgreSQL has cores to spare: on two cores shared with everything else, a second claimer slowed the "
           "consumers' writes more than it sped the claims", _claimers, "1"),
    Option("firer_claim", "how a firer claims its due rows: delete (the claim deletes the rows in a transaction "
           "the firer holds open, one session per batch in flight, until Kafka acknowledged them, then commits; "
           "PostgreSQL ends the transaction of a firer silent for the hold time, and its rows are back: half the "
           "row versions, no detector needed for them) or stamp (each claimed row is stamped as the firer's, "
           "deleted once Kafka acknowledged it, handed back by a detector after the hold time when its firer "
           "dies; one session less per batch in flight). Firers of both kinds may run beside each other on one "
           "store (a rollout); recurring schedules' occurrences are stamped either way",
           _choice("delete", "stamp"), "delete"),
    Option("move_rate", "rows a second `chronos cells move` and `add` copy ahead, wake and delete, in statements of a "
           "tenth of that (0, the default: as fast as the databases go)", _non_negative_int, "0"),
    Option("consumer_group", "Kafka consumer group of the consumers", _str, "chronos"),
    Option("kafka_properties", "extra librdkafka properties as key=value,key=value (TLS, SASL, ...)",
           parse_kafka_properties, ""),
    Option("kafka_properties_file", "file of extra librdkafka properties (key=value lines); "
           "the place for secrets", read_properties_file, ""),
    Option("allowed_topics", "regular expression of destination topics a message may name in chronosTopic "
           "(default: only the output topic)", _regex, ""),
    Option("max_lateness_ms", "dead-letter messages whose deadline is further in the past (default: no limit)",
           _optional_non_negative_int, ""),
    Option("max_publish_attempts", "a message its destination keeps refusing goes to the dead-letter topic after "
           "this many failed publishes (retried with exponential backoff in between)", _positive_int, "10"),
    Option("publish_stall_ms", "a firer or consumer whose publishes get no acknowledgement for this long while "
           "messages wait replaces its Kafka producer, says so once in its log, and fails /healthz until one "
           "is acknowledged", _positive_int, "10000"),
    Option("log_level", "log level", _choice("debug", "info", "warning", "error"), "info"),
    Option("log_format", "log format", _choice("text", "json"), "text"),
    Option("metrics_port", "port of /metrics and /healthz (0: off); under supervisord, base + role offset "
           "(consumer 0, firer 100, detector 200) + CHRONOS_PROCESS_NUM", _port, "0"),
    Option("metrics_address", "address /metrics and /healthz listen on: 0.0.0.0 (every IPv4 interface), :: (every "
           "interface), or one address of the host, such as its address on the network Prometheus scrapes from; "
           "also the address `chronos targets` lists and the console is told to reach the process at", _address,
           "0.0.0.0"),
    Option("metrics_web_config_file", "TLS and basic authentication for /metrics: a web configuration file as "
           "Prometheus's exporters read it (tls_server_config: cert_file, key_file, min_version; basic_auth_users: "
           "name: bcrypt hash). /healthz answers without a password, over HTTPS too", _readable_file, ""),
    Option("metrics_scrape_config_file", "how the console, `chronos status` and `chronos health` reach the "
           "processes' /metrics once it has a web configuration: a YAML file of Prometheus's scrape settings "
           "(basic_auth: username, password_file; tls_config: ca_file, server_name, insecure_skip_verify)",
           _readable_file, ""),
    Option("health_window_ms", "/healthz fails when the loop, PostgreSQL or Kafka was last ok longer ago",
           _positive_int, "10000"),
    Option("console_host", "address the web console listens on", _str, "127.0.0.1"),
    Option("console_port", "port of the web console", _port, "9700"),
    Option("console_token", "token that unlocks the web console's actions (cancel, fire now, reschedule; replay "
           "and drop parked messages); unset: the console is read-only", _console_token, ""),
    Option("console_metrics_urls", "comma-separated /metrics URLs of processes, for the console's rates "
           "and lateness and the PostgreSQL server each process uses (console, `chronos status`, `chronos "
           "health`), besides those the processes of every host say in PostgreSQL they serve (console, "
           "`chronos status`)", _urls, ""),
    Option("confirm_above", "cancel, fire-now and reschedule need --yes to change more messages than this",
           _non_negative_int, "1000"),
    Option("fire_rate_limits", "publish at most this fast to these destination topics, all firers together: "
           "TOPIC=RATE pairs, a TOPIC may hold * (orders=500,payments.*=100/min,audit=unlimited); "
           "RATE is messages per second, or N/min, N/h", parse_topic_rates, ""),
    Option("fire_rate_default", "the RATE of every destination topic CHRONOS_FIRE_RATE_LIMITS does not name "
           "(default: unlimited)", parse_rate, ""),
)


@dataclass(frozen=True)
class Settings:
    database_url: str | None = None
    cells: tuple[tuple[str, str], ...] = ()
    cell: str | None = None
    database_timeout_ms: int = 5000
    database_pool_mode: str = "auto"
    kafka_bootstrap_servers: str | None = None
    input_topic: str = "chronos.input"
    output_topic: str = "chronos.output"
    dlq_topic: str = "chronos.dlq"
    timing_advance_ms: int = 50
    hold_time_ms: int = 5000
    poll_interval_ms: int = 100
    failure_detection_interval_ms: int = 500
    lookahead_ms: int = 300
    batch_size: int = 2000
    firer_max_held_bytes: int = 64 << 20
    firer_claimers: int = 1
    firer_claim: str = "delete"
    move_rate: int = 0
    consumer_group: str = "chronos"
    kafka_properties: dict[str, str] = field(default_factory=dict)
    kafka_properties_file: dict[str, str] = field(default_factory=dict)
    allowed_topics: str | None = None
    max_lateness_ms: int | None = None
    max_publish_attempts: int = 10
    publish_stall_ms: int = 10000
    log_level: str = "info"
    log_format: str = "text"
    metrics_port: int = 0
    metrics_address: str = "0.0.0.0"
    metrics_web_config_file: str | None = None
    metrics_scrape_config_file: str | None = None
    health_window_ms: int = 10000
    console_host: str = "127.0.0.1"
    console_port: int = 9700
    console_token: str | None = None
    console_metrics_urls: tuple[str, ...] = ()
    confirm_above: int = 1000
    fire_rate_limits: TopicRates = TopicRates()
    fire_rate_default: float | None = None

    def validate(self) -> "Settings":
        if self.lookahead_ms * 2 >= self.hold_time_ms:
            raise ConfigError(
                f"CHRONOS_LOOKAHEAD_MS ({self.lookahead_ms}) must be less than half of "
                f"CHRONOS_HOLD_TIME_MS ({self.hold_time_ms}) so claimed rows are fired long before a peer "
                f"may take them over")
        if self.cell is not None and self.cell not in dict(self.cells):
            raise ConfigError(f"CHRONOS_CELL names cell {self.cell!r}, which CHRONOS_CELLS does not list"
                              + (f" ({', '.join(name for name, _ in self.cells)})" if self.cells else ""))
        return self

    def databases(self) -> dict[str, str]:
        """Every cell's database URL by cell name (CHRONOS_CELLS); without cells, CHRONOS_DATABASE_URL as the one
        cell, named "" (ConfigError when neither is set)."""
        if self.cells:
            return dict(self.cells)
        return {"": self.require_database()}

    @property
    def kafka_config(self) -> dict[str, str]:
        """Extra librdkafka properties: the file first, then the inline list overrides it."""
        return {**self.kafka_properties_file, **self.kafka_properties}

    @property
    def fire_rates(self) -> FireRateLimits:
        return FireRateLimits(self.fire_rate_limits, self.fire_rate_default)

    @property
    def allowed_topics_re(self) -> re.Pattern[str]:
        return re.compile(self.allowed_topics) if self.allowed_topics else re.compile(re.escape(self.output_topic))

    def secrets(self) -> list[str]:
        """Every secret value this process knows, for the log redaction filter."""
        found = [v for k, v in self.kafka_config.items() if k in SECRET_KAFKA_KEYS and v]
        if self.console_token:
            found.append(self.console_token)
        for url in [self.database_url, *(url for _, url in self.cells)]:
            if url:
                found += database_passwords(url)
        return found

    def require_database(self) -> str:
        """The database URL, for commands that need PostgreSQL only; a configuration error if unset."""
        if not self.database_url:
            raise ConfigError("CHRONOS_DATABASE_URL is not set: give --database-url or --ready-file")
        return self.database_url

    def require_services(self) -> "Settings":
        if not self.database_url and not self.cells:
            raise ConfigError("CHRONOS_DATABASE_URL is not set (and no ready file was found): "
                              "start the stack with `chronos up`, or set --database-url")
        if not self.kafka_bootstrap_servers:
            raise ConfigError("CHRONOS_KAFKA_BOOTSTRAP_SERVERS is not set (and no ready file was found): "
                              "start the stack with `chronos up`, or set --kafka-bootstrap-servers")
        return self


def add_arguments(parser: argparse.ArgumentParser, only: tuple[str, ...] | None = None) -> None:
    """Add one flag per setting; the default comes from the environment (shown in --help)."""
    group = parser.add_argument_group("settings (each also read from its environment variable)")
    for opt in OPTIONS:
        if only is not None and opt.attr not in only:
            continue
        shown = "" if opt.attr in ("database_url", "cells", "console_token") else f" (default: {opt.default or 'unset'})"
        group.add_argument(opt.flag, dest=opt.attr, default=None, metavar=opt.env,
                           help=f"{opt.help} [env {opt.env}]{shown}")
    parser.add_argument("--ready-file", default=None,
                        help="read database URL, bootstrap servers and topics from the JSON file "
                             "`chronos up --ready-file` wrote [env CHRONOS_READY_FILE]")


READY_KEYS = {"database_url": "database_url", "cells": "cells", "bootstrap_servers": "kafka_bootstrap_servers",
              "input_topic": "input_topic", "output_topic": "output_topic", "dlq_topic": "dlq_topic",
              "kafka_properties": "kafka_properties", "metrics_urls": "console_metrics_urls"}


def load(args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None, *,
         default_ready_file: bool = True) -> Settings:
    """Build Settings from flags, then environment variables, then a ready file, then defaults.

    Without services configured, the ready file of a `chronos up` in this directory
    (`.chronos/ready.json`) is used if present, unless `default_ready_file` is False.
    """
    environ = os.environ if environ is None else environ
    raw: dict[str, str] = {}
    for opt in OPTIONS:
        value = getattr(args, opt.attr, None) if args is not None else None
        if value is None:
            value = environ.get(opt.env)
        if value is not None:
            raw[opt.attr] = value
    ready_path = find_ready_file(args, environ, default=default_ready_file and not (
        raw.get("database_url") or raw.get("cells") or raw.get("kafka_bootstrap_servers")))
    if ready_path:
        ready = read_ready_file(ready_path)
        for key, attr in READY_KEYS.items():
            value = ready.get(key)
            if attr not in raw and value:
                raw[attr] = (",".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict)
                             else ",".join(map(str, value)) if isinstance(value, list) else str(value))
    values: dict[str, Any] = {}
    for opt in OPTIONS:
        text = raw.get(opt.attr, opt.default)
        parsed = opt.parse(opt.env, text)
        values[opt.attr] = parsed
    return Settings(**values).validate()


def find_ready_file(args: argparse.Namespace | None, environ: Mapping[str, str], *, default: bool) -> str | None:
    """The ready file to read: --ready-file, else CHRONOS_READY_FILE, else (with `default`) the one of a
    `chronos up` in this directory (`.chronos/ready.json`, or under CHRONOS_DATA_DIR) if it exists."""
    path = (getattr(args, "ready_file", None) if args is not None else None) or environ.get("CHRONOS_READY_FILE")
    if default and not path:
        here = Path(environ.get("CHRONOS_DATA_DIR", ".chronos")) / "ready.json"
        path = str(here) if here.is_file() else None
    return path


def read_ready_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        data = orjson.loads(Path(path).read_bytes())
    except FileNotFoundError:
        raise ConfigError(f"ready file {path} does not exist (is `chronos up --ready-file {path}` running?)") from None
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ConfigError(f"ready file {path} cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"ready file {path} does not hold a JSON object")
    return data


# `scheme://user:` — the start of a URL whose userinfo holds a password.
_URL_USER_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^:@/\s]*:")
# The start of a URL's query (`?key=`): an `@` after it is not the end of the userinfo.
_QUERY_START_RE = re.compile(r"\?[\w%.-]+=")
# A URL query parameter; libpq percent-decodes keys as well as values.
_QUERY_PARAM_RE = re.compile(r"(?P<key>[?&][^=&\s]+=)(?P<value>[^&\s]*)")
# A libpq `key=value` pair whose key names a password (`password`, `sslpassword`): the value is
# single-quoted (backslash escapes, unterminated up to the end) or runs to the next whitespace.
_CONNINFO_RE = re.compile(r"(?<!\S)(?P<key>[\w.-]*password\s*=\s*)"
                          r"(?P<value>'(?:[^'\\]|\\.)*(?:'|\\?$)|(?:[^\s\\]|\\.)+)", re.IGNORECASE)


def _userinfo_passwords(text: str) -> list[tuple[int, int]]:
    """(start, end) of each URL userinfo password in `text`. Generous on purpose: the password
    runs to the last `@` of its line before the query, so an unescaped `/`, `@`, `?` or space in
    it stays inside."""
    spans: list[tuple[int, int]] = []
    for match in _URL_USER_RE.finditer(text):
        if spans and match.start() < spans[-1][1]:
            continue
        line_end = text.find("\n", match.end())
        region = text[match.end():len(text) if line_end < 0 else line_end]
        query = _QUERY_START_RE.search(region)
        at = region.rfind("@", 0, query.start() if query else len(region))
        if at >= 0:
            spans.append((match.end(), match.end() + at))
    return spans


def _is_password_key(key: str) -> bool:
    return "password" in unquote(key).lower()


def redact_url(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` (a database URL, a libpq `key=value` string, or a message holding either, such as a
    driver error) with every password replaced by ***: a URL's `user:password@` and its
    `?password=` / `sslpassword=` parameters, `password=...` pairs (quoted or not), and each of
    `secrets` wherever it appears."""
    for start, end in reversed(_userinfo_passwords(text)):
        text = text[:start] + "***" + text[end:]
    text = _QUERY_PARAM_RE.sub(lambda m: m["key"] + "***" if _is_password_key(m["key"][1:-1]) else m[0], text)
    text = _CONNINFO_RE.sub(lambda m: m["key"] + "***", text)
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _unescape_conninfo(value: str) -> str:
    """A conninfo value as libpq reads it: quotes removed, backslash escapes resolved."""
    quoted = re.fullmatch(r"'((?:[^'\\]|\\.)*)'?", value, re.DOTALL)
    return re.sub(r"\\(.)", r"\1", quoted.group(1) if quoted else value, flags=re.DOTALL)


def database_passwords(url: str) -> list[str]:
    """Every password in a database URL or libpq `key=value` string, as written and as libpq
    reads it (percent-decoded, unquoted), for the log redaction filter. libpq ends a URL's
    password at its first `@` and reads the rest as the host, which its errors then quote: those
    pieces count too."""
    found: set[str] = set()
    for start, end in _userinfo_passwords(url):
        found |= {url[start:end], unquote(url[start:end]), *url[start:end].split("@")[1:]}
    for match in _QUERY_PARAM_RE.finditer(url):
        if _is_password_key(match["key"][1:-1]):
            found |= {match["value"], unquote(match["value"])}
    for match in _CONNINFO_RE.finditer(url):
        found |= {match["value"], _unescape_conninfo(match["value"])}
    return sorted(s for s in found if s and s != "***")


def to_environ(settings: Settings) -> dict[str, str]:
    """The settings as CHRONOS_* variables, for child processes (supervisord programs)."""
    env: dict[str, str] = {}
    for opt in OPTIONS:
        value = getattr(settings, opt.attr)
        if value is None or opt.attr == "kafka_properties_file":
            continue
        if isinstance(value, dict):
            if not value:
                continue
            value = ",".join(f"{k}={v}" for k, v in value.items())
        elif opt.attr == "cells":
            if not value:
                continue
            value = " ".join(f"{name}={url}" for name, url in value)
        elif isinstance(value, tuple):
            if not value:
                continue
            value = ",".join(value)
        env[opt.env] = str(value)
    return env


def replace(settings: Settings, **changes: Any) -> Settings:
    return dataclasses.replace(settings, **changes).validate()

