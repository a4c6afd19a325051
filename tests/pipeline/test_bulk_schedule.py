"""`chronos pipeline schedule`: a few thousand rows, invalid ones and duplicates, run twice."""

from __future__ import annotations

import csv
import os
import random
import re
import subprocess
import sys
import time
from datetime import datetime, timezone

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chronos import codec
from chronos.errors import InputError, SchemaError, StoreUnavailable
from chronos.domain.intake import Rules
from chronos.pipeline import schedule
from chronos.pipeline.rows import iso_micros
from helpers import SPARK_TEST_JVM

pytestmark = pytest.mark.spark

RULES = Rules(timing_advance_us=50_000, output_topic="out", allowed_topics=re.compile(r"out|billing\..*"))
NOW_US = time.time_ns() // 1000
BASE_MS = NOW_US // 1000 + 3_600_000  # an hour from now

INVALID = [
    ("missing_id", dict(id=None)),
    ("empty_id", dict(id="")),
    ("id_too_long", dict(id="x" * 129)),
    ("missing_deadline", dict(deadline=None)),
    ("bad_deadline", dict(deadline="tomorrow")),
    ("bad_topic", dict(topic="bad topic")),
    ("topic_not_allowed", dict(topic="payments")),
    ("bad_ordering_key", dict(ordering_key="")),
    ("bad_headers", dict(headers="{oops")),
    ("duplicate_header", dict(headers='{"chronosDeadline": "1"}')),
]


