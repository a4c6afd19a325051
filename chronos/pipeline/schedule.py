"""Bulk scheduling: a dataset of messages → the store, in parallel, idempotently.

Each Spark partition is validated by the consumer's rules (`chronos.pipeline.rows`) and written
by its executor over its own PostgreSQL connection with the store's `insert` (one transaction per
chunk): one COPY into the table, or, when an id of the chunk is waiting already, COPY into the
connection's temporary staging table, then `INSERT ... ON CONFLICT (id) DO NOTHING`. A row whose
id is waiting already is left alone, so running the job twice, or Spark
retrying a task, schedules nothing twice. No JDBC driver is involved: psycopg does the COPY.

Invalid rows come back from the executors with their reason and are written to the rejects
dataset; the counts come back through an accumulator.

With cells, each row goes to the cell of the input partition its routing key gives (its ordering key,
else its id: `chronos.domain.routing`, modulo the map's partition count), where a message sent through
Kafka with the same id or ordering key would be, each chunk written to each cell with the map's fence;
a map that changed while the job ran stops it (run it again: nothing is scheduled twice).
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping, TextIO

from chronos.errors import CellMapChanged, InputError
from chronos.domain.cells import CellMap
from chronos.domain.intake import Rules
from chronos.domain.model import Row
from chronos.domain.routing import input_partition
from chronos.pipeline.rows import COLUMNS, OPTIONAL_COLUMNS, REQUIRED_COLUMNS, Stats, build
from chronos.pipeline.spark import load_input, spark_errors

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType

REASON_COLUMN = "reason"
CHUNK_ROWS = 50_000


@dataclass
class ScheduleResult:
    stats: Stats
    seconds: float
    partitions: int
    ignored_columns: list[str]
    rejects_path: str | None

    @property
    def rows_per_second(self) -> float:
        return self.stats.read / self.seconds if self.seconds > 0 else 0.0


def read_input(spark: "SparkSession", path: str, fmt: str) -> "DataFrame":
    """The input dataset; CSV is read as text (the codec parses it)."""
    df = load_input(spark, path, fmt, infer_schema=False)
    if fmt == "json" and "headers" in df.schema.names and df.schema["headers"].dataType.typeName() == "struct":
        # A JSON object of headers: read it as its raw text, which keeps each row's own keys
        # in their order (an inferred struct would hold every key seen in any row).
        from pyspark.sql import types as T
        fields = [T.StructField(f.name, T.StringType()) if f.name == "headers" else f for f in df.schema.fields]
        with spark_errors(f"cannot read {path}", InputError):
            df = spark.read.format(fmt).schema(T.StructType(fields)).load(path)
            df.schema  # noqa: B018 - resolves the schema now, so a bad input fails here
    return df


def _type_ok(column: str, dtype: "DataType") -> bool:
    from pyspark.sql import types as T

    text = (T.StringType, T.NullType)
    if column == "id":
        return isinstance(dtype, text + (T.BinaryType, T.IntegralType))
    if column == "deadline":
        return isinstance(dtype, text + (T.IntegralType, T.FractionalType, T.TimestampType,
                                         T.TimestampNTZType, T.DateType))
    if column in ("key", "value"):
        return isinstance(dtype, text + (T.BinaryType,))
    if column in ("topic", "ordering_key"):
        return isinstance(dtype, text)
    # headers: JSON text, a map, a list of {key, value} structs (Spark's Kafka shape), or pairs
    values = text + (T.BinaryType,)
    if isinstance(dtype, text + (T.BinaryType,)):
        return True
    if isinstance(dtype, T.MapType):
        return isinstance(dtype.keyType, T.StringType) and isinstance(dtype.valueType, values)
    if isinstance(dtype, T.ArrayType):
        element = dtype.elementType
        if isinstance(element, T.StructType):
            return (sorted(element.names) == ["key", "value"] and isinstance(element["key"].dataType, T.StringType)
                    and isinstance(element["value"].dataType, values))
        return isinstance(element, T.ArrayType) and isinstance(element.elementType, T.StringType)
    return False


def check_columns(schema: "StructType") -> list[str]:
    """Raise InputError unless the schema fits; returns the columns the job ignores."""
    names = schema.names
    problems = []
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        problems.append(f"missing column(s) {', '.join(missing)}")
    for field in schema.fields:
        if field.name in COLUMNS and not _type_ok(field.name, field.dataType):
            problems.append(f"column {field.name} has type {field.dataType.simpleString()}")
    if REASON_COLUMN in names:
        problems.append(f"the input may not have a column named {REASON_COLUMN!r} (the rejects add it)")
    if problems:
        raise InputError("input has the wrong schema: " + "; ".join(problems) + f" (expected {', '.join(REQUIRED_COLUMNS)}"
                         f" and optionally {', '.join(OPTIONAL_COLUMNS)}; see `chronos pipeline schedule --help`)")
    return [n for n in names if n not in COLUMNS]


def _stats_param():
    from pyspark.accumulators import AccumulatorParam

    class StatsParam(AccumulatorParam):
        def zero(self, value: Stats) -> Stats:
            return Stats()

        def addInPlace(self, a: Stats, b: Stats) -> Stats:
            return a.merge(b)

    return StatsParam()


def validate_and_write(batches: Iterator["pa.RecordBatch"], *, url: str, rules: Rules, now_us: int,
                       accumulator: Any, chunk_rows: int = CHUNK_ROWS, pool_mode: str = "session",
                       cells: Mapping[str, str] | None = None,
                       cell_map: CellMap | None = None) -> Iterator["pa.RecordBatch"]:
    """Executor side, one partition: store the valid rows, yield the invalid ones with their reason.
    `pool_mode`: how its store talks to PostgreSQL (chronos.adapters.postgres.pooling). With `cells` (cell
    name -> URL) and their `cell_map`, each row in the cell of its routing key's input partition."""
    import pyarrow as pa

    from chronos.adapters.postgres.store import Store

    stats = Stats()
    urls = dict(cells) if cells else {"": url}
    stores: dict[str, Store] = {}
    pending: dict[str, list[tuple[Row, int]]] = {}

    def flush() -> None:
        for cell, chunk in pending.items():
            if cell not in stores:
                stores[cell] = Store(urls[cell], pool_mode=pool_mode)
            # Partitions may hold the same id (a repeated row). Inserting in id order makes every
            # transaction take its row locks in one global order, so two partitions wait for each
            # other instead of deadlocking; within a chunk the input order means nothing anyway.
            chunk.sort(key=lambda row: row[0].id)
            fence = cell_map.fence(cell, {p for _, p in chunk}) if cell_map is not None else None
            try:
                stats.scheduled += stores[cell].apply([row for row, _ in chunk], (), (), fence)[0]
            except CellMapChanged:
                raise InputError("the cell map changed while the job ran (a partition moved): run it again; "
                                 "nothing is scheduled twice") from None
        pending.clear()

    def cell_of(row: Row) -> tuple[str, int]:
        """The cell a row goes to, and its input partition (0 without cells)."""
        if cell_map is None:
            return "", 0
        partition = input_partition(row.id, row.ordering_key, cell_map.partitions) if cell_map.partitions else 0
        owner = cell_map.owner(partition)
        if not owner.writable:
            raise InputError(f"input partition {partition} is moving to another cell: run the job again once it "
                             f"has; nothing is scheduled twice")
        return owner.cell, partition

    try:
        for batch in batches:
            n = batch.num_rows
            names = batch.schema.names
            cols = {c: (batch.column(names.index(c)).to_pylist() if c in names else [None] * n) for c in COLUMNS}
            ids, deadlines, topics = cols["id"], cols["deadline"], cols["topic"]
            okeys, headers, keys, values = cols["ordering_key"], cols["headers"], cols["key"], cols["value"]
            mask = [False] * n
            reasons = []
            for j in range(n):
                row, reason, due = build(ids[j], deadlines[j], topics[j], okeys[j], headers[j], keys[j],
                                         values[j], now_us, rules)
                if row is None:
                    assert reason is not None  # build() gives a reason with every refusal
                    mask[j] = True
                    reasons.append(reason)
                    stats.reject(reason)
                else:
                    cell, partition = cell_of(row)
                    if cell_map is not None and cell_map.partitions:
                        row.input_partition = partition  # where the same message sent through Kafka would be read
                    pending.setdefault(cell, []).append((row, partition))
                    stats.valid += 1
                    stats.due += due
            stats.read += n
            if sum(map(len, pending.values())) >= chunk_rows:
                flush()
            if reasons:
                rejected = batch.filter(pa.array(mask))
                yield pa.RecordBatch.from_arrays(list(rejected.columns) + [pa.array(reasons, pa.string())],
                                                 names=names + [REASON_COLUMN])
        flush()
    finally:
        for store in stores.values():
            store.close()
    accumulator.add(stats)


