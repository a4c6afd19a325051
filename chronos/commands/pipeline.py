"""`chronos pipeline schedule` and `chronos pipeline report`: the Spark jobs (chronos/pipeline/), their
flags and their handlers.

Importing this module does not import PySpark (the `chronos` command imports it to build its
parser); the handlers do, when they run.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from chronos import config
from chronos.errors import ConfigError

MASTER_ENV = "CHRONOS_SPARK_MASTER"

SCHEDULE_HELP = """\
Validate a dataset of messages by the consumer's rules and write the valid ones into the store,
in parallel on Spark: one COPY stream per partition; a chunk with ids already waiting goes through
a staging table and INSERT ... ON CONFLICT (id) DO NOTHING, so running it again schedules nothing
twice. The running firers then fire them like any other message.

Columns:
  id            text (or a whole number)              chronosMessageId
  deadline      ISO-8601 text, epoch ms (text or whole number), or a timestamp (exact to the µs;
                without a time zone it is UTC)         chronosDeadline
  key, value    text (sent as UTF-8) or binary; null for a null key / a tombstone
  topic         optional: destination topic (null: the output topic)      chronosTopic
  ordering_key  optional                                                  chronosOrderingKey
  headers       optional: the message's own headers, in order: a JSON object {"k": "v"} or a JSON
                list of [key, value] pairs [["k", "v"], ["k", null]] (repeated keys kept); or a
                map column, or a list of {key, value} structs (Spark's Kafka shape, binary values)

Invalid rows are written to --rejects (in the input's format, with a `reason` column).

With cells (CHRONOS_CELLS), each row is written to the cell of the input partition its routing key
(ordering_key, else id) gives, where the same message sent through Kafka would be.
"""

REPORT_HELP = """\
SLA analytics over delivery records (the SLA harness's records.parquet): writes OUT/report.json
(count, throughput over time, exact jitter p50/p99/p99.9/max overall and per minute, early and
late counts, SLA verdict) and PNG charts (jitter histogram, jitter and throughput over time).

Columns: id, deadline, delivered_at, and optionally sent_at, node, copies. Times are timestamps,
floating-point epoch seconds, or whole-number epoch milliseconds. Jitter = delivered_at − deadline.
"""


def _guess_format(path: str) -> str:
    name = path.rstrip("/").lower()
    if name.endswith((".csv", ".csv.gz")):
        return "csv"
    if name.endswith((".json", ".jsonl", ".ndjson", ".json.gz", ".jsonl.gz")):
        return "json"
    return "parquet"


def _spark_conf(items: list[str] | None) -> dict[str, str]:
    conf = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--conf must be KEY=VALUE, got {item!r}")
        conf[key.strip()] = value.strip()
    return conf


def _add_spark_arguments(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("spark")
    group.add_argument("--master", default=os.environ.get(MASTER_ENV) or "local[*]",
                       help=f"Spark master URL: local[*], local[4], spark://host:7077, yarn, k8s://... "
                            f"[env {MASTER_ENV}] (default: local[*])")
    group.add_argument("--conf", action="append", metavar="KEY=VALUE",
                       help="a Spark setting, e.g. spark.executor.memory=4g (repeatable)")
    group.add_argument("--spark-log-level", default="ERROR", choices=("ERROR", "WARN", "INFO", "DEBUG"),
                       help="Spark's own log level (default: ERROR)")


def add_parser(sub: Any) -> None:
    """The `pipeline` command group and its jobs."""
    parser = sub.add_parser("pipeline", help="Spark jobs: bulk scheduling and SLA reports (the spark extra)",
                            description="Spark jobs (pip install 'chronos-scheduler[spark]'); PySpark is imported "
                                        "only when a job runs")
    sub = parser.add_subparsers(dest="pipeline_command", required=True, metavar="JOB")

    p = sub.add_parser("schedule", help="bulk-schedule a dataset of messages (Spark)", description=SCHEDULE_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True, help="dataset path (file, directory or glob; any Spark filesystem)")
    p.add_argument("--format", choices=("parquet", "csv", "json"), default=None,
                   help="input format (default: from the file name, else parquet); CSV needs a header line")
    p.add_argument("--rejects", default=None, metavar="PATH",
                   help="write invalid rows here with their reason (replaced if it exists)")
    p.add_argument("--partitions", type=int, default=None,
                   help="repartition the input to this many partitions (default: as read, and at least "
                        "one per core)")
    p.add_argument("--no-progress", action="store_true", help="do not print progress lines")
    config.add_arguments(p, only=("database_url", "cells", "database_pool_mode", "output_topic", "allowed_topics",
                                  "timing_advance_ms", "max_lateness_ms"))
    _add_spark_arguments(p)
    p.set_defaults(func=run_schedule)

    p = sub.add_parser("report", help="SLA report over delivery records (Spark)", description=REPORT_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True, help="delivery records (e.g. the SLA harness's records.parquet)")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for report.json and the charts")
    p.add_argument("--format", choices=("parquet", "csv", "json"), default=None,
                   help="input format (default: from the file name, else parquet)")
    p.add_argument("--max-p999-ms", type=float, default=500.0,
                   help="SLA: p99.9 jitter at most this (default: 500)")
    p.add_argument("--min-rate", type=float, default=None,
                   help="SLA: mean delivery rate at least this many per second (default: not checked)")
    p.add_argument("--bucket-seconds", type=int, default=None,
                   help="time step of the series (default: 1 s up to an hour of records, coarser beyond)")
    p.add_argument("--no-charts", action="store_true", help="write report.json only")
    p.add_argument("--fail-on-breach", action="store_true", help="exit with status 1 when the SLA verdict is fail")
    config.add_arguments(p, only=("timing_advance_ms",))
    _add_spark_arguments(p)
    p.set_defaults(func=run_report)


def run_schedule(args: argparse.Namespace) -> int:
    from chronos.domain.intake import Rules
    from chronos.pipeline import spark as sp

    sp.require_pyspark()
    from chronos.pipeline import schedule

    settings = config.load(args)
    databases = settings.databases()
    if args.partitions is not None and args.partitions <= 0:
        raise ConfigError("--partitions must be greater than 0")
    rules = Rules.from_settings(settings)
    fmt = args.format or _guess_format(args.input)
    # What can be checked without Spark is checked before it starts (several seconds).
    sp.check_local_input(args.input)
    pool_mode = settings.database_pool_mode
    for url in databases.values():
        pool_mode = schedule.check_store(url, pool_mode)
    spark = sp.session(args.master, "chronos-pipeline-schedule", _spark_conf(args.conf), args.spark_log_level)
    try:
        result = schedule.run(spark, input_path=args.input, fmt=fmt, database_url=settings.database_url,
                              rules=rules, rejects_path=args.rejects, partitions=args.partitions,
                              progress=not args.no_progress, check=False, pool_mode=pool_mode,
                              cells=dict(settings.cells) or None)
    finally:
        spark.stop()
    print(schedule.summary(result), flush=True)
    return 0


def run_report(args: argparse.Namespace) -> int:
    from chronos.pipeline import spark as sp

    sp.require_pyspark()
    from chronos.pipeline import report

    settings = config.load(args, default_ready_file=False)
    if args.max_p999_ms <= 0:
        raise ConfigError("--max-p999-ms must be greater than 0")
    if args.bucket_seconds is not None and args.bucket_seconds <= 0:
        raise ConfigError("--bucket-seconds must be greater than 0")
    thresholds = report.Thresholds(p999_ms=args.max_p999_ms, timing_advance_ms=settings.timing_advance_ms,
                                   min_rate=args.min_rate)
    fmt = args.format or _guess_format(args.input)
    sp.check_local_input(args.input)
    if not args.no_charts:
        from chronos.pipeline import charts
        charts.require_matplotlib()
    spark = sp.session(args.master, "chronos-pipeline-report", _spark_conf(args.conf), args.spark_log_level)
    try:
        result = report.run(spark, input_path=args.input, out_dir=args.out, fmt=fmt, thresholds=thresholds,
                            bucket=args.bucket_seconds, charts=not args.no_charts)
    finally:
        spark.stop()
    print(report.summary(result, args.out), flush=True)
    if args.fail_on_breach and result["sla"]["verdict"] != "pass":
        print("chronos pipeline report: the SLA verdict is fail", file=sys.stderr)
        return 1
    return 0
