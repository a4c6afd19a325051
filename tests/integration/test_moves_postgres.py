"""A move of an input partition between two cells on PostgreSQL (`chronos.ops.moves` over the real store): its
rows all go over as they stand at the cut-over while the source's writers and firer go on, a move killed at the
cut-over is finished by the next, and nothing of it is left in either database: no trigger, no noted change, no
record. A watch that cannot have the table's lock at once gives up and is tried again, without holding
the table's writers behind it; the cut-over takes no lock of the table, and waits for the rows a firer's claim
that deletes holds without holding any write behind it."""

from __future__ import annotations

import threading
import time
import uuid

import psycopg
import pytest

from chronos.adapters.postgres import moves as pg_moves
from chronos.adapters.postgres.queries import QUERIES
from chronos.adapters.postgres.store import Store
from chronos.adapters.postgres.takes import TakeStatements
from chronos.domain.cells import CANCEL, MOVING, CellPartition as P, Fence
from chronos.domain.model import Row
from chronos.domain.moves import MOVE_NODE
from chronos.errors import CellMapChanged
from chronos.ops.moves import MoveSettings, Mover

HOUR = 3_600_000_000


def now_us() -> int:
    return time.time_ns() // 1000


def row(mid: str, deadline_us: int, partition: int, value: bytes = b"v", **kw) -> Row:
    return Row(mid, deadline_us, None, b"k", value, b"", kw.get("okey"), partition, cron=kw.get("cron"))


def q(url: str, sql: str, *params):
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql, params or None)
        return cur.fetchall() if cur.description else []


class Died(Exception):
    pass


@pytest.fixture
def cells(two_cells, monkeypatch):
    monkeypatch.setattr(pg_moves, "SCAN_BLOCKS", 40)  # the copy walks the table in many stretches
    urls = {"cell1": two_cells["a"], "cell2": two_cells["b"]}
    firers = {c: Store(u, node_id=uuid.uuid4()) for c, u in urls.items()}
    firers["cell1"].open_partitions([0, 1], 1)
    firers["cell2"].open_partitions([2, 3], 1)
    for f in firers.values():
        f.firer_heartbeat(5000)
    t = now_us()
    firers["cell1"].apply([row(f"far{i}", t + 30 * HOUR + i, 1, value=b"x" * 200) for i in range(6000)]
                          + [row(f"soon{i}", t + 2_000_000 + i * 1000, 1) for i in range(50)]
                          + [row(f"p0-{i}", t + HOUR, 0) for i in range(500)]
                          + [row("daily", t + HOUR, 1, cron="*/5 * * * *")], [], [])
    yield urls, firers
    for f in firers.values():
        f.close()


def stores(urls):
    return {c: Store(u) for c, u in urls.items()}


def held_by_cell(urls) -> dict[str, set[str]]:
    """The ids each cell could fire (not dormant)."""
    return {c: {r[0] for r in q(u, "SELECT id FROM chronos_messages WHERE readied_by IS DISTINCT FROM %s", MOVE_NODE)}
            for c, u in urls.items()}


