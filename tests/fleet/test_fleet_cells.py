"""Two cells on the fleet, each a Patroni cluster of its own (db-1 and db-2 for cell1, db-3 and db-4 for cell2),
the Chronos hosts installed against both as the install page's Cells section says, under load: a cell's primary
killed outright, a cell's primary cut off, a Chronos host cut off from one cell only, an input partition moved to
the other cell. Each time nothing acknowledged is lost or published early, no program needs supervisord to
restart it, and the other cell's messages are delivered on time meanwhile. The move comes last: the others count
on the first assignment of the partitions."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import pytest

from kits.fleet import ROOT, Fleet, page_blocks
from kits.fleet.scenarios import holder_of, host_cut, partition_move, primary_cut, primary_kill
from test_partitions import DB_TIMEOUT_S, HOLD_S, RATE, SESSION_S, TAKEOVER_S, verdict

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(600)]

INSTALL = ROOT / "docs" / "operations" / "host-install.md"
# a message of the cell that stays well is published this late at most while the other cell's fault lasts: a
# consumer gives a hung cell's part of a poll up half a second after the other cells' parts are durable, and the
# load's own jitter on this shared machine reaches a second; held up by the other cell, it would wait for the
# statement's deadline (5 s) or for the failover (over 20 s)
ON_TIME_S = 2.5
# every partition's messages are published this late at most while a partition moves on the fleet, whose hosts
# share two cores with the rest of the suite: full runs of the suite saw their arrivals 6.5 s and 10.3 s late, in
# both cells alike (16 s of load); a partition held back for the whole move, or for a statement's deadline and
# the hold time, goes past it. The goals (the moving partition 5 s late at most, the others unchanged) are measured
# by `python -m benchmarks.cells`, not here
MOVE_LATE_S = 10.0


@pytest.fixture(scope="module")
def running_fleet(opt_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A fleet of two cells for this module's tests."""
    with Fleet(tmp_path_factory.mktemp("fleet-cells"), opt_dir, cells=2).serving() as fleet:
        yield fleet


def test_the_install_pages_cells_run_as_written_each_firer_and_detector_serving_its_cell(fleet):
    (check,) = page_blocks(INSTALL, "check cells")
    for host in fleet.chronos:
        out = fleet.hosts.run_block(host, check)
        assert "cell cell1: input partitions 0-1" in out and "cell cell2: input partitions 2-3" in out, out
        assert '"role":"firer"' in out.replace(" ", "") and '"cell":"cell2"' in out.replace(" ", ""), out
        assert "(cell cell1)" in host.log("firer_00") and "(cell cell2)" in host.log("detector_01")
    (message,) = page_blocks(INSTALL, "message")
    done = fleet.hosts.run_block(fleet.chronos[1], message, timeout=90)
    assert "key='hello' value='world'" in done, done


def published(row) -> dict[str, float]:
    """Each cell's latest publish of a message due during the fault, after its due time, by the message's
    CreateTime: what Chronos did, without the broker's delays and the test's own reader's (a thread of this
    process, whose arrival times the suite's load on the machine delays by seconds at times)."""
    late = row["max_publish_lateness_during_fault_by_cell_s"]
    assert late is not None, row
    return late


def on_time(row, other: str, more_s: float = 0.0) -> None:
    late = published(row)
    assert late[other] < ON_TIME_S + more_s, (late, "arrivals:", row["max_lateness_during_fault_by_cell_s"])


def test_a_cells_primary_killed_its_standby_takes_over_and_the_other_cell_stays_on_time(fleet, fault_report):
    standby = fleet.cells["cell2"].sync_standby()
    report, row = primary_kill(fleet, cell="cell2", rate=RATE, down_s=25.0)
    fault_report(report)
    verdict(report, row)
    assert row["new_primary"] == standby, row
    assert row["old_primary_rejoined_after_start_s"] is not None, row
    on_time(row, "cell1")


