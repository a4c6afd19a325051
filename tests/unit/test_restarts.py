"""How long a program under supervisord waits after crashes in a row (chronos.runtime.process.crash_wait)."""

from __future__ import annotations

import pytest

from chronos.runtime.process import CRASH_WAIT_CAP_S, STABLE_RUN_S, crash_wait

NOW = 1_800_000_000.0


def test_a_first_start_or_a_clean_end_waits_for_nothing():
    assert crash_wait(None, NOW) == (0, 0.0)
    assert crash_wait({"started": NOW - 1, "crashes": 5, "clean": True}, NOW) == (0, 0.0)


def test_the_first_crash_restarts_at_once():
    assert crash_wait({"started": NOW - 1, "crashes": 0, "clean": False}, NOW) == (1, 0.0)


@pytest.mark.parametrize("before,expected", [(1, (2, 1.0)), (2, (3, 2.0)), (3, (4, 4.0)), (6, (7, 32.0)),
                                             (7, (8, CRASH_WAIT_CAP_S)), (40, (41, CRASH_WAIT_CAP_S))])
def test_each_crash_in_a_row_doubles_the_wait_up_to_the_cap(before, expected):
    assert crash_wait({"started": NOW - 2, "crashes": before, "clean": False}, NOW) == expected


def test_a_long_run_ends_the_series():
    assert crash_wait({"started": NOW - STABLE_RUN_S, "crashes": 9, "clean": False}, NOW) == (1, 0.0)


def test_a_crash_while_waiting_counts():
    # the record's start is when the work was to begin, after the wait: still ahead of `now`
    assert crash_wait({"started": NOW + 3, "crashes": 3, "clean": False}, NOW) == (4, 4.0)