def test_the_partition_goes_over_whole_while_the_source_writes_and_fires(cells):
    urls, firers = cells
    stop = threading.Event()
    fired: dict[str, list[str]] = {"cell1": [], "cell2": []}
    refused = threading.Event()

    def firer(cell: str) -> None:  # claims what is due and deletes it, as a firer that publishes at once
        st = Store(urls[cell], node_id=uuid.uuid4())
        while not stop.is_set():
            st.firer_heartbeat(5000)
            claimed = st.claim(100, 0)
            st.delete_fired(claimed)
            fired[cell] += [c.id for c in claimed]
            time.sleep(0.02)
        st.close()

    def consumer() -> None:  # writes partitions 0 and 1 to cell1, fenced, until the map says 1 moved
        st = Store(urls["cell1"])
        i = 0
        while not stop.is_set():
            i += 1
            t = now_us()
            try:
                st.apply([row(f"c{i}", t + 1_500_000, 1), row(f"c{i}-far", t + 40 * HOUR, 1)],
                         [row(f"far{i}", t + 50 * HOUR, 1, value=b"replaced")], [f"far{i + 3000}"],
                         fence=Fence({0: 1, 1: 1}))
            except CellMapChanged:
                refused.set()
                break
            time.sleep(0.005)
        st.close()
    threads = [threading.Thread(target=firer, args=(c,)) for c in urls] + [threading.Thread(target=consumer)]
    for t in threads:
        t.start()
    try:
        lines: list[str] = []
        moved = Mover(stores(urls), MoveSettings(batch=500), say=lines.append).move(1, "cell2")
        assert refused.wait(10)  # the consumer's write was refused at the cut-over
        time.sleep(2.5)          # everything due by now has fired
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert moved.copied > 5000 and moved.epoch == 3 and moved.schedules == 1
    assert Store(urls["cell2"]).cell_partitions() == [P(1, 3), P(2, 1), P(3, 1)]
    assert Store(urls["cell1"]).cell_partitions() == [P(0, 1), P(1, 2, MOVING)]
    # fired once, in one cell
    assert not set(fired["cell1"]) & set(fired["cell2"])
    assert len(fired["cell1"]) == len(set(fired["cell1"])) and len(fired["cell2"]) == len(set(fired["cell2"]))
    cell1, cell2 = held_by_cell(urls)["cell1"], held_by_cell(urls)["cell2"]
    assert cell1 == {f"p0-{i}" for i in range(500)}
    written = {m for m in fired["cell1"] + fired["cell2"] if m.startswith("c")}
    # every message of partition 1: fired, or waiting in cell2 (its far ones), as the last write left it
    consumer_writes = max(int(m[1:].split("-")[0]) for m in written | {x for x in cell2 if x.startswith("c")})
    expected = ({f"far{i}" for i in range(6000)} - {f"far{i + 3000}" for i in range(1, consumer_writes + 1)}) \
        | {f"c{i}-far" for i in range(1, consumer_writes + 1)} | {"daily"}
    assert expected <= cell2 and not (cell2 - expected) - written
    assert {f"soon{i}" for i in range(50)} <= set(fired["cell1"]) | set(fired["cell2"])
    replaced = q(urls["cell2"], "SELECT count(*) FROM chronos_messages WHERE value = 'replaced'")[0][0]
    assert replaced == consumer_writes
    # nothing left of the move: no trigger, no noted change, no record, no dormant row
    assert q(urls["cell1"], "SELECT tgname FROM pg_trigger WHERE tgname LIKE 'chronos_move%'") == []
    assert q(urls["cell1"], "SELECT count(*) FROM chronos_cell_move_changes")[0][0] == 0
    assert q(urls["cell1"], "SELECT count(*) FROM chronos_cell_moves")[0][0] == 0
    assert q(urls["cell2"], "SELECT count(*) FROM chronos_messages WHERE readied_by = %s", MOVE_NODE)[0][0] == 0
    assert any("cut over to cell cell2 at epoch 3" in line for line in lines)


def test_a_move_killed_at_the_cut_over_is_finished_by_the_next_one(cells):
    urls, _ = cells
    first = stores(urls)
    opened = first["cell2"].open_partitions

    def dies(partitions, epoch):
        opened(partitions, epoch)
        raise Died()
    first["cell2"].open_partitions = dies
    with pytest.raises(Died):
        Mover(first, MoveSettings(lease_ms=1000)).move(1, "cell2")
    assert q(urls["cell1"], "SELECT step FROM chronos_cell_moves") == [("cutting-over",)]
    # dead: its rows of the partition are frozen in cell1 and woken (due soon) or dormant in cell2, fired by neither
    held = held_by_cell(urls)
    assert {f"far{i}" for i in range(6000)} <= held["cell1"] and not {f"far{i}" for i in range(6000)} & held["cell2"]
    moved = Mover(stores(urls), MoveSettings(lease_ms=1000)).move(1, "cell2")
    assert moved.epoch == 3
    held = held_by_cell(urls)
    assert held["cell1"] == {f"p0-{i}" for i in range(500)}
    assert {f"far{i}" for i in range(6000)} | {f"soon{i}" for i in range(50)} | {"daily"} == held["cell2"]
    assert q(urls["cell1"], "SELECT tgname FROM pg_trigger WHERE tgname LIKE 'chronos_move%'") == []


def waiting_for_tables(url: str) -> list[tuple]:
    """The sessions that wait for a lock of a table (every write to it then waits behind them)."""
    return q(url, "SELECT pid, mode FROM pg_locks WHERE locktype = 'relation' AND NOT granted")


