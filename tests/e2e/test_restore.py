"""A point-in-time restore, as Backups and restore says: a base backup (`pg_basebackup`) with WAL
archived, load, the store recovered to a moment after the backup, the consumer group moved back to that
moment with `chronos rewind`, Chronos started again; then counted: every message the store held at the
moment or received after it waits or fires, and what fired after the moment fires again. The page's
recovery and rewind blocks run as written, with its variables (the moment, the archive, the data
directory) set to the run's own, as a reader sets them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import psycopg
import pytest

from kits.fleet import ROOT, page_blocks
from chronos.adapters.postgres.migrations import migrate
from chronos.embedded.postgres import EmbeddedPostgres, postgres_bin_dir, server_user

from helpers import Collector, chronos_headers, producer, send, wait_for

pytestmark = pytest.mark.timeout(400)
BACKUPS = ROOT / "docs" / "operations" / "backups.md"
ROLES = ("consumer", "firer", "detector")
FAR = 3600.0  # seconds: a deadline no part of the test reaches


def _sql(url: str, query: str, *params) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def _waiting(url: str) -> set[str]:
    return {row[0] for row in _sql(url, "SELECT id FROM chronos_messages")}


def _send(p, topic: str, tag: str, delay_s: float, count: int = 4) -> set[str]:
    ids = {f"{tag}-{i}" for i in range(count)}
    for mid in sorted(ids):
        send(p, topic, b"k", mid.encode(), chronos_headers(mid, time.time() + delay_s))
    p.flush(10)
    return ids


def _archiving_server(base: Path, archive: Path) -> EmbeddedPostgres:
    """A durable server (a base backup needs full-page writes) that copies every finished WAL file to
    `archive`."""
    server = EmbeddedPostgres(base / "data", log_path=base / "postgres.log")
    server.start()
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET archive_mode = on")
        conn.execute(f"ALTER SYSTEM SET archive_command = 'test ! -f {archive}/%f && cp %p {archive}/%f'")
    server.stop()
    server.start()
    return server


def test_a_point_in_time_restore_and_a_rewind_lose_nothing_and_fire_again_what_fired_after(
        tmp_path, broker, topics, processes):
    archive = tmp_path / "archive"
    archive.mkdir()
    user = server_user()
    if user is not None:
        os.chown(archive, *user)
    server = _archiving_server(tmp_path / "pg", archive)
    try:
        url = server.url
        migrate(url)
        env = {"CHRONOS_DATABASE_URL": url}
        out = Collector(broker.bootstrap_servers, [topics["output"]])
        p = producer(broker.bootstrap_servers)

        def fired() -> set[str]:
            out.poll_for(0.2)
            return {m.value.decode() for m in out.on(topics["output"])}

        procs = [processes.start(role, **env) for role in ROLES]
        for proc in procs:
            processes.wait_for_log(proc, "starting: node")
        held_before = _send(p, topics["input"], "before-backup", FAR)
        short_before = _send(p, topics["input"], "fired-before-backup", 1.0)
        wait_for(lambda: short_before <= fired() and held_before <= _waiting(url), 60, "the first messages")

        backup = tmp_path / "base"
        taken = subprocess.run([str(postgres_bin_dir() / "pg_basebackup"), "--host", "127.0.0.1", "--port",
                                str(server.port), "--username", "postgres", "--pgdata", str(backup),
                                "--checkpoint=fast", "--wal-method=stream"],
                               capture_output=True, text=True, timeout=120)
        assert taken.returncode == 0, taken.stderr

        held_after = _send(p, topics["input"], "after-backup", FAR)
        # waiting at the moment, due after it: fired once before the restore, and again after it
        due_after_moment = _send(p, topics["input"], "due-after-moment", 8.0)
        wait_for(lambda: (held_after | due_after_moment) <= _waiting(url), 60, "the messages after the backup")
        # the moment to restore to, by PostgreSQL's clock, and the same instant with its zone for the rewind
        (moment,) = _sql(url, "SELECT now()")[0]
        assert isinstance(moment, datetime) and moment.tzinfo is not None
        received_after = _send(p, topics["input"], "received-after-moment", FAR)
        fired_after = _send(p, topics["input"], "fired-after-moment", 1.0)
        wait_for(lambda: (due_after_moment | fired_after) <= fired() and received_after <= _waiting(url), 60,
                 "the messages after the moment")
        processes.stop_all()
        _sql(url, "SELECT pg_switch_wal()")  # the WAL past the moment, archived
        wait_for(lambda: _sql(url, "SELECT failed_count, last_archived_wal IS NOT NULL FROM pg_stat_archiver")
                 == [(0, True)] and not list((server.data_dir / "pg_wal" / "archive_status").glob("*.ready")),
                 60, "the WAL archived")
        server.stop()
    finally:
        server.stop()

    # the restore: the base backup, WAL replayed from the archive up to the moment, then promoted
    restored_dir = tmp_path / "restored"
    shutil.copytree(backup, restored_dir)
    # the page's variables, the run's own: where the blocks below find the moment, the archive, the data directory
    page_settings = {"RESTORE_TO": moment.isoformat(), "WAL_ARCHIVE": str(archive), "PGDATA": str(restored_dir)}
    (recovery,) = page_blocks(BACKUPS, "restore recovery")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", recovery], env={**os.environ, **page_settings},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    restored = EmbeddedPostgres(restored_dir, log_path=tmp_path / "restored.log")
    restored.start()
    try:
        url = restored.url
        wait_for(lambda: _sql(url, "SELECT pg_is_in_recovery()") == [(False,)], 60, "the restored server promoted")
        at_moment = _waiting(url)
        assert held_before | held_after | due_after_moment <= at_moment
        assert not (received_after & at_moment) and not (short_before & at_moment)

        properties = tmp_path / "kafka.properties"
        properties.write_text("".join(f"{k}={v}\n" for k, v in
                                      dict(x.split("=", 1) for x in processes.base_env["CHRONOS_KAFKA_PROPERTIES"]
                                           .split(",")).items()))
        rewind_env = {**{k: v for k, v in os.environ.items() if not k.startswith("CHRONOS_")},
                      **{k: v for k, v in processes.base_env.items() if k != "CHRONOS_KAFKA_PROPERTIES"},
                      "CHRONOS_KAFKA_PROPERTIES_FILE": str(properties), **page_settings,
                      "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        (rewind,) = page_blocks(BACKUPS, "backup rewind")
        rewound = subprocess.run(["bash", "-euo", "pipefail", "-c", rewind], env=rewind_env, capture_output=True,
                                 text=True, timeout=120)
        assert rewound.returncode == 0, rewound.stderr
        assert "moved to" in rewound.stdout, rewound.stdout

        seen_before = Counter(m.value.decode() for m in out.on(topics["output"]))
        procs = [processes.start(role, CHRONOS_DATABASE_URL=url) for role in ROLES]
        for proc in procs:
            processes.wait_for_log(proc, "starting: node")

        def twice(ids: set[str]) -> bool:
            out.poll_for(0.2)
            seen = Counter(m.value.decode() for m in out.on(topics["output"]))
            return all(seen[mid] > seen_before[mid] >= 1 for mid in ids)
        # what fired after the moment fires again: from the restored store, or re-read from the input topic
        wait_for(lambda: twice(due_after_moment | fired_after), 60, "what fired after the moment, again")
        # nothing lost: what arrived after the moment is back, re-read from the input topic
        wait_for(lambda: held_before | held_after | received_after <= _waiting(url), 60,
                 "every far message waiting")
        assert not (short_before & _waiting(url))
    finally:
        processes.stop_all()
        restored.stop()
        out.close()
