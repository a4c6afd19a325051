"""Moving an input partition between cells (`chronos.ops.moves`) on the in-memory twin: the rows of the partition
all go over, as they stand at the cut-over (written, replaced, cancelled, claimed and handed back meanwhile),
none is ever claimable in both cells or before its deadline, the other partitions are left alone; a move that
dies at any step is finished by the next one; a new cell gets its share of the partitions."""

from __future__ import annotations

import uuid
from typing import Any, Callable

import pytest

from chronos.adapters.memory import ManualClock, MemoryDatabase, MemoryStore, MemoryTakes
from chronos.domain.cells import MOVING, CellMapError, CellPartition as P
from chronos.domain.model import Row
from chronos.domain.moves import COPYING, CUTTING_OVER, FINISHING, MOVE_NODE, MoveBusy, MoveError, Woken, share_for
from chronos.ops.moves import MoveSettings, Mover, first_wait_ms

HOUR = 3_600_000_000
SETTINGS = MoveSettings(batch=50, ahead_ms=10_000, near_ms=10_000, rate=0)


class Died(Exception):
    """The move's process killed at this point."""


class Cells:
    """Two cells on one manual clock: cell1 owns partitions 0-1, cell2 owns 2-3; a firer in each."""

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.dbs = {"cell1": MemoryDatabase(self.clock), "cell2": MemoryDatabase(self.clock)}
        self.firers = {c: MemoryStore(db, node_id=uuid.uuid4()) for c, db in self.dbs.items()}
        self.firers["cell1"].open_partitions([0, 1], 1)
        self.firers["cell2"].open_partitions([2, 3], 1)
        for firer in self.firers.values():
            firer.firer_heartbeat(5000)

    def beat(self) -> None:
        """The firers renew their leases (time passed)."""
        for firer in self.firers.values():
            firer.firer_heartbeat(5000)

    def stores(self) -> dict[str, Any]:
        return {c: MemoryStore(db) for c, db in self.dbs.items()}

    def mover(self, stores: dict[str, Any] | None = None, **kw: Any) -> Mover:
        return Mover(stores or self.stores(), SETTINGS, clock=lambda: self.clock() / 1e6,
                     sleep=self.clock.advance, **kw)

    def write(self, cell: str, rows: list[Row], replaces: tuple[Row, ...] = (), cancels: tuple[str, ...] = ()) -> None:
        self.firers[cell].apply(rows, list(replaces), list(cancels))

    def fireable(self) -> dict[str, list[str]]:
        """id -> the cells where a firer could claim it, once due (not dormant, not frozen, not held)."""
        found: dict[str, list[str]] = {}
        for cell, db in self.dbs.items():
            for r in db.rows.values():
                if r.waiting:
                    found.setdefault(r.id, []).append(cell)
        return found

    def values(self, cell: str) -> dict[str, bytes | None]:
        return {r.id: r.value for r in self.dbs[cell].rows.values() if r.readied_by != MOVE_NODE}


def row(mid: str, deadline_us: int, partition: int, value: bytes = b"v", **kw: Any) -> Row:
    return Row(mid, deadline_us, None, b"k", value, b"", kw.get("okey"), partition, cron=kw.get("cron"))


def loaded() -> Cells:
    cells = Cells()
    now = cells.clock()
    cells.write("cell1", [row(f"far{i}", now + 30 * HOUR + i, 1) for i in range(300)]
                + [row(f"soon{i}", now + 5_000_000 + i, 1) for i in range(20)]
                + [row(f"p0-{i}", now + HOUR, 0) for i in range(30)]
                + [row("daily", now + HOUR, 1, cron="0 9 * * *")])
    return cells


def test_every_row_of_the_partition_goes_over_and_the_others_stay():
    cells = loaded()
    moved = cells.mover().move(1, "cell2")
    assert (moved.source, moved.target, moved.epoch) == ("cell1", "cell2", 3)
    assert moved.copied == 300 and moved.handed == 20 and moved.schedules == 1
    assert cells.firers["cell1"].cell_partitions() == [P(0, 1), P(1, 2, MOVING)]
    assert cells.firers["cell2"].cell_partitions() == [P(1, 3), P(2, 1), P(3, 1)]
    assert set(cells.values("cell2")) == {f"far{i}" for i in range(300)} | {f"soon{i}" for i in range(20)} | {"daily"}
    assert set(cells.values("cell1")) == {f"p0-{i}" for i in range(30)}
    assert all(len(where) == 1 for where in cells.fireable().values())
    assert cells.dbs["cell1"].moves == {} and cells.dbs["cell1"].frozen == set()
    # the enqueue order goes on past the source's in the target
    assert cells.dbs["cell2"].seq_last >= cells.dbs["cell1"].seq_last
    # asked again: nothing to do
    assert cells.mover().move(1, "cell2").already