@pytest.mark.parametrize("ends", ["commits", "rolls back"])
def test_a_row_a_firers_claim_that_deletes_holds_while_its_partition_moves_fires_in_one_cell_only(cells, ends):
    urls, firers = cells
    t = now_us()
    firers["cell1"].apply([row("held", t - 2000, 1), row("due", t - 1000, 1)], [], [])
    node = uuid.uuid4()
    takes = TakeStatements(urls["cell1"], node_id=node, held_ms=60_000, application_name=f"chronos firer {node}")
    moving = stores(urls)
    freeze, frozen = moving["cell1"].freeze, threading.Event()

    def taken_then_frozen(partition: int):  # the firer takes a batch just before the cut-over, and holds it
        assert [c.id for c in takes.claim(1, 0)] == ["held"]  # deleted in its transaction, open until Kafka acks
        epoch = freeze(partition)
        frozen.set()
        return epoch
    moving["cell1"].freeze = taken_then_frozen
    moved: list = []
    mover = threading.Thread(target=lambda: moved.append(Mover(moving, MoveSettings(lease_ms=1000)).move(1, "cell2")))
    mover.start()
    writer = Store(urls["cell1"])
    try:
        # the freeze goes through at once, with no lock of the table (which the firer's transaction holds); the
        # cut-over waits for the held row alone, which stays in cell1 alone, while the other partitions' writes
        # go on, none of them behind a lock the move waits for
        assert frozen.wait(60)
        for i in range(20):
            writer.apply([row(f"w{i}", now_us() + HOUR, 0)], [], [], fence=Fence({0: 1}))
            assert waiting_for_tables(urls["cell1"]) == []
        assert "held" not in held_by_cell(urls)["cell2"] and mover.is_alive()
    finally:
        if ends == "commits":
            takes.finish([], [], [], "out")  # published: gone
        else:
            takes.give_back()                # handed back: goes over with the others
        mover.join(60)
        takes.close()
        writer.close()
    assert moved and moved[0].epoch == 3
    held = held_by_cell(urls)
    assert "held" not in held["cell1"] and "due" in held["cell2"]
    assert ("held" in held["cell2"]) == (ends == "rolls back")


def test_a_firers_claim_that_deletes_leaves_a_frozen_partitions_rows_alone_and_holds_none_of_them(cells):
    """Once a partition is closed for its cut-over, a deleting firer's claims neither take its rows nor lock
    them: its freeze would skip the delete, but only once the row was locked, for as long as the firer holds its
    batch, and a firer claiming again and again would keep the cut-over waiting for as long as it fires."""
    urls, firers = cells
    t = now_us()
    firers["cell1"].apply([row("frozen", t - 3000, 1), row("other", t - 2000, 0)], [], [])
    node = uuid.uuid4()
    takes = TakeStatements(urls["cell1"], node_id=node, held_ms=60_000, application_name=f"chronos firer {node}")
    source = stores(urls)["cell1"]
    try:
        source.freeze(1)
        assert [c.id for c in takes.claim(10, 0)] == ["other"]  # its batch held open, as until Kafka acks
        assert source.held(1, now_us() + HOUR) == 0
        with psycopg.connect(urls["cell1"]) as conn:  # no lock on the frozen row
            conn.execute("SET lock_timeout = '1s'")
            assert conn.execute("SELECT id FROM chronos_messages WHERE id = 'frozen' FOR UPDATE NOWAIT").fetchall() \
                == [("frozen",)]
    finally:
        takes.give_back()
        takes.close()
        source.close()


