"""Where each process serves /metrics, said in the store (`ports.Presence`) and read by the operators'
side (`OperatorsStore.announced`), the same on PostgreSQL and on the in-memory twin."""

from __future__ import annotations

import uuid

WITHIN_MS = 90_000


def test_each_process_is_listed_at_the_address_it_gave_until_it_withdraws_or_goes_quiet(backend):
    consumer, firer, ops = backend.store(uuid.uuid4()), backend.store(uuid.uuid4()), backend.store()
    assert ops.announced(WITHIN_MS) == []
    assert consumer.announce("consumer", "http", 9400, "10.0.0.11") == "http://10.0.0.11:9400/metrics"
    assert firer.announce("firer", "https", 9500, "fd00::12") == "https://[fd00::12]:9500/metrics"
    listed = ops.announced(WITHIN_MS)
    assert [(a.role, a.node, a.url) for a in listed] == [
        ("consumer", str(consumer.node_id), "http://10.0.0.11:9400/metrics"),
        ("firer", str(firer.node_id), "https://[fd00::12]:9500/metrics")]
    assert all(0 <= a.seen_s < 5 for a in listed)
    backend.age_announcements(60)
    firer.announce("firer", "https", 9500, "fd00::12")  # said again: listed as just said
    assert [a.role for a in ops.announced(WITHIN_MS)] == ["consumer", "firer"]
    backend.age_announcements(60)  # the consumer quiet for two minutes: not listed
    assert [a.role for a in ops.announced(WITHIN_MS)] == ["firer"]
    firer.withdraw()
    firer.withdraw()  # twice is no error
    assert ops.announced(WITHIN_MS) == []


def test_a_process_that_gives_no_address_is_listed_at_its_hosts_address_toward_the_database(backend):
    detector = backend.store(uuid.uuid4())
    url = detector.announce("detector", "http", 9600, None)
    assert url == "http://127.0.0.1:9600/metrics"  # this test's database is on this host, over TCP to 127.0.0.1
    assert [a.url for a in backend.store().announced(WITHIN_MS)] == [url]


def test_a_word_not_renewed_for_a_day_is_dropped_when_another_process_speaks(backend):
    gone, here = backend.store(uuid.uuid4()), backend.store(uuid.uuid4())
    gone.announce("consumer", "http", 9400, "10.0.0.11")
    backend.age_announcements(86_400 + 60)
    here.announce("consumer", "http", 9400, "10.0.0.12")
    assert [a.url for a in backend.store().announced(10 * 86_400_000)] == ["http://10.0.0.12:9400/metrics"]


def test_the_gauge_reader_is_the_first_by_node_of_the_detectors_said_lately(backend):
    """`DetectStore.gauge_reader`: the one detector of a database that reads the store gauges."""
    high, low = backend.store(uuid.UUID(int=2 ** 127 + 5)), backend.store(uuid.UUID(int=2 ** 127 + 3))
    ops = backend.store()
    assert ops.gauge_reader(WITHIN_MS) is None  # no detector said where it serves
    backend.store(uuid.UUID(int=1)).announce("firer", "http", 9500, None)  # not a detector
    high.announce("detector", "http", 9600, None)
    assert ops.gauge_reader(WITHIN_MS) == high.node_id
    low.announce("detector", "http", 9600, None)
    assert ops.gauge_reader(WITHIN_MS) == low.node_id  # first by node, as PostgreSQL orders a uuid
    backend.age_announcements(60)
    high.announce("detector", "http", 9600, None)
    backend.age_announcements(60)  # the low one has said nothing for two minutes
    assert ops.gauge_reader(WITHIN_MS) == high.node_id
    high.withdraw()
    assert ops.gauge_reader(WITHIN_MS) is None
