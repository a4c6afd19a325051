"""The sender's held rows (`chronos.roles.firer.held.Held`): publishing order, and the cost of
keeping it."""

from __future__ import annotations

import heapq
import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from chronos.domain.model import Claimed
from chronos.roles.firer.held import Held


def row(n: int) -> Claimed:
    return Claimed(id=f"m{n}", deadline_us=0, topic=None, key=None, value=None, headers=None, readied_at=None)


class Deadline(float):
    """A deadline that counts how often entries are compared by it."""
    compared = 0

    def _count(self, other, op):
        Deadline.compared += 1
        return op(float(self), float(other))

    def __lt__(self, other): return self._count(other, float.__lt__)
    def __le__(self, other): return self._count(other, float.__le__)
    def __gt__(self, other): return self._count(other, float.__gt__)
    def __ge__(self, other): return self._count(other, float.__ge__)
    def __eq__(self, other): return self._count(other, float.__eq__)
    __hash__ = float.__hash__


# batches of (deadline, seq) as claims hand them over (each sorted or not), and the horizons published up to
batches = st.lists(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 3)), max_size=12), max_size=12)


@settings(max_examples=300, deadline=None)
@given(batches, st.lists(st.integers(0, 60), max_size=12))
def test_rows_are_taken_in_deadline_then_enqueue_then_arrival_order(claims, horizons):
    held, arrival, reference, taken, expected = Held(), itertools.count(), [], [], []
    for k, batch in enumerate(claims):
        entries = [(float(d), seq, next(arrival), 0.0, row(n)) for n, (d, seq) in enumerate(batch)]
        held.add(list(entries), 0.0)
        for e in entries:
            heapq.heappush(reference, e[:3] + (e[4].id,))
        horizon = horizons[k] if k < len(horizons) else -1
        taken += [r.id for r in held.take_due(float(horizon), 0.0)[0]]
        while reference and reference[0][0] <= horizon:
            expected.append(heapq.heappop(reference)[3])
        assert len(held) == len(reference)
        assert held.first() == (reference[0][0] if reference else None)
    assert taken == expected
    assert [r.id for r in held.take_all()] == [e[3] for e in sorted(reference)]
    assert len(held) == 0 and held.first() is None


def test_claims_in_deadline_order_cost_a_comparison_or_two_per_row():
    """Claims come in deadline order: each row is appended and taken with about one comparison, where
    the heap it replaces compared about log2(n) times per row (16 here)."""
    held, arrival, rows = Held(), itertools.count(), 0
    Deadline.compared = 0
    for claim in range(400):  # 10,000 rows held, 50 claimed and 50 published at a time
        base = 1_000.0 + claim * 0.005
        held.add([(Deadline(base + i * 0.0001), 0, next(arrival), 0.0, row(i)) for i in range(50)], 0.0)
        rows += 50
        if claim >= 200:
            assert len(held.take_due(1_000.0 + (claim - 200) * 0.005 + 0.0049, 0.0)[0]) == 50
    assert len(held) == 10_000
    assert Deadline.compared / rows < 4, Deadline.compared / rows


def test_a_claim_earlier_than_rows_held_is_merged_in_place():
    held, arrival = Held(), itertools.count()
    held.add([(float(d), 0, next(arrival), 0.0, row(d)) for d in (10, 20, 30)], 0.0)
    held.add([(float(d), 0, next(arrival), 0.0, row(d)) for d in (25, 5, 40)], 0.0)  # unsorted, and before some held
    assert [r.id for r in held.take_due(25.0, 0.0)[0]] == ["m5", "m10", "m20", "m25"]
    assert held.first() == 30.0 and len(held) == 2


def test_taken_entries_are_dropped_once_many():
    held, arrival = Held(), itertools.count()
    held.add([(float(d), 0, next(arrival), 0.0, row(d)) for d in range(Held.COMPACT_AT * 2)], 0.0)
    held.take_due(float(Held.COMPACT_AT + 10), 0.0)
    assert held.head == 0 and len(held.entries) == Held.COMPACT_AT - 11 and held.first() == Held.COMPACT_AT + 11


def test_rows_claimed_before_the_limit_are_set_apart_and_the_rest_published():
    """Two claims, one sent at 100 s and one at 200 s (monotonic): at 180 s, with a hold time of 40 s
    (rows publishable for 30 s), rows of the first are too old to publish, whatever their deadlines;
    once they are gone the bound follows the rows still held, so later passes look at no row's claim
    again."""
    held, arrival = Held(hold_time_ms=40_000), itertools.count()
    assert held.hold_limit == 30.0
    held.add([(float(d), 0, next(arrival), 100.0, row(d)) for d in (1, 3, 5)], 100.0)
    held.add([(float(d), 0, next(arrival), 200.0, row(d)) for d in (2, 4, 6)], 200.0)
    assert held.take_due(0.5, 180.0) == ([], [])
    due, expired = held.take_due(4.0, 180.0)
    assert [r.id for r in due] == ["m2", "m4"] and [r.id for r in expired] == ["m1", "m3"]
    assert held.oldest_claim == 100.0  # m5 is still held
    due, expired = held.take_due(10.0, 180.0)
    assert [r.id for r in due] == ["m6"] and [r.id for r in expired] == ["m5"]
    assert held.oldest_claim == float("inf")
