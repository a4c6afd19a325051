"""How long ago the oldest message a consumer has not read arrived on a partition (chronos.telemetry.lag),
from samples of its position and the partition's end, with time as an argument."""

from __future__ import annotations

import pytest

from chronos.telemetry.lag import MAX_MARKS, PartitionLag


def test_nothing_unread_is_0_whatever_the_time():
    lag = PartitionLag()
    lag.sample(0.0, 10, 10)
    assert lag.seconds(1000.0) == 0.0
    lag.sample(5.0, -1, -1)  # not fetched yet: nothing known, nothing counted
    assert lag.seconds(1000.0) == 0.0


def test_the_oldest_unread_message_arrived_between_the_last_end_short_of_it_and_the_first_past_it():
    lag = PartitionLag()
    lag.sample(0.0, 100, 100)
    lag.sample(5.0, 100, 200)   # 100 messages came in these 5 s: offset 100, the first, at 0.05 s
    assert lag.seconds(5.0) == pytest.approx(4.95)
    lag.sample(10.0, 150, 300)  # offset 150 came half-way between 0 and 5 s
    assert lag.seconds(10.0) == pytest.approx(10.0 - 2.55)
    lag.sample(15.0, 250, 300)  # between 5 and 10 s
    assert lag.seconds(15.0) == pytest.approx(15.0 - 7.55)
    assert len(lag.marks) == 2  # the ends the position passed are dropped, one kept below it


def test_a_consumer_behind_since_its_first_sample_is_at_least_that_long_behind():
    lag = PartitionLag()
    lag.sample(0.0, 0, 1000)
    assert lag.seconds(0.0) == 0.0
    assert lag.seconds(30.0) == 30.0
    lag.sample(30.0, 10, 1000)  # it reads, slowly: the message at its position was there at the first sample
    assert lag.seconds(31.0) == 31.0


def test_a_partition_made_again_starts_its_marks_again():
    lag = PartitionLag()
    lag.sample(0.0, 500, 500)
    lag.sample(5.0, 0, 10)  # its end went back: the topic was deleted and made again
    assert list(lag.marks) == [(5.0, 10)]
    assert lag.seconds(6.0) == 1.0


def test_an_hour_and_more_behind_keeps_a_bounded_number_of_marks_and_the_ones_at_the_position():
    lag = PartitionLag()
    lag.sample(0.0, 0, 0)
    for i in range(1, 3 * MAX_MARKS):
        lag.sample(i * 5.0, 0, i)
    assert len(lag.marks) == MAX_MARKS
    assert lag.marks[0] == (0.0, 0) and lag.marks[1] == (5.0, 1)
    assert lag.seconds(3 * MAX_MARKS * 5.0) == pytest.approx(3 * MAX_MARKS * 5.0 - 5.0)
