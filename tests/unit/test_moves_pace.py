"""A move's pace (`chronos.domain.moves.Pace`, CHRONOS_MOVE_RATE): the copy ahead, the waking and the deletion of a
partition's rows go at the rate asked, in statements of a tenth of a second's rows, on a clock the test gives; the
cut-over is never held back by it."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from chronos import config
from chronos.adapters.memory import ManualClock, MemoryDatabase, MemoryStore
from chronos.domain.model import Row
from chronos.domain.moves import Pace
from chronos.ops.moves import MoveSettings, Mover

HOUR = 3_600_000_000


def test_rows_go_at_the_rate_on_average():
    pace = Pace(1000)
    assert pace.after(100, 0.0) == pytest.approx(0.1)
    assert pace.after(100, 0.1) == pytest.approx(0.1)
    assert pace.after(100, 0.25) == pytest.approx(0.05)
    # statements slower than their share of the rate: no wait, and the time lost is made up
    assert pace.after(100, 0.5) == 0.0
    assert pace.after(100, 0.5) == 0.0
    assert pace.after(100, 0.5) == pytest.approx(0.1)


def test_a_step_that_fell_behind_makes_up_at_most_a_second_of_it():
    pace = Pace(1000)
    pace.after(100, 0.0)
    # ten seconds of slow statements: only a second's rows (a thousand) then go without waiting
    waits = [pace.after(100, 10.0) for _ in range(12)]
    assert waits[:10] == [0.0] * 10 and waits[10] == pytest.approx(0.1)


def test_unpaced_nothing_waits_and_statements_take_the_whole_batch():
    pace = Pace(0)
    assert [pace.after(5000, t) for t in (0.0, 0.0, 0.0)] == [0.0, 0.0, 0.0]
    assert pace.chunk(5000) == 5000


def test_a_statement_carries_a_tenth_of_a_seconds_rows_within_the_batch():
    assert Pace(10_000).chunk(5000) == 1000
    assert Pace(100_000).chunk(5000) == 5000
    assert Pace(50).chunk(5000) == 100  # a hundred at least: round trips cost too
    assert Pace(50).chunk(30) == 30


class Recorded:
    """Two cells on one manual clock, with partition 1's far-future rows in cell1; every row-moving statement
    the move makes recorded with the clock's time and its size (0: the cut-over's, which the rate leaves alone)."""

    def __init__(self, far: int) -> None:
        self.clock = ManualClock()
        self.dbs = {"cell1": MemoryDatabase(self.clock), "cell2": MemoryDatabase(self.clock)}
        firers = {c: MemoryStore(db, node_id=uuid.uuid4()) for c, db in self.dbs.items()}
        firers["cell1"].open_partitions([0, 1], 1)
        firers["cell2"].open_partitions([2, 3], 1)
        for firer in firers.values():
            firer.firer_heartbeat(5000)
        now = self.clock()
        firers["cell1"].apply([Row(f"far{i}", now + 30 * HOUR + i, None, b"k", b"v", b"", None, 1)
                               for i in range(far)], [], [])
        self.calls: list[tuple[str, float, int]] = []
        self.stores: dict[str, Any] = {c: MemoryStore(db) for c, db in self.dbs.items()}
        for name, size in (("put", lambda rows, **k: len(rows)),
                           ("wake", lambda p, until, limit, after=None: limit if until is None else 0),
                           ("drop_scan", lambda p, cursor, rows: rows)):
            for cell, store in self.stores.items():
                self._record(cell, store, name, size)

    def _record(self, cell: str, store: Any, name: str, size: Any) -> None:
        method = getattr(store, name)

        def recorded(*a: Any, **k: Any) -> Any:
            self.calls.append((f"{cell}.{name}", self.clock() / 1e6, size(*a, **k)))
            return method(*a, **k)
        setattr(store, name, recorded)

    def move(self, rate: int) -> tuple[Any, float]:
        started = self.clock() / 1e6
        mover = Mover(self.stores, MoveSettings(batch=500, rate=rate), clock=lambda: self.clock() / 1e6,
                      sleep=self.clock.advance)
        return mover.move(1, "cell2"), self.clock() / 1e6 - started

    def times(self, name: str) -> list[float]:
        return [at for what, at, size in self.calls if what == name and size]


def test_the_copy_the_waking_and_the_deletion_go_at_the_rate_and_the_cut_over_does_not_wait():
    cells = Recorded(far=2000)
    moved, took = cells.move(rate=1000)
    assert moved.copied == 2000 and moved.woken == 2000
    # statements of a tenth of a second's rows, each step about two seconds of the clock for 2,000 rows
    assert max(size for what, _, size in cells.calls if what == "cell2.put") <= 100
    assert max(size for what, _, size in cells.calls if what in ("cell2.wake", "cell1.drop_scan")) == 100
    for name in ("cell2.put", "cell2.wake", "cell1.drop_scan"):
        at = cells.times(name)
        assert at[-1] - at[0] >= 1.7, name
    assert took >= 5.5
    assert moved.cut_over_s == 0.0  # no pause of the partition for the rate's sake


def test_unpaced_the_move_takes_no_time_of_the_clock():
    cells = Recorded(far=2000)
    moved, took = cells.move(rate=0)
    assert moved.copied == 2000 and took == 0.0


def test_the_rate_is_a_setting_of_its_own():
    assert config.load(environ={}, default_ready_file=False).move_rate == 0
    assert config.load(environ={"CHRONOS_MOVE_RATE": "10000"}, default_ready_file=False).move_rate == 10_000
    with pytest.raises(config.ConfigError, match="CHRONOS_MOVE_RATE"):
        config.load(environ={"CHRONOS_MOVE_RATE": "fast"}, default_ready_file=False)
