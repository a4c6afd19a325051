"""The limit of the design: the hot path's own SQL (the consumer's COPY, the firer's claim and delete, the
detector's scan) driven as fast as this machine allows, with no Kafka and no Python per message.

    python -m benchmarks.design_limit                       # both layouts, 30 s each
    python -m benchmarks.design_limit --layout 2/2/2 --duration 60 --out limit.json
    python -m benchmarks.design_limit --claims shares                   # each firer claims its own slices
    python -m benchmarks.design_limit --claims shares --schema one-index   # ... off the share index alone

Per layout (consumers/firers/detectors), as many connections as Chronos opens: one COPY connection per
consumer, a claim and a delete connection per firer (with the firer's planner settings and
`synchronous_commit = off`), one scan connection per detector. The COPY streams are built before the
clock starts (binary, as the consumer's native codec writes them, rows of the size the hot-path benchmark
uses: a 100-byte value and two application headers); the claim is Chronos's own statement (of recent
deadlines, with a full one at least every half second, as the firer takes them) with its RETURNING folded
into three text arrays, which the delete takes back as they are, so no Python runs per
row. Writers stop while more than `--backlog` rows wait, so the table stays the size a balanced stack
keeps and the figure is the rate at which rows go in, are claimed and go out.

Reports the rows deleted per second and the CPU of every PostgreSQL process (its backends, WAL writer,
checkpointer, autovacuum) per message; Chronos's own figures on the same kind of stack come from
`benchmarks.sla` and are set against these on docs/benchmarks pages.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
import time
import uuid
from pathlib import Path

import orjson
import psycopg

from benchmarks.harness import report
from benchmarks.harness.database import migrated_postgres
from chronos import codec
from chronos.adapters.postgres.queries import QUERIES
from chronos.domain.model import Row
from chronos.domain.shares import SLICES, slice_limits, slices_of
from chronos.roles.firer.claimer import FULL_CLAIM_EVERY, RECENT_WINDOW_MS

BATCH = 2000
VALUE = b"x" * 100
APP_HEADERS = [("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
               ("content-type", b"application/json")]
LAYOUTS = {"1/1/1": (1, 1, 1), "2/2/2": (2, 2, 2)}
POLL_S = 0.1  # CHRONOS_POLL_INTERVAL_MS's default

# A schema in which a claim can be a HOT update (no index holds or filters on readied_at or readied_by, so
# the claim writes no index entry, only a new row version on the same page when it has room): the claim's
# index scan then steps over the rows in flight, and the detector finds them through the due range.
HOT_SCHEMA = (
    "DROP INDEX chronos_messages_readied",
    "DROP INDEX chronos_messages_due",
    "CREATE INDEX chronos_messages_due ON chronos_messages (deadline, seq) WHERE cron IS NULL",
    "DROP INDEX chronos_messages_topic",
    "CREATE INDEX chronos_messages_topic ON chronos_messages (topic, deadline, seq) WHERE topic IS NOT NULL",
    "DROP INDEX chronos_messages_key",
    "CREATE INDEX chronos_messages_key ON chronos_messages USING hash (key) WHERE key IS NOT NULL",
)
# A schema with one index for the due rows: the share index alone, every claim a claim of slices
# (`--claims shares`), so a written row updates one index for its deadline instead of two.
ONE_INDEX_SCHEMA = ("DROP INDEX chronos_messages_due",)
SCHEMAS = {"current": (), "hot": HOT_SCHEMA, "one-index": ONE_INDEX_SCHEMA}
HOT_FIND_STALE = ("SELECT id, readied_at, readied_by, ctid FROM chronos_messages "
                  "WHERE cron IS NULL AND deadline <= now() + interval '1 hour' AND readied_at IS NOT NULL "
                  "AND readied_at < now() - %(hold_ms)s * interval '1 millisecond' LIMIT %(limit)s")

# The claim, its RETURNING folded into text arrays the delete takes back unchanged; a full one, and one of
# recent deadlines only, taken in turn as the firer takes them (`Claimer.claim_rows`).
# The fifth column says whether the claim took a row due before the window (a full claim must follow).
CLAIMED = "id, deadline_us, topic, key, value, headers, readied_at, seq, attempts, original_us, ctid"


def folded(name: str, columns: str = CLAIMED) -> str:
    """The claim statement `name` (whose RETURNING gives `columns`), folded into one row."""
    return (f"WITH claimed ({columns}) AS ({QUERIES[name]}) "
            "SELECT count(*), array_agg(ctid)::text, array_agg(id)::text, array_agg(readied_at)::text, "
            "coalesce(bool_or(deadline_us < extract(epoch FROM now()) * 1000000 - %(window_ms)s * 1000), false) "
            "FROM claimed")


CLAIM, CLAIM_RECENT = folded("claim"), folded("claim_recent")
# The claim of a firer's own slices (`--claims shares`, as Chronos's firers claim beside each other): each row
# also says its slice.
CLAIM_SHARE, CLAIM_SHARE_RECENT = folded("claim_share", CLAIMED + ", slice"), folded("claim_share_recent",
                                                                                     CLAIMED + ", slice")


def ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def cpu_of(pids: list[int]) -> float:
    """CPU seconds (user + system) of the processes still alive."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / ticks()