def test_what_is_written_during_the_copy_goes_over_as_it_stands_at_the_cut_over():
    cells = loaded()
    stores = cells.stores()
    now = cells.clock()
    firer = cells.firers["cell1"]
    put = stores["cell2"].put
    calls = [0]
    fired: list[str] = []
    handed_back: list[str] = []

    def meanwhile(rows, *, dormant):  # the consumers and firers of cell1 go on while the copy runs
        calls[0] += 1
        if calls[0] == 2:
            cells.write("cell1", [row("new-far", now + 40 * HOUR, 1), row("new-soon", now + 7_000_000, 1)],
                        (row("far3", now + 50 * HOUR, 1, value=b"replaced"),), ("far5", "soon1"))
            cells.clock.advance(6)  # soon0..soon19 are due: cell1's firer fires some, hands one back
            claimed = firer.claim(3, 0)
            firer.delete_fired(claimed[:2])
            firer.release(claimed[2:])
            fired.extend(c.id for c in claimed[:2])
            handed_back.extend(c.id for c in claimed[2:])
        return put(rows, dormant=dormant)
    stores["cell2"].put = meanwhile
    cells.mover(stores).move(1, "cell2")
    values = cells.values("cell2")
    assert values["far3"] == b"replaced" and "far5" not in values and "soon1" not in values
    assert {"new-far", "new-soon"} <= set(values)
    assert fired == ["soon0", "soon2"] and not set(fired) & set(values)  # fired in cell1: not again in cell2
    assert handed_back == ["soon3"] and "soon3" in values                 # handed back in cell1: fired in cell2
    assert set(cells.values("cell1")) == {f"p0-{i}" for i in range(30)}
    assert all(len(where) == 1 for where in cells.fireable().values())


def test_a_row_a_firer_holds_at_the_cut_over_is_settled_in_the_source_first():
    cells = loaded()
    firer = cells.firers["cell1"]
    cells.clock.advance(6)
    cells.beat()
    held = firer.claim(5, 0)  # published from memory now and then
    stores = cells.stores()
    freeze = stores["cell1"].freeze
    settled: list[str] = []

    def then_settle(partition):
        epoch = freeze(partition)
        cells.clock.advance(0.5)
        firer.delete_fired(held[:3])  # acknowledged: deleted
        firer.release(held[3:])       # handed back: goes over
        settled.extend(c.id for c in held)
        return epoch
    stores["cell1"].freeze = then_settle
    moved = cells.mover(stores).move(1, "cell2")
    assert settled and moved.handed == 20 - 3
    values = cells.values("cell2")
    assert not {c.id for c in held[:3]} & set(values) and {c.id for c in held[3:]} <= set(values)


def test_rows_a_claim_that_deletes_holds_at_the_cut_over_wait_for_its_transaction_to_end():
    cells = loaded()
    cells.clock.advance(6)
    cells.beat()
    takes = MemoryTakes(cells.dbs["cell1"], node_id=uuid.uuid4())
    held = takes.claim(5, 0)  # in the firer's open transaction: still there to the move, deleted once it commits
    ended: list[str] = []

    def waits(seconds: float) -> None:  # the cut-over waits for the rows held: the firer's batch ends meanwhile
        if not ended:
            assert not {c.id for c in held} & set(cells.values("cell2"))  # none handed over while held
            takes.finish(held[3:], [], [], "out")  # three published, gone with the commit; two handed back
            ended.extend(c.id for c in held)
        cells.clock.advance(seconds)
    moved = Mover(cells.stores(), SETTINGS, clock=lambda: cells.clock() / 1e6, sleep=waits).move(1, "cell2")
    assert ended and moved.handed == 20 - 3
    values = cells.values("cell2")
    assert not {c.id for c in held[:3]} & set(values) and {c.id for c in held[3:]} <= set(values)
    assert not {c.id for c in held} & set(cells.values("cell1"))