class Progress:
    """Prints the job's progress every few seconds: partitions done, rows so far, rate."""

    def __init__(self, spark: "SparkSession", accumulator: Any, out: TextIO = sys.stderr, every: float = 2.0):
        self.spark, self.accumulator, self.out, self.every = spark, accumulator, out, every
        self.stopped = threading.Event()
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._run, name="chronos-progress", daemon=True)
        self.last = ""

    def __enter__(self) -> "Progress":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(5)

    def line(self) -> str:
        tracker = self.spark.sparkContext.statusTracker()
        done = total = 0
        for stage_id in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                done += info.numCompletedTasks
                total += info.numTasks
        s: Stats = self.accumulator.value
        took = time.monotonic() - self.started
        stage = f"{done}/{total} partitions done, " if total else ""
        return (f"progress: {stage}{s.read:,} rows read, {s.scheduled:,} scheduled, "
                f"{s.rejected_total:,} rejected ({s.read / took if took else 0:,.0f} rows/s)")

    def _run(self) -> None:
        while not self.stopped.wait(self.every):
            try:
                line = self.line()
            except Exception as exc:  # noqa: BLE001 - progress is cosmetic; the job goes on
                line = f"progress: unavailable ({exc})"
            if line != self.last:
                print(line, file=self.out, flush=True)
                self.last = line


