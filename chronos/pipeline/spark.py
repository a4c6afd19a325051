"""The pipeline's Spark session, and Spark's failures turned into the project's errors.

Nothing is downloaded at run time: Spark comes from the `pyspark` wheel and runs on the Java
already on the machine. Spark's own console output is cut down to errors (see
`log4j2.properties`), its progress bar is off (the jobs print their own), and a failure reaches
the user as one line and an exit code from `chronos.errors`, not as a Java stack trace.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from contextlib import contextmanager
from importlib import resources
from typing import TYPE_CHECKING, Iterator, Mapping

from chronos import errors
from chronos.errors import ChronosError, ConfigError, InputError, UnavailableError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("chronos.pipeline")

INSTALL_HINT = "install chronos-scheduler[spark] (pip install 'chronos-scheduler[spark]')"
DEFAULT_MASTER = "local[*]"
# PySpark logs every analysis error it raises as a JSON document on stderr; the jobs report them.
_PYSPARK_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")
_CHRONOS_ERROR_RE = re.compile(r"^chronos\.errors\.(\w+): (.+)$", re.MULTILINE)
_INPUT_CONDITIONS = ("PATH_NOT_FOUND", "UNABLE_TO_INFER_SCHEMA", "UNRESOLVED_COLUMN", "DATATYPE_MISMATCH",
                     "FAILED_READ_FILE", "CANNOT_READ_FILE_FOOTER", "UNSUPPORTED_DATA_SOURCE", "MALFORMED_RECORD")
_PYTHON_ERROR_RE = re.compile(r"^(\w+(?:\.\w+)*(?:Error|Exception)): (.+)$", re.MULTILINE)


def require_pyspark() -> None:
    """Fail with a one-line hint when the `spark` extra is not installed."""
    try:
        import pyspark  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"the pipeline needs PySpark and pyarrow ({exc.name} is missing): {INSTALL_HINT}") from None


def _is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def session(master: str = DEFAULT_MASTER, app_name: str = "chronos-pipeline",
            conf: Mapping[str, str] | None = None, log_level: str = "ERROR") -> "SparkSession":
    """A SparkSession for the jobs: quiet, UTC session time zone, no web UI.

    `conf` holds any further Spark settings (`spark.executor.memory`, ...). On a local master
    the executors run this very Python (so they find chronos), bound to the loopback address.
    """
    require_pyspark()
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    for name in _PYSPARK_LOGGERS:
        logging.getLogger(name).disabled = True
    logging.getLogger("py4j").setLevel(logging.WARNING)  # its INFO lines (connections opened, closed) are noise
    conf = dict(conf or {})
    if _is_local(master):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        conf.setdefault("spark.driver.memory", "2g")
        conf.setdefault("spark.sql.shuffle.partitions", str(max(4, 2 * (os.cpu_count() or 2))))
    log4j = resources.files("chronos.pipeline") / "log4j2.properties"
    java_options = f"-Dlog4j2.configurationFile={log4j}"
    if conf.get("spark.driver.extraJavaOptions"):
        java_options = f"{conf['spark.driver.extraJavaOptions']} {java_options}"
    conf["spark.driver.extraJavaOptions"] = java_options
    conf.setdefault("spark.ui.enabled", "false")
    conf.setdefault("spark.ui.showConsoleProgress", "false")
    conf.setdefault("spark.sql.session.timeZone", "UTC")
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except PySparkException as exc:
        raise UnavailableError(f"cannot start Spark on {master}: {_first_line(exc)} "
                               "(Spark needs Java 17 or newer: install it or set JAVA_HOME)") from None
    except Exception as exc:  # noqa: BLE001 - py4j and the JVM raise many kinds; all mean "no Spark"
        raise UnavailableError(f"cannot start Spark on {master}: {_first_line(exc)}") from None
    spark.sparkContext.setLogLevel(log_level.upper())
    return spark


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _java_messages(exc: BaseException) -> list[str]:
    """First lines of the Java exception's messages, outermost first, down to the root cause."""
    found: list[str] = []
    java = getattr(exc, "java_exception", None)
    while java is not None and len(found) < 20:
        try:
            message = java.getMessage()
            java = java.getCause()
        except Exception as err:  # noqa: BLE001 - the JVM may be gone; what we have is enough
            log.debug("cannot walk the Java exception: %s", err)
            break
        if message and message.strip():
            found.append(message.strip().splitlines()[0])
    return found


def translate(exc: BaseException, what: str, unknown: type[ChronosError] = ChronosError) -> ChronosError:
    """A one-line project error for a failure raised by Spark while doing `what`.

    A chronos error raised in an executor (PostgreSQL unreachable, ...) keeps its type and
    message; a missing path or an unusable input is an InputError; anything else is `unknown`
    with the first line of Spark's message (and its root cause).
    """
    text = str(exc)
    found = _CHRONOS_ERROR_RE.findall(text)
    if found:
        name, message = found[-1]
        cls = getattr(errors, name, None)
        if isinstance(cls, type) and issubclass(cls, ChronosError):
            return cls(message.strip())
    java = _java_messages(exc)
    first = java[0] if java else _first_line(exc)
    if len(java) > 1 and java[-1] not in first:
        first = f"{first} ({java[-1]})"
    condition = getattr(exc, "getCondition", lambda: None)() or ""
    if not condition:
        match = re.match(r"^\[([A-Z_.]+)\]", first)
        condition = match.group(1) if match else ""
    if condition.startswith(_INPUT_CONDITIONS):
        return InputError(f"{what}: {first}")
    found = _PYTHON_ERROR_RE.findall(text)
    if "Traceback (most recent call last)" in text and found:
        name, message = found[-1]
        return unknown(f"{what}: a task failed: {name}: {message.strip()}")
    return unknown(f"{what}: {first}")


@contextmanager
def spark_errors(what: str, unknown: type[ChronosError] = ChronosError) -> Iterator[None]:
    """Re-raise what Spark (or py4j) raises inside the block as a one-line chronos error."""
    try:
        yield
    except ChronosError:
        raise
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - every Spark failure becomes a one-line ChronosError
        log.debug("%s failed", what, exc_info=True)
        raise translate(exc, what, unknown) from None


def check_local_input(path: str) -> None:
    """A local input path that does not exist is reported before Spark starts."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", path) and not path.startswith("file://"):
        return  # hdfs://, s3a://, ...: Spark will say
    local = path[len("file://"):] if path.startswith("file://") else path
    if any(ch in local for ch in "*?[{"):
        return  # a glob: Spark expands it
    if not os.path.exists(local):
        raise InputError(f"input {path} does not exist")


FORMATS = ("parquet", "csv", "json")


def load_input(spark: "SparkSession", path: str, fmt: str, *, infer_schema: bool) -> "DataFrame":
    """A dataset in one of FORMATS, its schema resolved now so that a bad input fails here (InputError).
    CSV has a header line and RFC 4180 quoting ("" inside quotes), as Python's csv module, spreadsheets
    and databases write it; `infer_schema=False` reads its columns as text."""
    if fmt not in FORMATS:
        raise InputError(f"unknown input format {fmt!r}: use one of {', '.join(FORMATS)}")
    check_local_input(path)
    reader = spark.read.format(fmt)
    if fmt == "csv":
        reader = reader.option("header", "true").option("inferSchema", str(infer_schema).lower()).option("escape", '"')
    with spark_errors(f"cannot read {path}", InputError):
        df = reader.load(path)
        df.schema  # noqa: B018 - resolves the schema now
    return df
