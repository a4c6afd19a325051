"""The benchmarks' direct access to the stack's PostgreSQL (benchmarks/harness/database.py, samplers.py),
against a real one: far-future rows where the studies expect them, the queue table's statistics."""

from __future__ import annotations

import time

import psycopg

from benchmarks.harness.database import DAY_S, fill_far, table_mb
from benchmarks.harness.samplers import TableSampler


def test_far_future_rows_are_written_due_from_ahead_and_spaced(database_url):
    seconds = fill_far(database_url, 1500, prefix="far-x-", ahead_s=2 * DAY_S, spacing_ms=1000.0, payload_bytes=3)
    assert seconds > 0
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT count(*), min(id), max(id), extract(epoch FROM min(deadline) - now()), "
            "extract(epoch FROM max(deadline) - min(deadline)), count(topic), count(ordering_key), "
            "min(length(value)), count(*) FILTER (WHERE readied_at IS NULL) FROM chronos_messages").fetchone()
        assert rows[:3] == (1500, "far-x-000000001", "far-x-000001500")
        assert 2 * DAY_S - 60 < rows[3] <= 2 * DAY_S
        assert rows[4] == 1499.0 and rows[5:] == (0, 0, 3, 1500)
        assert conn.execute("SELECT key FROM chronos_messages WHERE id = 'far-x-000000042'").fetchone()[0] == \
            b"customer-42"
        # vacuumed and analyzed, like a store in its steady state
        assert conn.execute("SELECT reltuples FROM pg_class WHERE relname = 'chronos_messages'").fetchone()[0] == 1500


def test_varied_rows_go_to_another_topic_or_carry_an_ordering_key_one_in_a_hundred(database_url):
    fill_far(database_url, 1000, prefix="order-", ahead_s=3600.0, varied=True, vacuum=False)
    with psycopg.connect(database_url) as conn:
        topics = conn.execute("SELECT topic, count(*) FROM chronos_messages GROUP BY topic ORDER BY topic").fetchall()
        assert topics == [("billing.reminders", 10), (None, 990)]
        assert conn.execute("SELECT ordering_key FROM chronos_messages WHERE id = 'order-000000203'").fetchone()[0] == \
            "invoice-203"
        assert conn.execute("SELECT count(ordering_key) FROM chronos_messages").fetchone()[0] == 10


def test_the_table_sampler_follows_inserts_and_live_rows(database_url):
    with psycopg.connect(database_url) as conn:
        wal_before = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint").fetchone()[0]
    sampler = TableSampler(database_url, "public.chronos_messages", interval=0.1)
    sampler.start()
    fill_far(database_url, 200, vacuum=True)
    end = time.monotonic() + 15  # the statistics are published up to a second late
    while time.monotonic() < end and not (sampler.samples and sampler.samples[-1].inserted == 200
                                           and sampler.samples[-1].vacuums == 1):
        time.sleep(0.1)
    sampler.stop()
    assert sampler.error is None
    last = sampler.samples[-1]
    assert (last.inserted, last.vacuums, last.autovacuums) == (200, 1, 0) and last.live > 0 and not last.vacuuming
    assert sampler.live_rows() == last.live
    assert last.wal_bytes > wal_before > 0  # the inserts and the vacuum wrote WAL
    figures = sampler.figures(0.0, time.time() + 1)
    assert figures["live_rows_max"] == max(s.live for s in sampler.samples) and figures["vacuum_running_s"] == 0
    assert table_mb(database_url) > 0


def test_the_design_s_limit_drives_firers_that_claim_their_own_slices(database_url):
    """`benchmarks.design_limit --claims shares`: two firers that divide the slices claim and delete every row
    written."""
    from benchmarks.design_limit import BATCH, Drive, copy_streams
    from chronos.adapters.postgres.queries import QUERIES
    streams = copy_streams(3, "limit")
    with psycopg.connect(database_url, autocommit=True) as conn:
        for stream in streams:
            with conn.transaction(), conn.cursor() as cur, cur.copy(QUERIES["copy_messages"]) as copy:
                copy.write(stream)
    drive = Drive(database_url, 0, 2, 0, backlog=10 * BATCH, streams=streams, shares=True)
    drive.inserted = len(streams) * BATCH
    for t in drive.threads:
        t.start()
    end = time.monotonic() + 30
    while time.monotonic() < end and drive.deleted < drive.inserted and not drive.errors:
        time.sleep(0.05)
    drive.halt.set()
    for t in drive.threads:
        t.join(15)
    assert drive.errors == [] and drive.deleted == len(streams) * BATCH
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT count(*) FROM chronos_messages").fetchone()[0] == 0


def test_the_capacity_benchmark_measures_the_disk_of_waiting_messages():
    """`python -m benchmarks.capacity`'s disk step on a PostgreSQL of its own, with a few thousand rows: the
    table, its indexes and TOAST measured, per million (its import of the migrations once broke it unseen)."""
    from benchmarks.capacity import measure_disk
    found = measure_disk(4000, 100)
    assert found["rows"] == 4000 and found["bytes"]["heap"] > 0
    assert "chronos_messages_pkey" in found["bytes"]["indexes"] and found["bytes_per_million"]["total"] > 0