def test_a_row_held_by_a_firer_that_died_is_taken_back_after_the_hold_time():
    cells = loaded()
    cells.clock.advance(6)
    cells.beat()
    held = cells.firers["cell1"].claim(2, 0)  # and never settled
    moved = cells.mover().move(1, "cell2")
    assert moved.cut_over_s >= (SETTINGS.hold_ms + SETTINGS.detection_ms) / 1000
    assert {c.id for c in held} <= set(cells.values("cell2"))


def test_no_row_is_claimable_in_both_cells_or_early_at_any_step():
    cells = loaded()
    stores = cells.stores()
    seen: list[dict[str, list[str]]] = []
    for store in stores.values():
        for name in ("put", "hand_over", "wake", "open_partitions", "drop_scan", "freeze"):
            method = getattr(store, name)

            def watched(*a, _m=method, **k):
                result = _m(*a, **k)
                seen.append(cells.fireable())
                return result
            setattr(store, name, watched)
    cells.mover(stores).move(1, "cell2")
    assert len(seen) > 10
    for fireable in seen:
        assert [mid for mid, where in fireable.items() if len(where) > 1] == []


def die_at(store: Any, method: str, nth: int = 1) -> Callable[[], None]:
    """Make `store.method` raise Died at its nth call (after it ran); returns a function that undoes it."""
    original = getattr(store, method)
    calls = [0]

    def dying(*a, **k):
        result = original(*a, **k)
        calls[0] += 1
        if calls[0] == nth:
            raise Died(method)
        return result
    setattr(store, method, dying)
    return lambda: setattr(store, method, original)


@pytest.mark.parametrize("cell, method, nth, step", [
    ("cell1", "watch", 1, COPYING),
    ("cell2", "put", 2, COPYING),
    ("cell1", "scan", 2, COPYING),
    ("cell1", "freeze", 1, CUTTING_OVER),
    ("cell1", "hand_over", 1, CUTTING_OVER),
    ("cell1", "ship_schedules", 1, CUTTING_OVER),
    ("cell2", "open_partitions", 1, CUTTING_OVER),
    ("cell2", "wake", 3, FINISHING),
    ("cell1", "drop_scan", 1, FINISHING),
    ("cell1", "unwatch", 1, FINISHING),
])
def test_a_move_that_died_at_any_step_is_finished_by_the_next_one(cell, method, nth, step):
    cells = loaded()
    stores = cells.stores()
    die_at(stores[cell], method, nth)
    with pytest.raises(Died):
        cells.mover(stores).move(1, "cell2")
    (record,) = cells.dbs["cell1"].moves.values()
    assert record.step == step
    # while it is dead: rows fire once at most, and the partition stays closed from its freeze until the target
    # opens it
    assert all(len(where) == 1 for where in cells.fireable().values())
    lines: list[str] = []
    moved = cells.mover(say=lines.append).move(1, "cell2")  # another node: waits for the dead one's lease
    assert any("waiting for its lease" in line for line in lines)
    assert moved.epoch == 3 or step == FINISHING
    assert set(cells.values("cell2")) == {f"far{i}" for i in range(300)} | {f"soon{i}" for i in range(20)} | {"daily"}
    assert set(cells.values("cell1")) == {f"p0-{i}" for i in range(30)}
    assert all(len(where) == 1 for where in cells.fireable().values())
    assert cells.dbs["cell1"].moves == {}


def test_a_move_under_way_to_one_cell_is_not_sent_to_another():
    cells = loaded()
    cells.dbs["cell3"] = MemoryDatabase(cells.clock)
    stores = cells.stores()
    die_at(stores["cell2"], "put", 1)
    with pytest.raises(Died):
        cells.mover(stores).move(1, "cell2")
    with pytest.raises(MoveError, match="on its way to cell cell2: run the move to cell2 again to finish it first"):
        cells.mover().move(1, "cell3")