def run(spark: "SparkSession", *, input_path: str, fmt: str, database_url: str | None, rules: Rules,
        rejects_path: str | None = None, partitions: int | None = None, now_us: int | None = None,
        progress: bool = False, chunk_rows: int = CHUNK_ROWS,
        out: TextIO = sys.stderr, check: bool = True, pool_mode: str = "auto",
        cells: Mapping[str, str] | None = None) -> ScheduleResult:
    """Validate and store every row of the input; invalid rows go to `rejects_path` (in the
    input's format, with the input's columns and a `reason` column). `pool_mode` is
    CHRONOS_DATABASE_POOL_MODE, settled here for every executor by `check`, else by each executor's store.
    With `cells` (cell name -> URL: CHRONOS_CELLS), each row goes to the cell of its routing key's input
    partition, by their map, read here."""
    from pyspark.sql import types as T

    if rejects_path is not None and rejects_path.rstrip("/") == input_path.rstrip("/"):
        raise InputError("--rejects must not be the input path")
    started = time.monotonic()
    urls = dict(cells) if cells else {"": database_url or ""}
    if check:
        for url in urls.values():
            pool_mode = check_store(url, pool_mode)
    cell_map = read_cell_map(urls, pool_mode) if cells else None
    df = read_input(spark, input_path, fmt)
    ignored = check_columns(df.schema)
    if not partitions and df.rdd.getNumPartitions() < spark.sparkContext.defaultParallelism:
        partitions = spark.sparkContext.defaultParallelism  # e.g. one big row group: use every core
    if partitions:
        df = df.repartition(partitions)
    now_us = time.time_ns() // 1000 if now_us is None else now_us
    accumulator = spark.sparkContext.accumulator(Stats(), _stats_param())
    schema = T.StructType(df.schema.fields + [T.StructField(REASON_COLUMN, T.StringType(), nullable=False)])

    def work(batches: Iterator["pa.RecordBatch"]) -> Iterator["pa.RecordBatch"]:
        return validate_and_write(batches, url=database_url or "", rules=rules, now_us=now_us,
                                  accumulator=accumulator, chunk_rows=chunk_rows, pool_mode=pool_mode, cells=cells,
                                  cell_map=cell_map)

    with spark_errors(f"cannot schedule {input_path}"):
        n_partitions = df.rdd.getNumPartitions()
        rejects = df.mapInArrow(work, schema)
        if rejects_path is not None:
            writer = rejects.write.format(fmt).mode("overwrite")
            if fmt == "csv":
                writer = writer.option("header", "true").option("escape", '"')
            target = rejects_path
        else:
            writer = rejects.write.format("noop").mode("overwrite")
            target = None
        if progress:
            with Progress(spark, accumulator, out=out):
                writer.save(target)
        else:
            writer.save(target)
    return ScheduleResult(accumulator.value, time.monotonic() - started, n_partitions, ignored, rejects_path)


def check_store(url: str, pool_mode: str = "auto") -> str:
    """Fail before Spark does any work when PostgreSQL is unreachable or not migrated; the pool mode to
    talk to it in (`pool_mode` settled: chronos.adapters.postgres.pooling)."""
    from chronos.adapters.postgres.connection import connect
    from chronos.adapters.postgres.migrations import check_schema
    from chronos.adapters.postgres.pooling import resolve_pool_mode

    with connect(url) as conn:
        check_schema(conn)
    return resolve_pool_mode(url, pool_mode, check=True)


def read_cell_map(urls: Mapping[str, str], pool_mode: str) -> CellMap:
    """The cells' map of the input partitions (CellMapError if they make none)."""
    from chronos.adapters.postgres.store import Store
    from chronos.ops.cells import read_map

    stores = {cell: Store(url, pool_mode=pool_mode) for cell, url in urls.items()}
    try:
        return read_map(stores)
    finally:
        for store in stores.values():
            store.close()


def summary(result: ScheduleResult) -> str:
    s = result.stats
    lines = [f"read {s.read:,} rows in {result.seconds:.1f} s ({result.rows_per_second:,.0f} rows/s, "
             f"{result.partitions} partitions)",
             f"  scheduled        {s.scheduled:,}" + (f" ({s.due:,} already due: the firers send them at once)"
                                                     if s.due else ""),
             f"  already waiting  {s.already_waiting:,}",
             f"  rejected         {s.rejected_total:,}"]
    if s.rejected:
        reasons = ", ".join(f"{code} {n:,}" for code, n in sorted(s.rejected.items(), key=lambda kv: -kv[1]))
        lines[-1] += f" ({reasons})" + (f" → {result.rejects_path}" if result.rejects_path else "")
    if result.ignored_columns:
        lines.append(f"  ignored columns  {', '.join(result.ignored_columns)}")
    return "\n".join(lines)
