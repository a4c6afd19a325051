"""The operators' queries and actions over several cells (chronos.ops.inspect, chronos.ops.status), on in-memory
cells: a listing merged in deadline order with the cell of each message and a cursor that holds every cell's
place, show finding the cell that holds an id, the actions in every cell with one confirmation and each id's
cell said, and the status's totals and cells."""

from __future__ import annotations

import pytest

from chronos import codec
from chronos.adapters.memory import ManualClock, MemoryDatabase, MemoryStore
from chronos.domain.cells import CellMap, CellPartition
from chronos.domain.model import Row
from chronos.domain.operators import Filters
from chronos.errors import ConfigError, NeedsConfirmation
from chronos.ops import inspect
from chronos.ops.status import cells_dict, render_cells, to_dict

OUT = "chronos.output"
HOUR = 3_600_000_000


@pytest.fixture
def cells():
    clock = ManualClock()
    stores = {"a": MemoryStore(MemoryDatabase(clock)), "b": MemoryStore(MemoryDatabase(clock))}
    # interleaved deadlines: a holds the even seconds, b the odd ones
    for i in range(10):
        cell = "a" if i % 2 == 0 else "b"
        stores[cell].apply([Row(f"m{i}", clock() + HOUR + i * 1_000_000, None, b"k", b"v", codec.encode_headers([]))],
                           [], [])
    return stores


def walk(stores, f: Filters, limit: int) -> list[tuple[str, str]]:
    got, after = [], None
    while True:
        page = inspect.list_in_cells(stores, f, output_topic=OUT, limit=limit, after=after)
        assert page.cells is not None
        got += [(m.id, cell) for m, cell in zip(page.items, page.cells)]
        if page.cursor is None:
            return got
        after = page.cursor


def test_a_listing_merges_the_cells_in_deadline_order_page_by_page(cells):
    expected = [(f"m{i}", "a" if i % 2 == 0 else "b") for i in range(10)]
    for limit in (1, 3, 4, 10, 50):
        assert walk(cells, Filters(), limit) == expected
    assert walk(cells, Filters(id_prefix="m"), 3) == expected  # id order
    page = inspect.list_in_cells(cells, Filters(), output_topic=OUT, limit=2)
    assert inspect.to_json(page)["messages"][1]["cell"] == "b"
    with pytest.raises(ConfigError, match="other filters"):
        inspect.list_in_cells(cells, Filters(id_prefix="m"), output_topic=OUT, limit=2, after=page.cursor)
    with pytest.raises(ConfigError, match="not a cursor printed by `chronos list` over these cells"):
        inspect.list_in_cells({"a": cells["a"]}, Filters(), output_topic=OUT, limit=2, after=page.cursor)
    # without cells, the one store's listing as it always was
    single = inspect.list_in_cells({"": cells["a"]}, Filters(), output_topic=OUT, limit=2)
    assert single.cells is None and [m.id for m in single.items] == ["m0", "m2"]


def test_show_finds_the_cell_that_holds_an_id(cells):
    assert [(cell, m.id) for cell, m in inspect.show_in_cells(cells, "m3", output_topic=OUT)] == [("b", "m3")]
    assert inspect.show_in_cells(cells, "nowhere", output_topic=OUT) == []


def test_an_action_acts_in_every_cell_and_says_where_each_id_was(cells):
    result = inspect.act_in_cells(cells, "cancel", ids=["m1", "m2", "gone"], output_topic=OUT)
    assert (result.changed, result.not_found, result.cells) == (2, ["gone"], {"a": 1, "b": 1})
    assert result.where == {"m2": "a", "m1": "b"}
    assert inspect.to_json(result)["where"] == {"m2": "a", "m1": "b"}
    # each cell counts the action taken there
    assert {cell: store.action_totals()["cancel"] for cell, store in cells.items()} == {"a": (1, 1), "b": (1, 1)}
    # an id held by one cell only is found
    assert inspect.act_in_cells(cells, "fire_now", ids=["m3"], output_topic=OUT).cells == {"a": 0, "b": 1}


def test_the_confirmation_counts_every_cell_before_changing_any(cells):
    with pytest.raises(NeedsConfirmation):
        # 4 in a and 4 in b: each under the threshold of 5, together over it
        inspect.act_in_cells(cells, "cancel", filters=Filters(), output_topic=OUT, confirm_above=5)
    assert walk(cells, Filters(), 50) == [(f"m{i}", "a" if i % 2 == 0 else "b") for i in range(10)]
    done = inspect.act_in_cells(cells, "cancel", filters=Filters(), output_topic=OUT, confirm_above=5, yes=True)
    assert done.cells == {"a": 5, "b": 5}


def test_the_status_of_cells_totals_them_and_shows_each(cells):
    def view(store):
        return to_dict(store.overview(5000), 5000)
    cell_map = CellMap.build({"a": [CellPartition(0, 1), CellPartition(1, 1)], "b": [CellPartition(2, 1)]})
    d = cells_dict({cell: view(store) for cell, store in cells.items()}, cell_map, None)
    assert (d["waiting"], [c["waiting"] for c in d["cells"]]) == (10, [5, 5])
    assert [c["input_partitions"] for c in d["cells"]] == [[0, 1], [2]]
    assert d["next_deadline"] == d["cells"][0]["next_deadline"]  # m0, in a
    text = render_cells(d)
    assert "waiting                         10   a 5, b 5" in text
    assert "cell a: input partitions 0-1" in text and "cell b: input partitions 2" in text


def test_the_schedules_of_every_cell_by_next_occurrence_each_with_its_cell(cells):
    clock = cells["a"].db.now_us
    for cell, sid, offset in (("b", "tick-b", 1), ("a", "tick-a", 2), ("b", "tick-late", 3)):
        cells[cell].apply([Row(sid, clock() + offset * 60_000_000, None, None, b"v", codec.encode_headers([]),
                               cron="* * * * *")], [], [])
    assert [(cell, s.id) for cell, s in inspect.schedules_in_cells(cells)] == [
        ("b", "tick-b"), ("a", "tick-a"), ("b", "tick-late")]
    assert [(cell, s.id) for cell, s in inspect.schedules_in_cells({"": cells["a"]})] == [("", "tick-a")]


def test_a_search_by_key_names_the_cells_that_read_it_without_an_index(cells, monkeypatch):
    stores = cells
    assert inspect.without_key_search(stores, Filters(key=b"k")) == []  # the in-memory twin needs no index
    monkeypatch.setattr(type(stores["a"]), "key_search", lambda self: self is not stores["a"])
    assert inspect.without_key_search(stores, Filters(key=b"k")) == ["a"]
    assert inspect.without_key_search(stores, Filters(topic="t")) == [] and inspect.without_key_search(stores, None) == []
    assert inspect.key_search_note(["a"]).startswith("cell a has no key-search index: this search reads the rows")
    assert inspect.key_search_note(["a", "b"]).startswith("cells a, b have no key-search index")
    assert inspect.key_search_note([""]).startswith("the database has no key-search index")
    assert inspect.key_search_note([]) is None