def test_two_movers_of_one_partition_do_not_run_at_once():
    cells = loaded()
    stores = cells.stores()
    first = cells.mover(stores)
    die_at(stores["cell2"], "put", 1)
    with pytest.raises(Died):
        first.move(1, "cell2")
    other = cells.mover()
    stores["cell1"].lease_move(1, first.node, 10_000)  # the first renews its lease meanwhile: it runs
    renew = other.sleep

    def sleeping(s: float) -> None:
        stores["cell1"].lease_move(1, first.node, 10_000)
        renew(s)
    other.sleep = sleeping
    with pytest.raises(MoveBusy):
        other.move(1, "cell2")


def test_the_target_needs_a_firer_and_every_running_consumer():
    cells = loaded()
    cells.dbs["cell2"].firers.clear()
    with pytest.raises(MoveError, match="no firer serves cell cell2"):
        cells.mover().move(1, "cell2")
    cells.firers["cell2"].firer_heartbeat(5000)
    consumer = uuid.uuid4()
    MemoryStore(cells.dbs["cell1"], node_id=consumer).announce("consumer", "http", 9400, None)
    with pytest.raises(MoveError, match=f"consumer\\(s\\) {consumer} do not write to cell cell2: restart them"):
        cells.mover().move(1, "cell2")
    assert cells.dbs["cell1"].moves == {}  # nothing begun
    MemoryStore(cells.dbs["cell2"], node_id=consumer).announce("consumer", "http", 9400, None)
    assert cells.mover().move(1, "cell2").epoch == 3


def test_a_busy_table_is_asked_for_its_lock_only_if_free_at_once_until_many_tries_found_it_taken():
    cells = loaded()
    stores = cells.stores()
    watch, asked = stores["cell1"].watch, []

    def busy(partition, *, wait_ms=0):  # the source's table never free at once, its lock had by waiting long enough
        asked.append(wait_ms)
        return wait_ms >= 1600 and watch(partition, wait_ms=wait_ms)
    stores["cell1"].watch = busy
    cells.mover(stores).move(1, "cell2")
    # the first as long as a firer's held batch lasts (its lookahead and an acknowledgement), then each wait twice
    # the last: as long as the longest transaction under way needs, and no longer, since every write of the table
    # waits behind the request meanwhile
    assert asked == [0] * SETTINGS.queue_after + [400, 800, 1600]


def test_the_first_wait_for_the_lock_covers_the_firers_lookahead_and_an_acknowledgement():
    assert first_wait_ms(300) == MoveSettings().queue_first_ms == 400
    assert first_wait_ms(1000) == 1100


def test_the_triggers_are_dropped_only_if_the_table_is_free_at_once_and_else_left_noting_nothing():
    cells = loaded()
    stores = cells.stores()
    asked: list[int] = []

    def busy(partition, *, wait_ms=0):  # the source's writers never leave its lock free at once
        asked.append(wait_ms)
        assert len(asked) <= 10 * SETTINGS.queue_after, f"asked again and again: {asked[-5:]}"
        return False
    stores["cell1"].unwatch = busy
    lines: list[str] = []
    cells.mover(stores, say=lines.append).move(1, "cell2")
    # never a request that waits, which every write of the table would wait behind
    assert asked == [0] * SETTINGS.queue_after
    assert any("its triggers stay on cell cell1's table, noting nothing" in line for line in lines)
    assert cells.dbs["cell1"].moves == {} and cells.dbs["cell1"].watched == {}
    assert set(cells.values("cell2")) == {f"far{i}" for i in range(300)} | {f"soon{i}" for i in range(20)} | {"daily"}


def test_the_wait_for_a_busy_tables_lock_grows_no_further_than_the_hold_time():
    cells = loaded()
    stores = cells.stores()
    watch, asked = stores["cell1"].watch, []

    def busy(partition, *, wait_ms=0):
        asked.append(wait_ms)
        return len(asked) > SETTINGS.queue_after + 10 and watch(partition, wait_ms=wait_ms)
    stores["cell1"].watch = busy
    cells.mover(stores).move(1, "cell2")
    assert max(asked) == SETTINGS.hold_ms and asked[-1] == SETTINGS.hold_ms


def test_unknown_cells_and_partitions_already_there_are_said_plainly():
    cells = loaded()
    with pytest.raises(MoveError, match="no cell 'cell9' in CHRONOS_CELLS"):
        cells.mover().move(1, "cell9")
    assert cells.mover().move(2, "cell2").already