def server_pids(postmaster: int) -> list[int]:
    """The postmaster and its children: every process of the server."""
    pids = [postmaster]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def copy_streams(count: int, run: str) -> list[bytes]:
    """`count` binary COPY streams of BATCH rows each, due at once, ids unique across them."""
    headers = codec.encode_headers(APP_HEADERS)
    due = int(time.time() * 1e6) - 1_000_000
    return [codec.copy_rows([Row(f"{run}-{k}-{i}", due, None, b"key-%d" % i, VALUE, headers) for i in range(BATCH)])
            for k in range(count)]


class Drive:
    """The threads of one layout on one database, and their counts."""

    def __init__(self, url: str, consumers: int, firers: int, detectors: int, backlog: int, streams: list[bytes],
                 find_stale: str = QUERIES["find_stale"], rate: float | None = None, shares: bool = False):
        """`shares`: the firers divide the slices between them (`slices_of`, their nodes made here) and each
        claims its own, as Chronos's firers do; else each claims from all the due rows."""
        self.url, self.backlog, self.streams, self.find_stale = url, backlog, streams, find_stale
        self.nodes = [uuid.uuid4() for _ in range(firers)]
        self.shares = shares
        # with a rate, the writers together COPY a batch every BATCH / rate seconds, on a shared schedule
        self.every = None if rate is None else BATCH / rate
        self.next_copy = time.monotonic()
        self.inserted = self.deleted = self.claims = 0
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.errors: list[str] = []
        self.threads = ([threading.Thread(target=self.guard, args=(self.write, k), daemon=True) for k in range(consumers)]
                        + [threading.Thread(target=self.guard, args=(self.fire, k), daemon=True) for k in range(firers)]
                        + [threading.Thread(target=self.guard, args=(self.detect, k), daemon=True)
                           for k in range(detectors)])
        self.next_stream = 0

    def guard(self, body, k: int) -> None:
        try:
            body(k)
        except Exception as exc:  # noqa: BLE001 - the run reports it and stops
            self.errors.append(f"{body.__name__} {k}: {exc}")
            self.halt.set()

    def write(self, _k: int) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.halt.is_set():
                if self.inserted - self.deleted > self.backlog:
                    time.sleep(0.0005)
                    continue
                with self.lock:
                    stream = self.streams[self.next_stream % len(self.streams)]
                    self.next_stream += 1
                    at = self.next_copy
                    if self.every is not None:
                        self.next_copy = max(self.next_copy, time.monotonic() - 1.0) + self.every
                if self.every is not None and at > time.monotonic():
                    time.sleep(at - time.monotonic())
                with conn.transaction(), conn.cursor() as cur, cur.copy(QUERIES["copy_messages"]) as copy:
                    copy.write(stream)
                with self.lock:
                    self.inserted += BATCH

    def fire(self, k: int) -> None:
        node = self.nodes[k]
        settled: queue.SimpleQueue = queue.SimpleQueue()
        deleter = threading.Thread(target=self.guard, args=(lambda k: self.delete(settled, node), 0), daemon=True)
        deleter.start()
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(QUERIES["hot_path_settings"])
            conn.execute(QUERIES["async_commit"])
            params: dict = {"node": node, "limit": BATCH, "lookahead_ms": 300, "window_ms": RECENT_WINDOW_MS}
            claim, claim_recent = CLAIM, CLAIM_RECENT
            if self.shares:
                mine = slices_of(node, [n for n in self.nodes if n != node]) or tuple(range(SLICES))
                params["slices"], params["limits"] = slice_limits(mine, BATCH)
                claim, claim_recent = CLAIM_SHARE, CLAIM_SHARE_RECENT
            next_full = 0.0
            while not self.halt.is_set():
                full = time.monotonic() >= next_full
                count, ctids, ids, readied, late = conn.execute(claim if full else claim_recent, params,
                                                                prepare=True).fetchone()
                if full:  # as the firer: another full claim at once after one that came back full or found late rows
                    next_full = time.monotonic() + (0 if count == BATCH or late else FULL_CLAIM_EVERY)
                self.claims += 1
                if count:
                    settled.put((count, ctids, ids, readied))
                if count < BATCH:  # as the firer paces itself: at once again only while a claim comes back full
                    time.sleep(POLL_S)
        settled.put(None)
        deleter.join(10)

    def delete(self, settled: queue.SimpleQueue, node: uuid.UUID) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(QUERIES["hot_path_settings"])
            conn.execute(QUERIES["async_commit"])
            while True:
                item = settled.get()
                if item is None:
                    return
                count, ctids, ids, readied = item
                conn.execute(QUERIES["delete_fired"], {"ctids": ctids, "ids": ids, "readied_at": readied, "node": node},
                             prepare=True)
                with self.lock:
                    self.deleted += count

    def detect(self, _k: int) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(QUERIES["hot_path_settings"])
            while not self.halt.wait(0.5):
                conn.execute(self.find_stale, {"hold_ms": 5000, "limit": 10000}).fetchall()