def test_a_cells_primary_cut_off_its_standby_takes_over_and_the_other_cell_stays_on_time(fleet, fault_report):
    report, row = primary_cut(fleet, cell="cell2", cut_s=30.0, rate=RATE)
    fault_report(report)
    verdict(report, row)
    assert row["old_primary_rejoined_after_heal_s"] is not None, row
    on_time(row, "cell1")



def test_a_chronos_host_cut_off_from_one_cell_leaves_that_cells_partitions_to_the_other_host(fleet, fault_report):
    """The host whose consumer holds both of cell2's partitions (so that no other consumer commits there) is cut
    off from cell2's cluster only: its consumer leaves the group once the other host's consumer has said, in
    cell1, that it reaches cell2, and that one then writes cell2's messages, as the other host's cell2 firer
    fires the rows the cut-off host's held; cell1's messages wait no longer than the group's rebalance."""
    holder = holder_of(fleet, {2, 3})
    other = next(h for h in fleet.chronos if h is not holder)
    said_before = {h.name: len(h.log("consumer_00")) for h in fleet.chronos}
    report, row = host_cut(fleet, cut_s=15.0, rate=RATE, peers="cell2", host=holder.name, warmup=3.0, rejoin_s=2.0)
    fault_report(report)
    verdict(report, row)
    said = holder.log("consumer_00")[said_before[holder.name]:]
    word = re.search(r"another consumer of group \S+ reached cell cell2 ([\d.]+)s after this one lost it", said)
    assert word, said
    # a write under way when the cut began gives up at its deadline; the other host's consumer says that it
    # reaches cell2 (every second, in cell1) `word` seconds later; the cut-off one's own tries hang for the hold
    # time after that word, then it leaves the group, and the other takes its partitions in the rebalance
    word_s = float(word.group(1))
    left_at = row["first_log_lines"]["left consumer group"][0]
    assert left_at < DB_TIMEOUT_S + word_s + HOLD_S + 1.5, (left_at, word_s)
    late = published(row)
    assert late["cell2"] < TAKEOVER_S + DB_TIMEOUT_S + word_s, (late, word_s)
    # the cut-off consumer's leaving rebalances the group: the other consumer gives cell1's partitions up and
    # takes them back with cell2's, within the session timeout and a poll (a full run of the suite saw 3.9 s)
    on_time(row, "cell1", more_s=SESSION_S + 2.0)
    # cell2's messages sent during the cut reach cell2 through the other host's consumer only: some were
    # delivered before the heal
    assert row["sent_during_cut_delivered_before_heal_by_cell"]["cell2"] > 0, row
    assert "left consumer group" in said and "rejoining consumer group" in said, said
    assert "left consumer group" not in other.log("consumer_00")[said_before[other.name]:]
    words = [word for _, word in row["health"][f"{holder.name}/consumer_00"]]
    assert any(re.search(r"postgres of cell cell2", word, re.I) for word in words), words  # says which cell


def test_a_partition_moved_to_the_other_cell_under_load_loses_nothing_and_fires_nothing_early(fleet, fault_report):
    """`chronos cells move` on a Chronos host, as the databases' owner, moves input partition 3 with its far-future
    rows from cell2 to cell1 while the load runs: nothing lost or early, no message published more often than the
    consumer group's rebalances explain (none by both cells), the far-future rows all in cell1."""
    report, row = partition_move(fleet, partition=3, to="cell1", rate=RATE, warmup=3.0, settle=2.0)
    fault_report(report)
    assert report.lost == [] and report.early == [], report.line()
    assert report.duplicates == 0, (report.line(), sorted(report.duplicated_ids)[:5])
    assert row["restarted_programs"] == {}, row
    assert any("partition 3 is in cell cell1" in line for line in row["move_said"]), row["move_said"]
    rows = row["rows_after_by_cell"]
    assert rows["cell2"] == 0 and rows["cell1"] >= 2000, rows
    late = published(row)  # by the first assignment: partitions 2 and 3 as cell2's
    assert late["cell2"] < MOVE_LATE_S and late["cell1"] < MOVE_LATE_S, (
        late, "arrivals:", row["max_lateness_during_fault_by_cell_s"], "move:", row["move_s"], row["move_said"])
