"""How the fleet's partition scenarios sort a message delivered before a heal and again after it: a
publish the cut held back, a publish whose acknowledgement the cut lost (fired again by the row's
holder), or a host that published a row it no longer held (the one the partition tests forbid); and when
the firers published again after a heal."""

from __future__ import annotations

from types import SimpleNamespace

from kits.fleet.scenarios import FleetScenario

FAULT, HEAL, HOLD = 100.0, 114.0, 5.0


def landed(*deliveries: tuple[float, float], sent: float = 95.0) -> tuple[list[str], ...]:
    """One message, sent at `sent`, delivered as (arrival, CreateTime) pairs, in arrival order."""
    scenario = FleetScenario.__new__(FleetScenario)
    scenario.hold_s = HOLD
    scenario.load = SimpleNamespace(sent={"m": SimpleNamespace(produced=sent)})
    scenario.reader = SimpleNamespace(arrivals={"m": [a for a, _ in deliveries]},
                                      create_times={"m": [c for _, c in deliveries]})
    return scenario.landed_after(HEAL, FAULT)


def test_a_copy_sent_while_held_that_landed_after_the_heal_is_in_flight():
    assert landed((99.0, 98.9), (114.5, 102.0)) == (["m"], [], [], [])


def test_a_publish_whose_acknowledgement_the_cut_lost_fires_again_after_the_heal():
    assert landed((99.8, 99.7), (115.0, 114.8)) == ([], ["m"], [], [])


def test_a_copy_produced_after_the_hold_of_a_row_published_long_before_the_cut_is_republished():
    assert landed((90.0, 89.9), (115.0, 114.8)) == ([], [], [], ["m"])


def test_a_row_another_host_fired_during_the_cut_and_the_cut_off_host_again_after_it_is_republished():
    assert landed((99.8, 99.7), (106.0, 105.9), (115.0, 114.8)) == ([], [], [], ["m"])


def test_a_message_sent_during_the_cut_fired_again_after_the_heal_is_a_read_again_not_a_host_s_republish():
    """Sent while the host was cut off, it never reached that host; its copy after the heal is the consumer
    group reading it again when the host rejoined (the report's rebalances explain the duplicate)."""
    assert landed((106.0, 105.9), (115.0, 114.8), sent=105.0) == ([], [], ["m"], [])


def test_a_message_not_delivered_on_both_sides_of_the_heal_is_in_no_list():
    assert landed((99.8, 99.7)) == ([], [], [], [])
    assert landed((115.0, 114.8), (116.0, 115.9)) == ([], [], [], [])


def published_again(*create_times: float) -> float | None:
    scenario = FleetScenario.__new__(FleetScenario)
    scenario.reader = SimpleNamespace(create_times={"m": list(create_times), "n": [90.0]})
    return scenario.published_again(HEAL)


def test_publishing_resumes_at_the_first_copy_produced_after_the_heal_whenever_the_reader_got_it():
    """The reader's own reconnect after the heal delays its arrivals, not the firers' CreateTime."""
    assert published_again(99.0, 114.25, 120.0) == 0.25
    assert published_again(99.0, 113.9) is None  # produced before the heal (an acknowledgement the cut held back)
