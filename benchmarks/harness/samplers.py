"""What a run samples from a thread while its load goes, besides the messages: the queue table's
statistics (`TableSampler`) and the embedded broker (`BrokerSampler`)."""

from __future__ import annotations

import threading
import time
from typing import Any, NamedTuple


class Sampler(threading.Thread):
    """Calls `sample()` every `interval` s from a thread of its own until `stop()`; `samples` keeps the answers."""

    def __init__(self, name: str, interval: float):
        super().__init__(name=name, daemon=True)
        self.interval = interval
        self.samples: list[Any] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            self.sample()
            self.stopping.wait(self.interval)

    def sample(self) -> None:
        raise NotImplementedError

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        self.join(timeout)


class TableStats(NamedTuple):
    """One sample of a table's pg_stat_user_tables row (PostgreSQL publishes it up to a second late)."""

    at: float           # epoch s
    inserted: int       # n_tup_ins
    live: int           # n_live_tup
    dead: int           # n_dead_tup
    vacuums: int        # vacuum_count
    autovacuums: int    # autovacuum_count
    autoanalyzes: int   # autoanalyze_count
    vacuuming: bool     # a vacuum of it runs (pg_stat_progress_vacuum)
    wal_bytes: int = 0  # the WAL the server has made (pg_current_wal_insert_lsn, in bytes): written or not yet


class TableSampler(Sampler):
    """The queue table `table` (schema-qualified or not) of the database at `url`, every `interval` s, on one
    connection; a database error ends the sampling with a line (and `error`)."""

    SQL = ("SELECT n_tup_ins, n_live_tup, n_dead_tup, vacuum_count, autovacuum_count, autoanalyze_count, "
           "(SELECT count(*) FROM pg_stat_progress_vacuum v WHERE v.relid = s.relid), "
           "pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint "
           "FROM pg_stat_user_tables s WHERE relname = %s")

    def __init__(self, url: str, table: str, interval: float = 1.0):
        super().__init__("table-sampler", interval)
        self.url, self.relname = url, table.rpartition(".")[2]  # pg_stat_user_tables names it without its schema
        self.samples: list[TableStats] = []
        self.error: str | None = None
        self.conn = None

    def run(self) -> None:
        import psycopg
        try:
            with psycopg.connect(self.url, autocommit=True) as self.conn:
                super().run()
        except psycopg.Error as exc:
            self.error = str(exc).strip().splitlines()[0]
            print(f"store sampling stopped: {self.error}", flush=True)

    def sample(self) -> None:
        assert self.conn is not None  # opened by run
        row = self.conn.execute(self.SQL, (self.relname,)).fetchone()
        if row is not None:
            self.samples.append(TableStats(time.time(), *(int(v) for v in row[:6]), vacuuming=bool(row[6]),
                                           wal_bytes=int(row[7])))

    def live_rows(self) -> int | None:
        """The table's live rows at the last sample."""
        return self.samples[-1].live if self.samples else None

    def figures(self, start: float, end: float) -> dict:
        """Within [start, end): the most live and dead rows, vacuums and autovacuums that ended, and
        the seconds during which a vacuum of the table ran."""
        inside = [s for s in self.samples if start <= s.at < end]
        if not inside:
            return {}
        before = [s for s in self.samples if s.at < start][-1:] or inside[:1]
        return {"live_rows_max": max(s.live for s in inside), "dead_rows_max": max(s.dead for s in inside),
                "vacuums": inside[-1].vacuums - before[0].vacuums,
                "autovacuums": inside[-1].autovacuums - before[0].autovacuums,
                "autoanalyzes": inside[-1].autoanalyzes - before[0].autoanalyzes,
                "vacuum_running_s": round(self.interval * sum(1 for s in inside if s.vacuuming), 1)}


class BrokerSampler(Sampler):
    """Every second: the embedded broker's memory (read now), the messages it holds and the input messages
    not read yet (as `chronos up` last sampled them, in its stats file `stats_file`): (time, rss bytes,
    messages held, input messages unread), None where unknown. Nothing without an embedded broker."""

    def __init__(self, stats_file: str | None, interval: float = 1.0):
        super().__init__("broker-sampler", interval)
        self.stats_file = stats_file
        self.samples: list[tuple[float, int | None, int | None, int | None]] = []

    def run(self) -> None:
        if self.stats_file:
            super().run()

    def sample(self) -> None:
        from chronos.adapters.kafka.brokerstats import read_stats, rss_bytes
        assert self.stats_file is not None
        stats = read_stats(self.stats_file)
        if stats is not None:
            rss = rss_bytes(stats["pid"]) if stats.get("pid") else None
            self.samples.append((time.time(), rss if rss is not None else stats.get("rss_bytes"),
                                 stats.get("messages"), stats.get("input_unread")))