def test_a_watch_that_cannot_have_the_tables_lock_at_once_gives_up_without_holding_its_writers(cells):
    urls, firers = cells
    st = Store(urls["cell1"])
    with psycopg.connect(urls["cell1"]) as blocker:
        blocker.execute("LOCK TABLE chronos_messages IN ROW EXCLUSIVE MODE")  # a long write in progress
        started = time.monotonic()
        assert st.watch(1) is False  # at once: no request for the lock left waiting
        assert time.monotonic() - started < 1.0
        assert st.watch(1, wait_ms=1500) is False  # after many tries: a request that waits, as long as it is told
        assert time.monotonic() - started >= 1.5
        assert q(urls["cell1"], "SELECT tgname FROM pg_trigger WHERE tgname LIKE 'chronos_move%'") == []
    assert st.watch(1) is True
    with psycopg.connect(urls["cell1"]) as writer:
        writer.execute("LOCK TABLE chronos_messages IN ROW EXCLUSIVE MODE")  # the freeze does not wait for it
        with psycopg.connect(urls["cell1"]) as consumer:  # a consumer's write that checked its fence, not ended
            consumer.execute("SELECT * FROM chronos_cell_partitions WHERE partition = 1 FOR SHARE")
            assert st.freeze(1) is None  # the map's lock not had within the lock timeout: tried again
        assert firers["cell1"].cell_partitions() == [P(0, 1), P(1, 1)]  # nothing done
        assert st.freeze(1) == 2
        assert st.unwatch(1) is False  # the triggers dropped only once the table is free
    # free now but for a moment's autovacuum of the table, whose lock the drop does not wait for either (a move
    # tries again, as here)
    deadline = time.monotonic() + 10.0
    while not st.unwatch(1):
        assert time.monotonic() < deadline, "the triggers never dropped"
        time.sleep(0.1)
    assert q(urls["cell1"], "SELECT tgname FROM pg_trigger WHERE tgname LIKE 'chronos_move%'") == []
    st.close()


def test_a_hand_over_waits_a_moment_for_a_row_a_statement_under_way_changes_and_never_hands_it_as_it_was(cells):
    urls, _ = cells
    st = Store(urls["cell1"])
    assert st.watch(1)
    with psycopg.connect(urls["cell1"]) as claim:  # a claim begun before the freeze, its transaction not ended yet
        claim.execute("UPDATE chronos_messages SET readied_at = now(), readied_by = %s WHERE id = 'soon0'",
                      (uuid.uuid4(),))
        assert st.freeze(1) == 2  # the map alone: the claim's transaction does not hold it off
        given: list = []
        until = now_us() + HOUR
        assert st.hand_over(1, until, 100, given.extend) is None and given == []  # tried again, nothing handed
        claim.commit()
    assert st.hand_over(1, until, 100, given.extend) == 49
    assert "soon0" not in {r.id for r in given} and st.held(1, until) == 1  # stamped: its firer settles it here
    st.close()


def test_a_change_a_write_is_noting_right_now_is_left_to_carry_again_and_the_move_does_not_wait_for_it(cells):
    """The move forgets the changes it carried over while writes note more: one that a write's transaction is
    noting again right now is left (carried again later), and the move waits for no write. Waiting, a write that
    notes several rows in its own order (a firer's batch, a consumer's poll) and the move in another would each
    wait for the other: PostgreSQL ends one of them as a deadlock."""
    urls, _ = cells
    st = Store(urls["cell1"], deadline_s=3.0)
    st.begin_move(1, "cell2", uuid.uuid4(), 0)
    assert st.watch(1)
    q(urls["cell1"], "UPDATE chronos_messages SET deadline = deadline + interval '1 second' "
                     "WHERE id IN ('far1', 'far2')")
    carried = st.changes(1, 10)
    assert sorted(c.id for c in carried) == ["far1", "far2"]
    with psycopg.connect(urls["cell1"]) as writer:  # a write of far1 under way, its transaction not ended
        writer.execute("UPDATE chronos_messages SET deadline = deadline + interval '1 second' WHERE id = 'far1'")
        started = time.monotonic()
        st.forget(1, carried)
        assert time.monotonic() - started < 1.0
    assert [c.id for c in st.changes(1, 10)] == ["far1"]  # noted again by the write: carried again
    st.close()


def test_a_forward_a_write_is_noting_right_now_is_left_to_forward_again_and_the_round_does_not_wait(database_url):
    """The same for the cancels and replaces a consumer forwards: one that another consumer's write is noting again
    right now is left, to forward again, and the round that forgets them waits for no write."""
    st = Store(database_url, deadline_s=3.0)
    st.apply([], [], ["a", "b"], forward=True)
    pending = st.pending_forwards(10)
    with psycopg.connect(database_url) as writer:
        writer.execute(QUERIES["note_forwards"], {"action": CANCEL, "ids": ["a"]})
        started = time.monotonic()
        st.forget_forwards(pending)
        assert time.monotonic() - started < 1.0
    assert [f.id for f in st.pending_forwards(10)] == ["a"]
    st.close()
