"""The parked messages of several cells (chronos.ops.parked), on in-memory cells: each named CELL#NUMBER, a
listing merged newest first with a cursor that holds every cell's place, the actions in every cell with one
confirmation for all, and each cell counting what was done there."""

from __future__ import annotations

import re

import pytest

from chronos import codec
from chronos.adapters.kafka.memory import MemoryKafka, MemoryProducer
from chronos.adapters.memory import ManualClock, MemoryDatabase, MemoryStore
from chronos.domain.model import Parked
from chronos.domain.operators import ParkedFilters
from chronos.errors import ConfigError, NeedsConfirmation, NotFound
from chronos.ops import parked

OUT = "chronos.output"
DESTINATIONS = parked.Destinations(OUT, "dlq", re.compile(r"t\..*"))


def pm(mid: str) -> Parked:
    return Parked(mid, f"store/{mid}", OUT, None, b"k", mid.encode(), codec.encode_headers([]),
                  "too_large: MSG_SIZE_TOO_LARGE: too large")


@pytest.fixture
def cells():
    clock = ManualClock()
    stores = {"a": MemoryStore(MemoryDatabase(clock)), "b": MemoryStore(MemoryDatabase(clock))}
    # parked in turn, a second apart: a holds p0, p2, p4, b holds p1, p3 (each cell numbers its own from 1)
    for i in range(5):
        stores["a" if i % 2 == 0 else "b"].park([pm(f"p{i}")])
        clock.advance(1.0)
    return stores


def walk(stores, limit: int, filters: ParkedFilters | None = None) -> list[str]:
    got, before = [], None
    while True:
        page = parked.list_parked_in_cells(stores, limit=limit, before=before, filters=filters)
        assert page.cells is not None
        got += [f"{parked.label(cell, p.number)} {p.message_id}" for p, cell in zip(page.items, page.cells)]
        if page.cursor is None:
            return got
        before = page.cursor


def test_a_listing_merges_the_cells_newest_first_page_by_page(cells):
    expected = ["a#3 p4", "b#2 p3", "a#2 p2", "b#1 p1", "a#1 p0"]
    for limit in (1, 2, 3, 5, 50):
        assert walk(cells, limit) == expected
    page = parked.list_parked_in_cells(cells, limit=2)
    assert page.cursor == "a#3,b#2"
    assert [item["cell"] for item in parked.to_json(page)["parked"]] == ["a", "b"]
    with pytest.raises(ConfigError, match="no cell 'c'"):
        parked.list_parked_in_cells(cells, limit=2, before="c#3")
    # without cells, the one store's listing and its number cursor
    single = parked.list_parked_in_cells({"": cells["a"]}, limit=2)
    assert (single.cells, [p.number for p in single.items], single.cursor) == (None, [3, 2], 2)


def test_a_parked_message_is_named_with_its_cell(cells):
    assert parked.parse_refs(["a#3", "b#1"], ["a", "b"]) == [("a", 3), ("b", 1)]
    assert parked.parse_refs(["#3", "4"], [""]) == [("", 3), ("", 4)]
    with pytest.raises(ConfigError, match=r"with cells a parked message is CELL#NUMBER.*such as a#17"):
        parked.parse_refs(["3"], ["a", "b"])
    with pytest.raises(ConfigError, match="not the number of a parked message"):
        parked.parse_refs(["a#x"], ["a", "b"])
    p = parked.show_parked_in_cell(cells, ("b", 2))
    assert p is not None and p.message_id == "p3"


def test_a_drop_counts_every_cell_before_dropping_any_and_names_each_with_its_cell(cells):
    with pytest.raises(NeedsConfirmation, match="more than 4 parked messages"):
        # 3 in a and 2 in b: each under the threshold, together over it
        parked.drop_in_cells(cells, filters=ParkedFilters(), confirm_above=4, batch=1)
    assert len(walk(cells, 50)) == 5
    result = parked.drop_in_cells(cells, refs=[("a", 1), ("b", 2), ("b", 9)])
    assert (result.changed, result.labels("sample"), result.labels("not_found")) == (2, ["a#1", "b#2"], ["b#9"])
    with pytest.raises(NotFound, match="b#9"):
        result.check()
    assert parked.to_json(result)["cells"] == {"a": 1, "b": 1}
    assert {cell: store.action_totals()["drop_parked"] for cell, store in cells.items()} == {"a": (1, 1), "b": (1, 1)}
    assert walk(cells, 50) == ["a#3 p4", "a#2 p2", "b#1 p1"]


def test_a_replay_publishes_every_cells_and_deletes_each_in_its_cell(cells):
    kafka = MemoryKafka({OUT: 1, "dlq": 1})
    made = []

    def producer():
        made.append(MemoryProducer(kafka))
        return made[-1]
    dry = parked.replay_in_cells(cells, producer, DESTINATIONS, filters=ParkedFilters(), dry_run=True)
    assert (dry.changed, made) == (5, [])
    result = parked.replay_in_cells(cells, producer, DESTINATIONS, filters=ParkedFilters(), confirm_above=5)
    assert (result.changed, {cell: part.changed for cell, part in result.parts.items()}) == (5, {"a": 3, "b": 2})
    assert sorted(m.value() for part in kafka.partitions[OUT] for m in part) == [f"p{i}".encode() for i in range(5)]
    assert walk(cells, 50) == [] and len(made) == 1
    assert {cell: store.action_totals()["replay_parked"] for cell, store in cells.items()} == {"a": (1, 3), "b": (1, 2)}