def run_layout(url: str, postmaster: int, layout: str, duration: float, warmup: float, backlog: int,
               streams: list[bytes], schema: str = "current", rate: float | None = None, claims: str = "race") -> dict:
    consumers, firers, detectors = LAYOUTS[layout]
    with psycopg.connect(url, autocommit=True) as conn:  # what an earlier layout left, whose ids come again
        conn.execute("TRUNCATE chronos_messages")
    drive = Drive(url, consumers, firers, detectors, backlog, streams,
                  HOT_FIND_STALE if schema == "hot" else QUERIES["find_stale"], rate, shares=claims == "shares")
    stats0 = table_stats(url)
    for t in drive.threads:
        t.start()
    time.sleep(warmup)
    pids = server_pids(postmaster)
    d0, pg0, me0, t0 = drive.deleted, cpu_of(pids), time.process_time(), time.monotonic()
    time.sleep(duration)
    d1, pg1, me1, t1 = drive.deleted, cpu_of(server_pids(postmaster)), time.process_time(), time.monotonic()
    drive.halt.set()
    for t in drive.threads:
        t.join(15)
    if drive.errors:
        raise RuntimeError("; ".join(drive.errors))
    elapsed, messages = t1 - t0, d1 - d0
    stats1 = table_stats(url)
    updates = stats1[0] - stats0[0]
    return {"layout": layout, "schema": schema, "claim_mode": claims, "offered_rate": rate,
            "seconds": round(elapsed, 1), "messages": messages,
            "hot_update_share": round((stats1[1] - stats0[1]) / updates, 3) if updates else None,
            "rate_per_s": round(messages / elapsed), "postgres_cores": round((pg1 - pg0) / elapsed, 3),
            "postgres_us_per_message": round((pg1 - pg0) / messages * 1e6, 2) if messages else None,
            "driver_cores": round((me1 - me0) / elapsed, 3), "claims": drive.claims}


def table_stats(url: str) -> tuple[int, int]:
    """(updates, HOT updates) of chronos_messages so far."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        row = conn.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                           "WHERE relname = 'chronos_messages'").fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layout", choices=sorted(LAYOUTS), action="append", help="default: both")
    parser.add_argument("--duration", type=float, default=30.0, help="measured seconds per layout (default 30)")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--backlog", type=int, default=20_000, help="rows that may wait before writers pause")
    parser.add_argument("--rate", type=float, default=None,
                        help="messages per second the writers offer (default: as fast as the machine allows)")
    parser.add_argument("--schema", choices=sorted(SCHEMAS), default="current",
                        help="hot: no index on readied_at, so a claim may be a HOT update; one-index: no due index, "
                             "the share index alone (with --claims shares)")
    parser.add_argument("--claims", choices=("race", "shares"), default="race",
                        help="race: every firer claims from all the due rows; shares: each claims its own slices, "
                             "off the share index, as Chronos's firers do")
    parser.add_argument("--fillfactor", type=int, default=None, help="the table's fillfactor (the schema's: 80)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.schema == "one-index" and args.claims != "shares":
        parser.error("--schema one-index has no due index: its firers claim their slices (--claims shares)")
    rows = []
    with migrated_postgres("chronos-limit-") as pg:  # the server chronos up runs, with its durable settings
        with psycopg.connect(pg.url, autocommit=True) as conn:
            for statement in SCHEMAS[args.schema]:
                conn.execute(statement)
            if args.fillfactor:
                conn.execute(f"ALTER TABLE chronos_messages SET (fillfactor = {int(args.fillfactor)})")
        streams = copy_streams(max(20, 8 * args.backlog // BATCH), uuid.uuid4().hex[:8])
        for layout in args.layout or sorted(LAYOUTS):
            row = run_layout(pg.url, pg.pid, layout, args.duration, args.warmup, args.backlog, streams, args.schema,
                             args.rate, args.claims)
            rows.append(row)
            print(orjson.dumps(row).decode(), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_bytes(orjson.dumps({
            "date": time.strftime("%Y-%m-%d"), "batch": BATCH, "backlog": args.backlog, "schema": args.schema,
            "claim_mode": args.claims, "fillfactor": args.fillfactor, "rate": args.rate,
            "command": "python -m benchmarks.design_limit " + " ".join(argv or sys.argv[1:]),
            "code": report.code_version(), "rows": rows}, option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
