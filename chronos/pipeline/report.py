"""SLA analytics over delivery records: jitter percentiles, throughput, early/late counts, verdict.

Input: one record per delivered message (the SLA harness's `records.parquet`) with columns
`id`, `deadline`, `delivered_at`, and optionally `sent_at`, `node` (the firing node) and `copies`
(how many times it was delivered). Times are timestamps, or numbers: floating point = epoch
seconds, whole numbers = epoch milliseconds. A record without `delivered_at` is undelivered.

Jitter = delivered_at − deadline, in milliseconds, computed as
`(delivered_at_us − deadline_us) / 1000` from epoch microseconds (a float number of seconds
times 1e6). Percentiles are exact, with numpy's default ("linear") definition: sort-based on
Spark, not sketched, so they match `numpy.quantile` on the same values.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import orjson

from chronos.errors import InputError
from chronos.pipeline.spark import load_input, spark_errors

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Row, SparkSession
    from pyspark.sql.types import DataType

REQUIRED_COLUMNS = ("id", "deadline", "delivered_at")
OPTIONAL_COLUMNS = ("sent_at", "node", "copies")
TIME_COLUMNS = ("deadline", "delivered_at", "sent_at")
PERCENTILES = (("p50", 0.5), ("p99", 0.99), ("p999", 0.999))
HISTOGRAM_BINS = 100
MAX_SERIES_POINTS = 3600


@dataclass(frozen=True)
class Thresholds:
    """The SLA: p99.9 jitter at most `p999_ms`; nothing earlier than −`timing_advance_ms`;
    nothing lost; optionally a mean delivery rate of at least `min_rate`."""

    p999_ms: float = 500.0
    timing_advance_ms: float = 50.0
    min_rate: float | None = None


def epoch_us(name: str, dtype: "DataType") -> "Column":
    """A time column as epoch microseconds (double): timestamps exactly, float seconds, integer ms."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    col = F.col(name)
    if isinstance(dtype, T.TimestampType):
        return F.unix_micros(col).cast("double")
    if isinstance(dtype, T.TimestampNTZType):  # no time zone: UTC (the session's)
        return F.unix_micros(col.cast("timestamp")).cast("double")
    if isinstance(dtype, T.FractionalType):  # NaN (the harness's "never delivered") is a missing time
        return F.when(F.isnan(col.cast("double")), None).otherwise(col.cast("double") * 1e6)
    if isinstance(dtype, T.IntegralType):
        return col.cast("double") * 1e3
    if isinstance(dtype, T.StringType):  # ISO-8601 text
        return F.unix_micros(F.try_to_timestamp(col)).cast("double")
    raise InputError(f"column {name} has type {dtype.simpleString()}: use timestamps, epoch seconds "
                     f"(floating point) or epoch milliseconds (whole numbers)")


def read_records(spark: "SparkSession", path: str, fmt: str) -> "DataFrame":
    """The records with the columns the report uses: id, node, deadline_us, delivered_us,
    sent_us, copies, jitter_ms."""
    from pyspark.sql import functions as F

    df = load_input(spark, path, fmt, infer_schema=True)
    schema = df.schema
    missing = [c for c in REQUIRED_COLUMNS if c not in schema.names]
    if missing:
        raise InputError(f"{path} has the wrong schema: missing column(s) {', '.join(missing)} (expected "
                         f"{', '.join(REQUIRED_COLUMNS)} and optionally {', '.join(OPTIONAL_COLUMNS)}; "
                         f"it has {', '.join(schema.names) or 'none'})")
    fields = {f.name: f.dataType for f in schema.fields}
    cols = [F.col("id").cast("string").alias("id"),
            (F.col("node").cast("string") if "node" in fields else F.lit(None).cast("string")).alias("node"),
            (F.col("copies").cast("long") if "copies" in fields else F.lit(None).cast("long")).alias("copies")]
    for name in TIME_COLUMNS:
        us = epoch_us(name, fields[name]) if name in fields else F.lit(None).cast("double")
        cols.append(us.alias(f"{name.removesuffix('_at')}_us" if name != "deadline" else "deadline_us"))
    with spark_errors(f"cannot read {path}"):
        out = df.select(*cols)
        return out.withColumn("jitter_ms", (F.col("delivered_us") - F.col("deadline_us")) / 1000.0)