def test_a_new_cell_takes_its_share_one_partition_at_a_time():
    cells = loaded()
    cells.dbs["cell3"] = db = MemoryDatabase(cells.clock)
    MemoryStore(db, node_id=uuid.uuid4()).firer_heartbeat(5000)
    lines: list[str] = []
    moved = cells.mover(say=lines.append).add("cell3", None)
    assert [(m.partition, m.source) for m in moved] == [(3, "cell2")]
    assert "cell cell3 takes partitions 3" in lines
    assert MemoryStore(db).cell_partitions() == [P(3, 3)]


def test_a_cell_added_to_one_that_lists_nothing_writes_the_map_out_first():
    clock = ManualClock()
    dbs = {"cell1": MemoryDatabase(clock), "cell2": MemoryDatabase(clock)}
    MemoryStore(dbs["cell2"], node_id=uuid.uuid4()).firer_heartbeat(5000)
    MemoryStore(dbs["cell1"]).apply([row("a", clock() + HOUR, 3)], [], [])
    mover = Mover({c: MemoryStore(db) for c, db in dbs.items()}, SETTINGS, clock=lambda: clock() / 1e6,
                  sleep=clock.advance)
    with pytest.raises(MoveError, match="partition count is not known"):
        mover.add("cell2", None)
    with pytest.raises(CellMapError, match="no cell of cell1, cell2 lists any input partition"):
        mover.move(3, "cell2")
    assert [m.partition for m in mover.add("cell2", 4)] == [3, 2]
    assert MemoryStore(dbs["cell1"]).cell_partitions() == [P(0, 1), P(1, 1), P(2, 2, MOVING), P(3, 2, MOVING)]
    assert {r.id for r in dbs["cell2"].rows.values()} == {"a"}


def test_a_new_cells_share_is_taken_from_those_that_own_the_most():
    assert share_for({"a": [0, 1, 2, 3], "b": [4, 5, 6, 7]}, "c") == [(7, "b"), (3, "a")]
    assert share_for({"a": list(range(8))}, "b") == [(7, "a"), (6, "a"), (5, "a"), (4, "a")]
    assert share_for({"a": [0, 1, 2], "b": [3]}, "b") == [(2, "a")]
    assert share_for({"a": [0], "b": [1]}, "c") == []


def test_the_wake_goes_on_from_each_batchs_end_then_from_the_first_until_nothing_is_left():
    """Each batch starts where the last ended (from the first, it would walk over every row woken before it in
    PostgreSQL's in-flight index), and the wake ends only on a batch from the first that finds nothing: a row a
    batch passed over is still woken."""
    answers = [Woken(2, 10), Woken(2, 20), Woken(0, None), Woken(1, 5), Woken(0, None), Woken(0, None)]
    asked: list[int | None] = []

    class Target:
        def wake(self, partition: int, until_us: int | None, limit: int, after: int | None = None) -> Woken:
            asked.append(after)
            return answers[len(asked) - 1]

    batches: list[int] = []
    assert Mover._wake(Target(), 1, None, 2, batches.append) == 5  # type: ignore[arg-type]
    assert asked == [None, 10, 20, None, 5, None]
    assert batches == [2, 2, 1]


def test_rows_a_claim_that_deletes_gives_back_just_after_a_hand_over_passed_them_by_go_over_too():
    """The firer's transaction rolls back (its publish failed) between the hand-over that passed its rows by, as
    held, and the move's next look at what is held: the rows are back, no longer held, and go over with the
    others; the cut-over never ends on a look at what is held taken after a hand-over that left rows out."""
    cells = loaded()
    cells.clock.advance(6)
    cells.beat()
    takes = MemoryTakes(cells.dbs["cell1"], node_id=uuid.uuid4())
    held = takes.claim(5, 0)
    stores = cells.stores()
    hand_over = stores["cell1"].hand_over

    def then_given_back(*args: Any, **kwargs: Any) -> Any:
        handed = hand_over(*args, **kwargs)
        if not handed and held and not takes_ended:
            takes.give_back()  # right after this hand-over, before the move looks at what is held again
            takes_ended.append(True)
        return handed
    takes_ended: list[bool] = []
    stores["cell1"].hand_over = then_given_back
    moved = cells.mover(stores).move(1, "cell2")
    assert takes_ended and moved.epoch == 3
    assert {c.id for c in held} <= set(cells.values("cell2"))
    assert not {c.id for c in held} & set(cells.values("cell1"))
