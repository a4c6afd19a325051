"""The design's limit's variants (benchmarks/design_limit.py) against a real PostgreSQL: each deletes every
row written exactly once and claims none before its deadline, so a design that loses or repeats rows
cannot report a rate; and a run of two of them reports its measures and their ratio."""

from __future__ import annotations

import time

import orjson
import psycopg
import pytest

from benchmarks.design_limit import BATCH, VARIANTS, Drive, copy_batches, main

ROWS_DUE_IN_US = 200_000
ROWS_SPREAD_US = 600_000
HOLD_MS = 250  # longer than a firer's poll interval (100 ms)


def ids_of(arrays: list[str]) -> list[str]:
    return sorted(name for array in arrays for name in array[1:-1].split(",") if name)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_each_variant_deletes_every_row_written_once_and_claims_none_before_its_deadline(database_url, name):
    variant = VARIANTS[name]
    with psycopg.connect(database_url, autocommit=True) as conn:
        for statement in variant.ddl():
            conn.execute(statement)
    # two writers at once (their COPYs commit out of their rows' order), two firers, deadlines still to come,
    # batches held past the next claim (Kafka acknowledging more slowly than a firer polls)
    batches = copy_batches(2, name, ids="uuid", due_us=int(time.time() * 1e6) + ROWS_DUE_IN_US, spread_us=ROWS_SPREAD_US)
    drive = Drive(database_url, 2, 2, 2, backlog=10 * BATCH, streams=[b.stream for b in batches], variant=variant,
                  hold_ms=HOLD_MS, lookahead_ms=0, once=True, record=True, stream_ids=[b.ids for b in batches], bucket_s=0.2)
    for t in drive.threads:
        t.start()
    end = time.monotonic() + 30
    while time.monotonic() < end and drive.deleted < len(batches) * BATCH and not drive.errors:
        time.sleep(0.05)
    drive.halt.set()
    for t in drive.threads:
        t.join(15)
    assert drive.errors == []
    assert ids_of(drive.taken) == ids_of([b.ids for b in batches])  # each row once: none lost, none twice
    assert drive.deleted == len(batches) * BATCH and drive.claimed == drive.deleted
    assert drive.early == 0
    with psycopg.connect(database_url) as conn:
        assert sum(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in variant.tables()) == 0


def test_a_run_of_variants_reports_each_measure_and_its_ratio_to_today_s_statements(tmp_path):
    out = tmp_path / "limit.json"
    assert main(["--variants", "today,delete-claim", "--layout", "1/1/1", "--duration", "1", "--warmup", "0.5",
                 "--vacuum", "owed", "--hold-ms", "20", "--out", str(out)]) == 0
    result = orjson.loads(out.read_bytes())
    today, candidate = result["rows"]
    for row in result["rows"]:
        assert row["messages"] > 0 and row["rate_per_s"] > 0 and row["postgres_us_per_message_with_vacuum"] > 0
        assert row["wal_bytes_per_message"] > 0 and row["index_entries_per_message"] > 0
        assert row["vacuum_us_per_message"] >= 0 and row["claimed_early"] == 0
    # today's claim writes a second version of every row; the claim that deletes none
    assert today["wal_records_per_message_by_kind"]["Heap/UPDATE"][0] > 0.5 and today["hot_update_share"] == 0
    assert "Heap/UPDATE" not in candidate["wal_records_per_message_by_kind"] and candidate["hot_update_share"] is None
    assert candidate["sessions_max"] >= 1
    (summary,) = [s for s in result["summary"] if s["variant"] == "delete-claim"]
    assert summary["baseline"] == "today" and summary["ratios"]["rate_per_s"]["pairs"]