def valid_row(i: int) -> dict:
    deadline_us = (BASE_MS + i) * 1000 + (i % 1000 if i % 2 == 0 else 0)
    if i % 100 == 0:
        deadline_us = NOW_US - 1_000_000  # already due: stored, fired at once by the firers
    deadline = iso_micros(deadline_us) if i % 2 == 0 else str(deadline_us // 1000)
    headers, wire = None, []
    if i % 3 == 0:
        headers, wire = f'{{"trace": "t-{i}"}}', [("trace", f"t-{i}".encode())]
    elif i % 3 == 1:
        headers, wire = '[["h", "1"], ["h", "2"], ["n", null]]', [("h", b"1"), ("h", b"2"), ("n", None)]
    return {"id": f"bulk-{i}", "deadline": deadline, "key": None if i % 11 == 0 else f"k{i}",
            "value": None if i % 13 == 0 else f"value {i}".encode(),
            "topic": {0: "billing.eu", 1: "out"}.get(i % 10), "headers": headers,
            "ordering_key": f"cust-{i % 5}" if i % 7 == 0 else None,
            "_deadline_us": deadline_us, "_wire": wire}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """2,400 valid rows, 200 repeats of their ids, 400 invalid rows, shuffled, in 3 files."""
    valid = [valid_row(i) for i in range(2400)]
    repeats = [{**valid_row(i), "value": b"repeat"} for i in range(200)]
    invalid = []
    for k in range(400):
        code, change = INVALID[k % len(INVALID)]
        row = {**valid_row(10_000 + k), "value": f"bad-{k}".encode(), "_code": code}
        row.update(change)
        invalid.append(row)
    rows = valid + repeats + invalid
    random.Random(7).shuffle(rows)
    path = tmp_path_factory.mktemp("bulk") / "messages"
    path.mkdir()
    columns = ["id", "deadline", "key", "value", "topic", "headers", "ordering_key"]
    types = {"value": pa.binary()}
    for part in range(3):
        chunk = rows[part::3]
        table = pa.table({c: pa.array([r[c] for r in chunk], types.get(c, pa.string())) for c in columns})
        pq.write_table(table, path / f"part-{part}.parquet")
    return {"path": str(path), "valid": {r["id"]: r for r in valid}, "invalid": invalid, "rows": rows}


def stored(url: str) -> dict[str, tuple]:
    with psycopg.connect(url) as conn:
        return {r[0]: r[1:] for r in conn.execute(
            "SELECT id, (extract(epoch FROM deadline) * 1000000)::bigint, topic, key, value, headers, ordering_key "
            "FROM chronos_messages")}


def test_bulk_schedule_lands_exactly_the_valid_rows_once(spark, dataset, database_url, tmp_path):
    rejects = str(tmp_path / "rejects")
    first = schedule.run(spark, input_path=dataset["path"], fmt="parquet", database_url=database_url, rules=RULES,
                         rejects_path=rejects, partitions=3, now_us=NOW_US, chunk_rows=500)
    s = first.stats
    assert (s.read, s.valid, s.scheduled, s.already_waiting, s.rejected_total) == (3000, 2600, 2400, 200, 400)
    assert s.due == 24 + 2  # every 100th valid row, and the repeats of two of them
    assert s.rejected == {code: 40 for code, _ in INVALID}
    assert first.partitions == 3

    rows = stored(database_url)
    assert set(rows) == set(dataset["valid"])
    for message_id, expected in dataset["valid"].items():
        deadline_us, topic, key, value, headers, ordering_key = rows[message_id]
        assert deadline_us == expected["_deadline_us"]
        assert topic == ("billing.eu" if expected["topic"] == "billing.eu" else None)
        assert key == (expected["key"].encode() if expected["key"] is not None else None)
        assert ordering_key == expected["ordering_key"]
        assert codec.decode_headers(headers) == expected["_wire"]
        if int(message_id.split("-")[1]) >= 200:  # ids without a repeat in the input
            assert value == expected["value"]
        else:
            assert value in (expected["value"], b"repeat")

    rejected = spark.read.parquet(rejects).collect()
    assert len(rejected) == 400
    expected_codes = {r["value"]: r["_code"] for r in dataset["invalid"]}
    for r in rejected:
        assert r["reason"].split(":", 1)[0] == expected_codes[bytes(r["value"])], r
    assert set(spark.read.parquet(rejects).columns) == {"id", "deadline", "key", "value", "topic", "headers",
                                                        "ordering_key", "reason"}

    second = schedule.run(spark, input_path=dataset["path"], fmt="parquet", database_url=database_url, rules=RULES,
                          rejects_path=rejects, now_us=NOW_US)
    s2 = second.stats
    assert (s2.read, s2.scheduled, s2.already_waiting, s2.rejected_total) == (3000, 0, 2600, 400)
    assert stored(database_url) == rows
    text = schedule.summary(second)
    assert "scheduled        0" in text and "already waiting  2,600" in text and "rejected         400" in text


def test_typed_columns_timestamps_maps_and_kafka_shaped_headers(spark, database_url, tmp_path):
    deadline = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=timezone.utc)
    struct = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    pq.write_table(pa.table({
        "id": pa.array([1, 2, 3], pa.int64()),
        "deadline": pa.array([deadline, deadline, None], pa.timestamp("us", tz="UTC")),
        "key": pa.array([b"\x00\xff", None, b"k"], pa.binary()),
        "value": pa.array([b"\x01\x02", b"", None], pa.binary()),
        "headers": pa.array([[{"key": "bin", "value": b"\x00\xfe"}, {"key": "bin", "value": None}], [], None], struct),
    }), tmp_path / "typed.parquet")
    result = schedule.run(spark, input_path=str(tmp_path / "typed.parquet"), fmt="parquet",
                          database_url=database_url, rules=RULES, now_us=NOW_US)
    assert (result.stats.scheduled, result.stats.rejected) == (2, {"missing_deadline": 1})
    rows = stored(database_url)
    expected_us = int(deadline.timestamp()) * 1_000_000 + 123456
    assert rows["1"] == (expected_us, None, b"\x00\xff", b"\x01\x02",
                         codec.encode_headers([("bin", b"\x00\xfe"), ("bin", None)]), None)
    assert rows["2"][0] == expected_us and rows["2"][2:4] == (None, b"")

    pq.write_table(pa.table({
        "id": ["m"], "deadline": pa.array([BASE_MS], pa.int64()), "key": ["k"], "value": ["v"],
        "headers": pa.array([[("a", "1"), ("b", "2")]], pa.map_(pa.string(), pa.string())),
    }), tmp_path / "map.parquet")
    schedule.run(spark, input_path=str(tmp_path / "map.parquet"), fmt="parquet", database_url=database_url,
                 rules=RULES, now_us=NOW_US)
    assert stored(database_url)["m"][0] == BASE_MS * 1000
    assert codec.decode_headers(stored(database_url)["m"][4]) == [("a", b"1"), ("b", b"2")]

    # JSON lines with the headers as an inline object: each row keeps its own keys, in order
    (tmp_path / "m.json").write_text(
        f'{{"id": "j1", "deadline": {BASE_MS}, "key": "k", "value": "v", "headers": {{"z": "1", "a": null}}}}\n'
        f'{{"id": "j2", "deadline": "{iso_micros(BASE_MS * 1000)}", "key": null, "value": "v", "headers": {{"b": "2"}}}}\n')
    result = schedule.run(spark, input_path=str(tmp_path / "m.json"), fmt="json", database_url=database_url,
                          rules=RULES, now_us=NOW_US)
    assert result.stats.scheduled == 2
    rows = stored(database_url)
    assert codec.decode_headers(rows["j1"][4]) == [("z", b"1"), ("a", None)]
    assert codec.decode_headers(rows["j2"][4]) == [("b", b"2")] and rows["j2"][2] is None


