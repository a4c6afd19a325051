"""Which cells the consumers of a group reach, as each says in a cell (`IntakeStore.note_reach`), the same on
PostgreSQL and on the in-memory twin: a consumer reads how long ago the others of its group said they reached
each cell, a reach is never moved back, and a word not renewed for a day is dropped."""

from __future__ import annotations

import uuid

import pytest


def ages(said: dict[str, int] | None) -> dict[str, float]:
    """Milliseconds in whole seconds: PostgreSQL's clock moves between two statements, the twin's does not."""
    assert said is not None
    return {cell: round(ms / 1000.0) for cell, ms in said.items()}


def test_a_consumer_reads_how_long_ago_the_others_of_its_group_said_they_reached_each_cell(backend):
    one, two, elsewhere = (backend.store(uuid.uuid4()) for _ in range(3))
    assert one.note_reach("chronos", {"a": 0, "b": 0}) == {}
    assert elsewhere.note_reach("another group", {"b": 0, "c": 0}) == {}
    assert ages(two.note_reach("chronos", {"a": 0, "b": 30_000})) == {"a": 0, "b": 0}
    assert ages(one.note_reach("chronos", {})) == {"a": 0, "b": 30}  # the latest of the others: two's
    # a word of an older reach does not move the reach said before back; time passes for every word
    two.note_reach("chronos", {"a": 90_000})
    backend.age_reach(10)
    assert ages(one.note_reach("chronos", {"c": 0})) == {"a": 10, "b": 40}
    assert ages(two.note_reach("chronos", {})) == {"a": 10, "b": 10, "c": 0}
    assert ages(elsewhere.note_reach("another group", {})) == {}


@pytest.mark.parametrize("days", [0.5, 1.01])
def test_a_word_not_renewed_for_a_day_is_dropped_when_another_consumer_speaks(backend, days):
    gone, here = backend.store(uuid.uuid4()), backend.store(uuid.uuid4())
    gone.note_reach("chronos", {"a": 0})
    backend.age_reach(days * 86_400)
    kept = days < 1
    assert ages(here.note_reach("chronos", {"b": 0})) == ({"a": 43_200} if kept else {})
    assert ages(backend.store(uuid.uuid4()).note_reach("chronos", {})) == ({"a": 43_200, "b": 0} if kept else {"b": 0})