def exact_percentiles(df: "DataFrame", value: str, probs: Sequence[tuple[str, float]],
                      by: Sequence[str] = ()) -> "DataFrame":
    """Exact percentiles of `value` (per group of `by`), as numpy.quantile's "linear" method.

    Rank-based: each group is sorted, the two values around rank (n − 1)·q are picked and
    interpolated exactly as numpy does, so the result equals numpy's on the same values.
    Columns: `by`..., `n`, and one per name in `probs`.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    values = df.where(F.col(value).isNotNull())
    # Group sizes by a (small) aggregate joined back, not a window count: that one would buffer
    # each whole group in the executor, while row_number streams through the sorted group.
    counts = F.broadcast(values.groupBy(*by).agg(F.count(F.lit(1)).alias("n")))
    keys = [F.col(c) for c in by] if by else [F.lit(0)]
    ranked = values.select(*by, F.col(value).alias("_v"),
                           (F.row_number().over(Window.partitionBy(*keys).orderBy(F.col(value))) - 1).alias("_r"))
    ranked = ranked.join(counts, list(by)) if by else ranked.crossJoin(counts)
    n, r = F.col("n"), F.col("_r")

    def index(q: float) -> "Column":
        return (n - 1).cast("double") * F.lit(q)

    wanted = None
    for _, q in probs:
        lo = F.floor(index(q))
        hit = (r == lo) | (r == lo + 1)
        wanted = hit if wanted is None else wanted | hit
    assert wanted is not None  # callers always ask for at least one percentile
    picked = ranked.where(wanted)
    aggs = [F.max("n").alias("n")]  # one value per group; grouping by `by` alone reuses the window's partitioning
    for name, q in probs:
        lo = F.floor(index(q))
        aggs.append(F.max(F.when(r == lo, F.col("_v"))).alias(f"_{name}_a"))
        aggs.append(F.max(F.when(r == F.least(lo + 1, n - 1), F.col("_v"))).alias(f"_{name}_b"))
    grouped = picked.groupBy(*by).agg(*aggs)
    outs = []
    for name, q in probs:
        a, b = F.col(f"_{name}_a"), F.col(f"_{name}_b")
        t = index(q) - F.floor(index(q))
        # numpy's _lerp: a + (b − a)·t below one half, b − (b − a)·(1 − t) from there
        outs.append(F.when(t >= 0.5, b - (b - a) * (1 - t)).otherwise(a + (b - a) * t).alias(name))
    return grouped.select(*by, "n", *outs)


def _iso(us: float | None) -> str | None:
    if us is None or (isinstance(us, float) and math.isnan(us)):
        return None
    return datetime.fromtimestamp(us / 1e6, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _num(x: Any, digits: int | None = None) -> float | None:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return None
    return float(x) if digits is None else round(float(x), digits)


def bucket_seconds(span_s: float) -> int:
    """1 s buckets up to an hour of records; coarser beyond, so series stay at most 3,600 points."""
    for size in (1, 10, 60, 600, 3600, 86400):
        if span_s / size <= MAX_SERIES_POINTS:
            return size
    return 86400


def _one_row(df: "DataFrame") -> "Row":
    """The row of a frame that always has exactly one (an aggregate over the whole input)."""
    row = df.first()
    assert row is not None, "a single-row aggregate returned no row"
    return row


def compute(records: "DataFrame", thresholds: Thresholds, bucket: int | None = None) -> dict[str, Any]:
    """The report as a dict (what report.json holds)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    base = records.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        delivered = base.where(F.col("delivered_us").isNotNull() & F.col("deadline_us").isNotNull())
        totals = _one_row(base.agg(
            F.count(F.lit(1)).alias("records"),
            F.count("deadline_us").alias("with_deadline"),
            F.count(F.when(F.col("deadline_us").isNotNull(), F.col("delivered_us"))).alias("delivered"),
            F.count("copies").alias("with_copies"),
            F.count("node").alias("with_node"),
            F.sum(F.greatest(F.col("copies") - 1, F.lit(0))).alias("extra_copies"),
            F.min("delivered_us").alias("first_us"), F.max("delivered_us").alias("last_us"),
            F.min("jitter_ms").alias("min"), F.max("jitter_ms").alias("max"), F.avg("jitter_ms").alias("mean"),
            F.sum(F.when(F.col("jitter_ms") < -thresholds.timing_advance_ms, 1).otherwise(0)).alias("early"),
            F.sum(F.when(F.col("jitter_ms") > thresholds.p999_ms, 1).otherwise(0)).alias("late"),
            F.sum(F.when(F.col("sent_us") > F.col("deadline_us"), 1).otherwise(0)).alias("sent_after_deadline"),
            F.count("sent_us").alias("with_sent"),
        )).asDict()
        n_delivered = totals["delivered"]
        first_us, last_us = totals["first_us"], totals["last_us"]
        span_s = (last_us - first_us) / 1e6 if n_delivered else 0.0
        bucket = bucket or bucket_seconds(span_s)

        overall = {name: None for name, _ in PERCENTILES}
        if n_delivered:
            row = _one_row(exact_percentiles(delivered, "jitter_ms", PERCENTILES))
            overall = {name: row[name] for name, _ in PERCENTILES}

        minute = (F.floor(F.col("deadline_us") / 60e6) * 60).alias("minute")
        per_minute = _grouped(delivered.withColumn("minute", minute), "minute")
        jitter_series = per_minute
        if bucket != 60:
            step = (F.floor(F.col("deadline_us") / (bucket * 1e6)) * bucket).alias("t")
            jitter_series = _grouped(delivered.withColumn("t", step), "t")

        t_col = (F.floor(F.col("delivered_us") / (bucket * 1e6)) * bucket).cast("long")
        counts = {r["t"]: r["count"] for r in
                  delivered.groupBy(t_col.alias("t")).count().collect()}
        throughput = []
        if counts:
            t0, t1 = min(counts), max(counts)
            for t in range(t0, t1 + bucket, bucket):
                c = counts.get(t, 0)
                throughput.append({"t": _iso(t * 1e6), "count": c, "per_s": c / bucket})

        histogram: dict[str, list[Any]] = {"edges": [], "counts": []}
        if n_delivered:
            lo, hi = totals["min"], totals["max"]
            width = (hi - lo) / HISTOGRAM_BINS if hi > lo else 1.0
            idx = F.least(F.floor((F.col("jitter_ms") - F.lit(lo)) / F.lit(width)), F.lit(HISTOGRAM_BINS - 1))
            bins = {r["b"]: r["count"] for r in delivered.groupBy(idx.cast("int").alias("b")).count().collect()}
            histogram = {"edges": [lo + i * width for i in range(HISTOGRAM_BINS + 1)],
                         "counts": [bins.get(i, 0) for i in range(HISTOGRAM_BINS)]}

        if totals["with_copies"]:  # the harness counts repeated deliveries of one record
            duplicates = totals["extra_copies"]
        else:  # one record per delivery: repeated ids
            duplicates = n_delivered - delivered.select("id").distinct().count()
        nodes = []
        if totals["with_node"]:
            nodes = sorted(({"node": r["node"], "count": r["count"], "max_ms": _num(r["max"]),
                             "mean_ms": _num(r["mean"])}
                            for r in delivered.where(F.col("node").isNotNull()).groupBy("node")
                            .agg(F.count(F.lit(1)).alias("count"), F.max("jitter_ms").alias("max"),
                                 F.avg("jitter_ms").alias("mean")).collect()), key=lambda x: x["node"])
    finally:
        base.unpersist()

    undelivered = totals["with_deadline"] - n_delivered
    mean_rate = n_delivered / span_s if span_s > 0 else None
    p999 = overall["p999"]
    checks = {
        "p999_within": p999 is not None and p999 <= thresholds.p999_ms,
        "none_early": totals["early"] == 0 if n_delivered else True,
        "none_lost": undelivered == 0,
    }
    if thresholds.min_rate is not None:
        checks["min_rate"] = mean_rate is not None and mean_rate >= thresholds.min_rate
    return {
        "records": totals["records"],
        "delivered": n_delivered,
        "undelivered": undelivered,
        "without_deadline": totals["records"] - totals["with_deadline"],
        "duplicates": duplicates,
        "window": {"first_delivered": _iso(first_us), "last_delivered": _iso(last_us), "seconds": span_s},
        "throughput": {"mean_per_s": _num(mean_rate), "peak_per_s": _num(max((p["per_s"] for p in throughput),
                                                                               default=None)),
                       "bucket_seconds": bucket, "series": throughput},
        "jitter_ms": {
            "min": _num(totals["min"]), **{k: _num(v) for k, v in overall.items()},
            "max": _num(totals["max"]), "mean": _num(totals["mean"]),
            "per_minute": per_minute, "series": jitter_series, "histogram": histogram,
        },
        "early": totals["early"] or 0,
        "late": totals["late"] or 0,
        "sent_after_deadline": totals["sent_after_deadline"] if totals["with_sent"] else None,
        "nodes": nodes,
        "sla": {"thresholds": {"p999_ms": thresholds.p999_ms, "early_ms": -thresholds.timing_advance_ms,
                               "min_rate_per_s": thresholds.min_rate},
                "checks": checks, "verdict": "pass" if all(checks.values()) else "fail"},
    }