def test_input_errors(spark, database_url, tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        schedule.run(spark, input_path=str(tmp_path / "nope.parquet"), fmt="parquet", database_url=database_url,
                     rules=RULES)
    pq.write_table(pa.table({"id": ["a"], "when": ["x"], "key": ["k"], "value": ["v"]}), tmp_path / "s.parquet")
    with pytest.raises(InputError, match=r"missing column\(s\) deadline"):
        schedule.run(spark, input_path=str(tmp_path / "s.parquet"), fmt="parquet", database_url=database_url,
                     rules=RULES)
    pq.write_table(pa.table({"id": ["a"], "deadline": ["1"], "key": ["k"], "value": ["v"],
                             "headers": pa.array([1], pa.int32())}), tmp_path / "t.parquet")
    with pytest.raises(InputError, match="column headers has type int"):
        schedule.run(spark, input_path=str(tmp_path / "t.parquet"), fmt="parquet", database_url=database_url,
                     rules=RULES)
    (tmp_path / "broken.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(InputError):
        schedule.run(spark, input_path=str(tmp_path / "broken.parquet"), fmt="parquet",
                     database_url=database_url, rules=RULES)


def test_database_errors(spark, dataset, empty_database_url, pg_server):
    with pytest.raises(SchemaError, match="chronos migrate"):
        schedule.run(spark, input_path=dataset["path"], fmt="parquet", database_url=empty_database_url, rules=RULES)
    # PostgreSQL lost while the executors write: the executors' error, one line, on the driver
    unreachable = f"postgresql://postgres@127.0.0.1:{_closed_port()}/chronos"
    with pytest.raises(StoreUnavailable, match="cannot connect to PostgreSQL") as info:
        schedule.run(spark, input_path=dataset["path"], fmt="parquet", database_url=unreachable, rules=RULES,
                     check=False)
    assert "\n" not in str(info.value) and "Traceback" not in str(info.value)


def _closed_port() -> int:
    from chronos.embedded.procs import free_port
    return free_port()


def run_cli(*args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    args += ("--conf", f"spark.driver.extraJavaOptions={SPARK_TEST_JVM}")
    return subprocess.run([sys.executable, "-m", "chronos", "pipeline", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_cli_schedules_a_csv_file_and_prints_a_summary(database_url, tmp_path):
    path = tmp_path / "messages.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "deadline", "key", "value", "headers"])
        for i in range(300):
            w.writerow([f"c-{i}", BASE_MS + i, f"k{i}", f"v{i}", '{"via": "csv"}'])
        w.writerow(["c-bad", "soon", "k", "v", ""])
        w.writerow(["c-0", BASE_MS, "k", "v", ""])  # a repeat: already waiting
    rejects = tmp_path / "rejects"
    done = run_cli("schedule", "--input", str(path), "--rejects", str(rejects), "--master", "local[2]",
                   "--database-url", database_url)
    assert done.returncode == 0, done.stderr
    assert "read 302 rows" in done.stdout
    assert "scheduled        300" in done.stdout and "already waiting  1" in done.stdout
    assert "rejected         1 (bad_deadline 1)" in done.stdout
    assert "Traceback" not in done.stderr and "Exception" not in done.stderr
    assert len(stored(database_url)) == 300
    # one part file per Spark partition, each with its header (an empty partition may write one too)
    header = "id,deadline,key,value,headers,reason"
    parts = [p.read_text().splitlines() for p in sorted(rejects.glob("part-*.csv"))]
    assert all(part[0] == header for part in parts if part)
    rows = [line for part in parts for line in part[1:]]
    assert len(rows) == 1 and rows[0].startswith("c-bad,soon,k,v,,")


def test_cli_errors_are_one_line_with_exit_codes(tmp_path, empty_database_url):
    missing = run_cli("schedule", "--input", str(tmp_path / "none.parquet"), "--database-url",
                      "postgresql://postgres@127.0.0.1:1/x")
    assert missing.returncode == 2 and missing.stderr.strip().endswith("does not exist")
    pq.write_table(pa.table({"id": ["a"], "deadline": ["1"], "key": ["k"], "value": ["v"]}), tmp_path / "ok.parquet")
    down = run_cli("schedule", "--input", str(tmp_path / "ok.parquet"), "--database-url",
                   f"postgresql://postgres@127.0.0.1:{_closed_port()}/x")
    assert down.returncode == 3 and "cannot connect to PostgreSQL" in down.stderr
    assert len(down.stderr.strip().splitlines()) == 1
    unmigrated = run_cli("schedule", "--input", str(tmp_path / "ok.parquet"), "--database-url", empty_database_url)
    assert unmigrated.returncode == 4 and "chronos migrate" in unmigrated.stderr
    no_url = run_cli("schedule", "--input", str(tmp_path / "ok.parquet"), env={"CHRONOS_DATABASE_URL": "",
                                                                                "CHRONOS_DATA_DIR": str(tmp_path)})
    assert no_url.returncode == 2 and "CHRONOS_DATABASE_URL" in no_url.stderr


def test_partitions_writing_the_same_ids_wait_for_each_other_instead_of_deadlocking(database_url, caplog):
    """Two partitions hold the same 20,000 ids in opposite orders and write them concurrently,
    each in one chunk. In input order their row locks cross and PostgreSQL aborts one of them as a
    deadlock; in id order one simply waits for the other."""
    import threading

    ids = [f"twin-{i:05d}" for i in range(20_000)]
    deadline = str(BASE_MS)

    def batch(order: list[str]) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({"id": order, "deadline": [deadline] * len(order),
                                           "key": [None] * len(order), "value": [b"v"] * len(order)})

    class Totals:
        def __init__(self) -> None:
            self.stats: list[schedule.Stats] = []

        def add(self, stats: schedule.Stats) -> None:
            self.stats.append(stats)

    totals, errors = Totals(), []
    start = threading.Barrier(2)

    def partition(order: list[str]) -> None:
        try:
            start.wait()
            list(schedule.validate_and_write(iter([batch(order)]), url=database_url, rules=RULES, now_us=NOW_US,
                                             accumulator=totals, chunk_rows=len(order)))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    caplog.set_level("INFO", logger="chronos.store")
    threads = [threading.Thread(target=partition, args=(order,)) for order in (ids, ids[::-1])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert sorted(s.scheduled for s in totals.stats) == [0, 20_000]
    assert set(stored(database_url)) == set(ids)
    assert not [r for r in caplog.records if "rolled back" in r.getMessage()]


def test_with_cells_each_row_goes_to_the_cell_of_its_routing_keys_partition(spark, dataset, two_cells):
    from chronos.adapters.postgres.store import Store
    from chronos.domain.routing import input_partition

    stores = {cell: Store(url) for cell, url in two_cells.items()}
    stores["a"].open_partitions([0, 1, 2], 1)
    stores["b"].open_partitions([3, 4, 5], 1)
    result = schedule.run(spark, input_path=dataset["path"], fmt="parquet", database_url=None, rules=RULES,
                          partitions=3, now_us=NOW_US, chunk_rows=500, cells=two_cells)
    assert (result.stats.scheduled, result.stats.already_waiting) == (2400, 200)
    # where a message sent through Kafka with the same id or ordering key would be read, and so stored
    expected = {"a": set(), "b": set()}
    for message_id, row in dataset["valid"].items():
        expected["a" if input_partition(message_id, row["ordering_key"], 6) < 3 else "b"].add(message_id)
    assert {cell: set(stored(url)) for cell, url in two_cells.items()} == expected
    assert expected["a"] and expected["b"]
    # and each row says that partition, as one the consumer wrote would (a move of it takes the row along)
    for url in two_cells.values():
        with psycopg.connect(url) as conn:
            recorded = dict(conn.execute("SELECT id, input_partition FROM chronos_messages").fetchall())
        assert recorded == {m: input_partition(m, dataset["valid"][m]["ordering_key"], 6) for m in recorded}
    # a partition on its way to another cell: the job stops, and run again once it has moved, goes through
    stores["b"].close_partitions([4])
    with pytest.raises(InputError, match="input partition 4 is moving to another cell: run the job again"):
        schedule.run(spark, input_path=dataset["path"], fmt="parquet", database_url=None, rules=RULES,
                     now_us=NOW_US, cells=two_cells)
    for st in stores.values():
        st.close()
