"""A point-in-time restore of the fleet's Patroni cluster into a fresh cluster, as Backups and restore
says: every member archiving its WAL, a base backup of the leader under load, messages before and after
the moment, Chronos stopped on every host with the page's block, the fresh cluster made from the backup by
the page's Patroni bootstrap method, the consumer group moved back by the page's `chronos rewind` on a
Chronos host, Chronos started with the page's block; the page's blocks run as written, with its variables
(the moment, the backup, the archive, the data directory) set to the run's own, as a reader sets them.
Counted: every message the store held at the moment or received after it waits or fires, and what fired
after the moment fires again."""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Iterator

import psycopg
import pytest
import yaml

from kits.fleet import ROOT, Fleet, page_blocks
from chronos.embedded.postgres import server_user

from helpers import Collector, chronos_headers, producer, send, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(600)]
BACKUPS = ROOT / "docs" / "operations" / "backups.md"
FAR = 3600.0  # seconds: a deadline no part of the test reaches


@pytest.fixture(scope="module")
def archiving_fleet(opt_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("fleet-restore"), opt_dir, archive=True).serving() as fleet:
        yield fleet


def _sql(url: str, query: str, *params) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def test_a_patroni_cluster_restored_to_a_moment_loses_nothing_and_fires_again_what_fired_after(archiving_fleet):
    fleet = archiving_fleet
    topic = fleet.kafka.topics["input"]
    with fleet.net.inside("client"):
        p = producer(fleet.kafka.bootstrap)
        out = Collector(fleet.kafka.bootstrap, [fleet.kafka.topics["output"]])
    url, admin = fleet.db.url(), fleet.db.url(admin=True)

    def sent(tag: str, delay_s: float, count: int = 4) -> set[str]:
        ids = {f"{tag}-{i}" for i in range(count)}
        for mid in sorted(ids):
            send(p, topic, b"k", mid.encode(), chronos_headers(mid, time.time() + delay_s))
        p.flush(10)
        return ids

    def fired() -> set[str]:
        with fleet.net.inside("client"):
            out.poll_for(0.2)
        return {m.value.decode() for m in out.on(fleet.kafka.topics["output"])}

    def sql(query: str, on: str = url) -> list[tuple]:
        with fleet.net.inside("client"):
            return _sql(on, query)

    def waiting() -> set[str]:
        return {row[0] for row in sql("SELECT id FROM chronos_messages")}

    try:
        held_before, short_before = sent("before-backup", FAR), sent("fired-before-backup", 1.0)
        wait_for(lambda: short_before <= fired() and held_before <= waiting(), 60, "the first messages")
        backups = fleet.workdir / "backups"
        backups.mkdir()
        user = server_user()
        assert user is not None
        os.chown(backups, *user)
        fleet.db.base_backup(backups / "base")

        held_after = sent("after-backup", FAR)
        due_after_moment = sent("due-after-moment", 8.0)  # waiting at the moment: fires before the restore and after
        wait_for(lambda: (held_after | due_after_moment) <= waiting(), 60, "the messages after the backup")
        ((moment,),) = sql("SELECT now()")
        assert isinstance(moment, datetime) and moment.tzinfo is not None
        received_after, fired_after = sent("received-after-moment", FAR), sent("fired-after-moment", 1.0)
        wait_for(lambda: (due_after_moment | fired_after) <= fired() and received_after <= waiting(), 60,
                 "the messages after the moment")

        (stop,) = page_blocks(BACKUPS, "backup stop")
        for host in fleet.chronos:
            fleet.hosts.leave_group_one_at_a_time(host)  # the embedded broker's need, not the page's
            fleet.hosts.run_block(host, stop)
        ((segment,),) = sql("SELECT pg_walfile_name(pg_switch_wal())", admin)  # the WAL past the moment
        assert fleet.db.archive is not None
        wait_for(lambda: (fleet.db.archive / segment).exists(), 60, "the WAL past the moment archived")

        first = fleet.db.members[0]
        page_settings = {"RESTORE_TO": moment.isoformat(), "BASE_BACKUP": str(backups / "base"),
                         "WAL_ARCHIVE": str(fleet.db.archive), "PGDATA": str(fleet.workdir / first / "pg" / "data")}
        (block,) = page_blocks(BACKUPS, "patroni restore")
        printed = subprocess.run(["bash", "-euo", "pipefail", "-c", block], env={**os.environ, **page_settings},
                                 capture_output=True, text=True, timeout=30, check=True).stdout
        leader = fleet.db.restore_cluster(yaml.safe_load(printed)["bootstrap"])  # the lines the page has one add
        assert leader == first
        at_moment = waiting()
        assert held_before | held_after | due_after_moment <= at_moment
        assert not (received_after & at_moment) and not (short_before & at_moment)
        assert fleet.db.sync_standby() == fleet.db.members[1]  # the other member copied the new leader

        (rewind,) = page_blocks(BACKUPS, "backup rewind")
        rewound = fleet.hosts.run_block(fleet.chronos[1], rewind, timeout=120,
                                  variables={"RESTORE_TO": page_settings["RESTORE_TO"]})
        assert "moved to" in rewound, rewound
        seen_before = Counter(m.value.decode() for m in out.on(fleet.kafka.topics["output"]))
        (start,) = page_blocks(BACKUPS, "backup start")
        for host in fleet.chronos:
            fleet.hosts.run_block(host, start, timeout=90)

        def twice(ids: set[str]) -> bool:
            fired()
            seen = Counter(m.value.decode() for m in out.on(fleet.kafka.topics["output"]))
            return all(seen[mid] > seen_before[mid] >= 1 for mid in ids)
        # what fired after the moment fires again: from the restored store, or re-read from the input topic
        wait_for(lambda: twice(due_after_moment | fired_after), 90, "what fired after the moment, again")
        # nothing lost: what arrived after the moment is back, re-read from the input topic
        wait_for(lambda: held_before | held_after | received_after <= waiting(), 60, "every far message waiting")
        assert not (short_before & waiting())
    finally:
        out.close()