def _grouped(df: "DataFrame", key: str) -> list[dict[str, Any]]:
    """Count, exact percentiles and max of the jitter per value of `key` (epoch seconds)."""
    probs = PERCENTILES + (("max", 1.0),)  # the 100th percentile is the maximum
    rows = sorted(exact_percentiles(df, "jitter_ms", probs, by=[key]).collect(), key=lambda r: r[key])
    return [{"t": _iso(r[key] * 1e6), "count": r["n"], **{name: _num(r[name]) for name, _ in probs}} for r in rows]


def run(spark: "SparkSession", *, input_path: str, out_dir: str | Path, fmt: str = "parquet",
        thresholds: Thresholds = Thresholds(), bucket: int | None = None, charts: bool = True) -> dict[str, Any]:
    """Compute the report of `input_path`, write `out_dir/report.json` and the charts; returns it."""
    started = time.monotonic()
    out = Path(out_dir)
    records = read_records(spark, input_path, fmt)
    with spark_errors(f"cannot report on {input_path}"):
        report = compute(records, thresholds, bucket)
    report = {"input": input_path, "generated_at": _iso(time.time() * 1e6), **report}
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the output directory {out}: {exc.strerror}") from None
    if charts:
        from chronos.pipeline import charts as chart_module
        report["charts"] = chart_module.render(report, out)
    report["seconds"] = round(time.monotonic() - started, 3)
    (out / "report.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return report


def summary(report: dict[str, Any], out_dir: str | Path) -> str:
    j, t, sla = report["jitter_ms"], report["throughput"], report["sla"]

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:,.1f}"

    failed = [name for name, ok in sla["checks"].items() if not ok]
    return "\n".join([
        f"{report['records']:,} records, {report['delivered']:,} delivered, {report['undelivered']:,} undelivered, "
        f"{report['duplicates']:,} duplicates in {report['seconds']:.1f} s",
        f"  throughput  mean {ms(t['mean_per_s'])}/s, peak {ms(t['peak_per_s'])}/s "
        f"over {report['window']['seconds'] or 0:,.1f} s",
        f"  jitter ms   p50 {ms(j['p50'])}  p99 {ms(j['p99'])}  p99.9 {ms(j['p999'])}  max {ms(j['max'])}  "
        f"(min {ms(j['min'])})",
        f"  early {report['early']:,} (before {sla['thresholds']['early_ms']:g} ms), "
        f"late {report['late']:,} (after {sla['thresholds']['p999_ms']:g} ms)",
        f"  SLA {sla['verdict'].upper()}" + (f" ({', '.join(failed)})" if failed else "")
        + f": p99.9 <= {sla['thresholds']['p999_ms']:g} ms, none before {sla['thresholds']['early_ms']:g} ms, none lost",
        f"  wrote {Path(out_dir) / 'report.json'}" + "".join(f", {c}" for c in report.get("charts", [])),
    ])

