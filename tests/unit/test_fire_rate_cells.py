"""Fire-rate limits hold for a deployment of cells as a whole: each cell's firers take a share of every limit by
the input partitions the cell owns, so the cells' buckets together refill at the limit's rate; the share
follows the partitions as they move. Two cells on in-memory databases, their firers' claimers driven by hand."""

from __future__ import annotations

import pytest

from chronos import codec
from chronos.adapters.memory import ManualClock, MemoryStore
from chronos.domain.cells import MOVING, CellPartition as P
from chronos.domain.model import Row
from chronos.domain.ratelimit import FireRateLimits, TopicRates, cell_share
from chronos.roles.firer import claimer as claimer_module
from test_roles_firer import Firer

CELLS = "a=postgresql://unused@127.0.0.1:1/a b=postgresql://unused@127.0.0.1:1/b"
RATE = 40.0


def test_a_cells_share_is_its_open_partitions_over_the_topics():
    assert cell_share([P(0, 1), P(1, 1), P(2, 1)], 4) == 0.75
    assert cell_share([P(0, 1), P(1, 2, MOVING)], 4) == 0.25  # on its way out: the new cell's
    assert cell_share([P(1, 2, MOVING)], 4) == 0.25            # none left, rows maybe: one partition's
    assert cell_share([], 4) is None and cell_share([P(0, 1)], None) is None  # the whole: one cell, or not known
    limits = FireRateLimits(TopicRates((("orders", 500.0), ("audit", None))), default=100.0)
    half = limits.scaled(0.5)
    assert (half.rate_for("orders"), half.rate_for("audit"), half.rate_for("other")) == (250.0, None, 50.0)


def cell_firer(cell: str, partitions: list[int], clock: ManualClock, claim: str = "stamp") -> Firer:
    f = Firer(CHRONOS_CELLS=CELLS, CHRONOS_CELL=cell, CHRONOS_FIRE_RATE_DEFAULT=str(RATE), CHRONOS_FIRER_CLAIM=claim)
    f.db.now_us = clock
    f.publisher.topic_partitions = {f.settings.input_topic: 4}
    MemoryStore(f.db).open_partitions(partitions, 1)
    MemoryStore(f.db).apply([Row(f"{cell}{i}", clock() - 1_000_000, None, b"k", b"v", codec.encode_headers([]))
                             for i in range(2000)], [], [])
    return f


def claimed(f: Firer) -> int:
    """Rows claimed: stamped, or taken by the claim that deletes (held, or gone with their batch)."""
    return 2000 - sum(not r.in_flight for r in f.db.rows.values())


def settle(f: Firer) -> None:
    """The batches the claim that deletes holds, committed as if every row was published: their sessions free."""
    if f.proc.batches is not None:
        for batch in list(f.proc.batches.open.values()):
            batch.session.finish([], [], [], f.settings.output_topic)
            f.proc.batches.ended(batch)


@pytest.mark.parametrize("claim", ["stamp", "delete"])
def test_two_cells_firers_together_fire_at_the_limits_rate_each_at_its_share(monkeypatch, claim):
    clock = ManualClock()
    a, b = cell_firer("a", [0, 1, 2], clock, claim), cell_firer("b", [3], clock, claim)
    seconds = 10
    for _ in range(seconds * 10):
        clock.advance(0.1)
        for f in (a, b):
            monkeypatch.setattr(claimer_module.time, "monotonic", lambda: clock() / 1e6)
            f.proc.claimer.claim(clock() / 1e6)
            settle(f)
    # each bucket: its share of the rate for the time, and at most one second of it at first
    assert a.proc.claimer.limits.share == 0.75 and b.proc.claimer.limits.share == 0.25
    assert RATE * 0.75 * seconds <= claimed(a) <= RATE * 0.75 * (seconds + 1) + 1
    assert RATE * 0.25 * seconds <= claimed(b) <= RATE * 0.25 * (seconds + 1) + 1
    assert claimed(a) + claimed(b) <= RATE * (seconds + 1) + 2


def test_the_share_follows_a_partition_that_moves(monkeypatch):
    clock = ManualClock()
    a = cell_firer("a", [0, 1, 2], clock)
    monkeypatch.setattr(claimer_module.time, "monotonic", lambda: clock() / 1e6)
    a.proc.claimer.claim(clock() / 1e6)
    assert a.proc.claimer.limits.share == 0.75
    MemoryStore(a.db).close_partitions([2])  # moving away
    clock.advance(claimer_module.SHARE_EVERY_S + 0.1)
    a.proc.claimer.claim(clock() / 1e6)
    assert a.proc.claimer.limits.share == 0.5 and a.proc.claimer.limits.limits.default == RATE * 0.5
