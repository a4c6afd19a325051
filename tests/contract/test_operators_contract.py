"""The operators' store port (`chronos.ports.OperatorsStore`) and `chronos.ops.inspect` and
`chronos.ops.parked` over it: show, list and its filters and cursors, the actions by id and by filter,
what they do to in-flight rows, parked messages (listed, selected, replayed, dropped), recurring
schedules and the action totals. Every test runs against the PostgreSQL
store and against the in-memory twin. (What only PostgreSQL has, the row locks of a racing claim and
the filters' plans on ten million rows, is in tests/integration/test_inspect.py.)"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest

from chronos import codec
from chronos.adapters.kafka.memory import MemoryKafka, MemoryProducer
from chronos.domain.cron import from_us, to_us
from chronos.domain.model import Parked, Row
from chronos.domain.operators import Filters, ParkedFilters
from chronos.errors import (ConfigError, InFlightSkipped, NeedsConfirmation, NotFound, ReplayRefused, StoreUnavailable,
                            UnavailableError)
from chronos.ops import inspect, parked

OUT = "chronos.output"
WEIRD = ["it's", 'say "hi"', "back\\slash", "100%", "%(x)s", "naïve-日本-🚀", "under_score", "a,b", "{x}"]


def r(mid: str, deadline_us: int, **kw) -> Row:
    return Row(mid, deadline_us, kw.get("topic"), kw.get("key", b"k"), kw.get("value", b"v"),
               codec.encode_headers(kw.get("headers", [])), kw.get("ordering_key"), cron=kw.get("cron"),
               timezone=kw.get("timezone"))


def insert(st, rows) -> int:
    return st.apply(rows, [], [])[0]


def ids(page) -> list[str]:
    return [m.id for m in page.items]


def walk(s, f: Filters, limit: int) -> list[str]:
    got, after = [], None
    while True:
        page = inspect.list_messages(s, f, output_topic=OUT, limit=limit, after=after)
        got += ids(page)
        if page.cursor is None:
            return got
        after = page.cursor


def deadline_of(backend, mid: str) -> int | None:
    stored = backend.stored(mid)
    return None if stored is None else stored.deadline_us


# -- show ----------------------------------------------------------------------------------------

def test_show_each_state_and_not_found(s, backend):
    now = backend.now_us()
    t = now + 3_600_000_000
    insert(s, [r("w", t, key=b"\xff\x00", value=b"x" * 100, headers=[("trace", b"abc"), ("bin", b"\x01")],
                 ordering_key="ok"),
               r("f", now - 1000, topic="elsewhere", value=None),
               r("c", t, cron="0 9 * * *", timezone="Europe/Paris")])
    s.claim(10, 0)
    w = s.show("w", output_topic=OUT)
    assert (w.state, w.topic, w.key, w.value_size, w.ordering_key) == ("waiting", OUT, b"\xff\x00", 100, "ok")
    assert w.headers == [("trace", b"abc"), ("bin", b"\x01")] and w.value_preview == b"x" * 64
    assert (w.deadline, w.firer, w.claimed_at, w.cron, w.timezone) == (from_us(t), None, None, None, None)
    assert w.enqueued_at <= from_us(backend.now_us())
    f = s.show("f", output_topic=OUT)
    assert (f.state, f.topic, f.value_size, f.value_preview, f.firer) == ("in_flight", "elsewhere", None, b"", s.node_id)
    assert f.claimed_at is not None
    c = s.show("c", output_topic=OUT)
    assert (c.state, c.cron, c.timezone, c.dst_policy) == ("recurring", "0 9 * * *", "Europe/Paris", None)
    assert s.show("nope", output_topic=OUT) is None
    assert inspect.to_json(None) == {"state": "not_found"}
    assert inspect.to_json(w)["key"] == {"text": None, "hex": "ff00"} and inspect.to_json(w)["value_truncated"]


def test_show_tells_failed_publishes(s, backend):
    insert(s, [r("refused", backend.now_us() - 1000)])
    (claimed,) = s.claim(10, 0)
    assert s.retry_later([(claimed, "publish_failed: topic authorization failed", 60_000)]) == 1
    m = s.show("refused", output_topic=OUT)
    assert (m.state, m.attempts, m.last_error) == ("waiting", 1, "publish_failed: topic authorization failed")
    assert to_us(m.original_deadline) == claimed.deadline_us and m.deadline > m.original_deadline
    j = inspect.to_json(m)
    assert (j["attempts"], j["original_deadline"]) == (1, inspect.iso(m.original_deadline))


def test_weird_ids_work_in_show_list_and_every_action(s, backend):
    t = backend.now_us() + 3_600_000_000
    insert(s, [r(i, t + n) for n, i in enumerate(WEIRD)])
    for i in WEIRD:
        assert s.show(i, output_topic=OUT).id == i
    # a prefix holding LIKE's wildcards matches them literally
    assert ids(inspect.list_messages(s, Filters(id_prefix="100%"), output_topic=OUT)) == ["100%"]
    assert ids(inspect.list_messages(s, Filters(id_prefix="under_"), output_topic=OUT)) == ["under_score"]
    assert ids(inspect.list_messages(s, Filters(id_prefix="%"), output_topic=OUT)) == ["%(x)s"]
    assert ids(inspect.list_messages(s, Filters(id_prefix="naïve-日"), output_topic=OUT)) == ["naïve-日本-🚀"]
    later = from_us(t) + timedelta(days=1)
    assert inspect.act(s, "reschedule", ids=WEIRD[:3], output_topic=OUT, at=later).changed == 3
    assert inspect.act(s, "fire_now", ids=WEIRD[3:6], output_topic=OUT).changed == 3
    assert inspect.act(s, "cancel", ids=WEIRD, output_topic=OUT).changed == len(WEIRD)
    assert inspect.list_messages(s, Filters(), output_topic=OUT).items == []


# -- list ----------------------------------------------------------------------------------------

def test_list_filters_and_keyset_paging(s, backend):
    now = backend.now_us()
    base = now + 60_000_000
    rows = [r(f"m{i:03d}", base + i * 1_000_000, key=b"even" if i % 2 == 0 else b"odd",
              topic="t.other" if i % 5 == 0 else None, ordering_key="o" if i % 7 == 0 else None)
            for i in range(40)]
    insert(s, rows + [r("sched", base + 10_500_000, cron="*/5 * * * *")])
    insert(s, [r("inflight", now - 1000)])
    s.claim(10, 0)
    everything = walk(s, Filters(), 7)
    assert everything == ["inflight"] + [f"m{i:03d}" for i in range(11)] + ["sched"] + \
        [f"m{i:03d}" for i in range(11, 40)]
    assert walk(s, Filters(state="waiting"), 6) == [f"m{i:03d}" for i in range(40)]
    assert walk(s, Filters(state="in_flight"), 6) == ["inflight"]
    assert walk(s, Filters(state="recurring"), 6) == ["sched"]
    assert walk(s, Filters(key=b"odd"), 4) == [f"m{i:03d}" for i in range(1, 40, 2)]
    assert walk(s, Filters(topic="t.other"), 3) == [f"m{i:03d}" for i in range(0, 40, 5)]
    assert len(walk(s, Filters(output_topic=True, state="waiting"), 9)) == 32
    assert walk(s, Filters(ordering_key="o"), 2) == [f"m{i:03d}" for i in range(0, 40, 7)]
    after, before = from_us(base + 9_500_000), from_us(base + 12_500_000)
    assert walk(s, Filters(due_after=after, due_before=before), 2) == ["m010", "sched", "m011", "m012"]
    assert walk(s, Filters(id_prefix="m01"), 3) == [f"m{i:03d}" for i in range(10, 20)]
    assert walk(s, Filters(id_prefix="m00", key=b"even", state="waiting"), 2) == [f"m{i:03d}" for i in range(0, 10, 2)]
    page = inspect.list_messages(s, Filters(id_prefix="infl"), output_topic=OUT)
    (m,) = page.items
    assert (m.state, m.topic, m.firer, m.cron, page.cursor) == ("in_flight", OUT, s.node_id, None, None)


def test_list_refuses_a_foreign_cursor_and_bad_limits(s):
    with pytest.raises(ConfigError, match="cursor"):
        inspect.list_messages(s, Filters(), output_topic=OUT, after="not-a-cursor")
    cursor = inspect.encode_cursor("d", [1, 2])
    with pytest.raises(ConfigError, match="other filters"):
        inspect.list_messages(s, Filters(id_prefix="x"), output_topic=OUT, after=cursor)
    with pytest.raises(ConfigError, match="limit"):
        inspect.list_messages(s, Filters(), output_topic=OUT, limit=0)


# -- actions -------------------------------------------------------------------------------------

def test_actions_by_id_report_unknown_ids_and_count_themselves(s, backend):
    assert s.action_totals() == {}
    t = backend.now_us() + 3_600_000_000
    insert(s, [r(f"a{i}", t) for i in range(5)] + [r("sched", t, cron="0 9 * * *")])
    res = inspect.act(s, "fire_now", ids=["a0", "a1", "ghost"], output_topic=OUT)
    assert (res.changed, res.not_found) == (2, ["ghost"])
    with pytest.raises(NotFound):
        res.check()
    assert deadline_of(backend, "a0") == to_us(res.at) <= backend.now_us()
    later = datetime(2031, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc)
    assert inspect.act(s, "reschedule", ids=["a2", "sched"], output_topic=OUT, at=later).changed == 2
    assert deadline_of(backend, "a2") == to_us(later) == deadline_of(backend, "sched")
    assert inspect.act(s, "cancel", ids=["a3", "sched"], output_topic=OUT).changed == 2
    assert deadline_of(backend, "sched") is None
    assert s.action_totals() == {"cancel": (1, 2), "fire_now": (1, 2), "reschedule": (1, 2)}
    # a dry run changes and counts nothing
    assert inspect.act(s, "cancel", ids=["a4"], output_topic=OUT, dry_run=True).changed == 1
    assert deadline_of(backend, "a4") is not None and s.action_totals()["cancel"] == (1, 2)


def test_fire_now_leaves_a_deadline_already_past_and_an_action_on_nothing_is_counted(s, backend):
    now = backend.now_us()
    insert(s, [r("late", now - 5_000_000)])
    assert inspect.act(s, "fire_now", ids=["late"], output_topic=OUT).changed == 1
    assert deadline_of(backend, "late") == now - 5_000_000
    res = inspect.act(s, "cancel", filters=Filters(id_prefix="nothing-"), output_topic=OUT)
    assert res.changed == 0 and s.action_totals()["cancel"] == (1, 0)


def test_filtered_actions_work_in_batches_and_need_yes_above_the_threshold(s, backend):
    t = backend.now_us() + 3_600_000_000
    insert(s, [r(f"b{i:03d}", t + i, key=b"x") for i in range(25)] + [r("other", t, key=b"y")])
    f = Filters(key=b"x")
    with pytest.raises(NeedsConfirmation):
        inspect.act(s, "cancel", filters=f, output_topic=OUT, confirm_above=10, batch=4)
    assert len(walk(s, f, 100)) == 25, "nothing changed before the refusal"
    dry = inspect.act(s, "cancel", filters=f, output_topic=OUT, dry_run=True, confirm_above=10, batch=4)
    assert dry.changed == 25 and dry.sample == [f"b{i:03d}" for i in range(20)]
    res = inspect.act(s, "cancel", filters=f, output_topic=OUT, confirm_above=10, yes=True, batch=4)
    assert res.changed == 25 and walk(s, Filters(), 100) == ["other"]
    assert s.action_totals()["cancel"] == (1, 25)


def test_a_filtered_reschedule_into_the_walked_range_changes_each_row_once(s, backend):
    t = backend.now_us() + 3_600_000_000
    insert(s, [r(f"c{i:03d}", t + i * 1000) for i in range(30)])
    # the new deadline lies in the middle of the rows walked: moved rows must not come round again
    middle = from_us(t + 15_000 + 500)
    res = inspect.act(s, "reschedule", filters=Filters(state="waiting"), output_topic=OUT, at=middle, batch=4)
    assert res.changed == 30 and s.action_totals()["reschedule"] == (1, 30)
    assert {deadline_of(backend, m) for m in backend.ids()} == {to_us(middle)}
    res = inspect.act(s, "fire_now", filters=Filters(state="waiting"), output_topic=OUT, batch=4)
    assert res.changed == 30 and len(walk(s, Filters(due_before=from_us(backend.now_us() + 1)), 100)) == 30


# -- in-flight rows --------------------------------------------------------------------------------

@pytest.mark.parametrize("action", ["cancel", "fire_now", "reschedule"])
def test_in_flight_rows_are_left_alone_and_still_fire_at_their_claimed_deadline(s, backend, action):
    """A firer claimed the row (within its lookahead) and publishes it from memory at the deadline it
    claimed it with. The action must neither lose it (cancel would delete the row the firer still has to
    publish and acknowledge), nor make it fire early, nor fire it twice."""
    deadline = backend.now_us() + 200_000
    insert(s, [r("held", deadline), r("free", deadline + 3_600_000_000)])
    claimed = s.claim(10, 1000)
    assert [c.id for c in claimed] == ["held"]
    later = from_us(deadline) + timedelta(hours=2)
    by_id = inspect.act(s, action, ids=["held", "free"], output_topic=OUT, at=later)
    assert by_id.in_flight == ["held"] and by_id.changed == 1
    with pytest.raises(InFlightSkipped):
        by_id.check()
    by_filter = inspect.act(s, action, filters=Filters(), output_topic=OUT, at=later)
    assert by_filter.in_flight == ["held"]
    # the row is as claimed: its deadline, and owned by the firer, which deletes it after publishing
    assert s.show("held", output_topic=OUT).deadline == from_us(deadline)
    # a later input message with the same id while it is in flight: ignored (the id is taken)
    assert insert(s, [r("held", deadline + 10_000_000, value=b"second")]) == 0
    assert s.delete_fired(claimed) == 1
    # once it fired, the id is free: the same id schedules anew
    assert insert(s, [r("held", deadline + 10_000_000, value=b"second")]) == 1


def test_after_cancel_a_later_message_with_the_same_id_schedules_anew(s, backend):
    t = backend.now_us() + 3_600_000_000
    insert(s, [r("again", t)])
    assert inspect.act(s, "cancel", ids=["again"], output_topic=OUT).changed == 1
    assert insert(s, [r("again", t + 1, value=b"new")]) == 1
    # after fire-now or reschedule the id is still waiting: a plain message with it is ignored
    assert inspect.act(s, "fire_now", ids=["again"], output_topic=OUT).changed == 1
    assert insert(s, [r("again", t + 2, value=b"third")]) == 0


# -- recurring schedules ---------------------------------------------------------------------------

def test_a_schedules_dst_policy_is_stored_replaced_and_followed(s):
    first = datetime(2026, 10, 25, 0, 30, tzinfo=timezone.utc)   # 02:30 CEST, the first of two 02:30s
    us = to_us(first)
    row = r("twice", us, cron="30 2 * * *", timezone="Europe/Paris")
    row.dst_policy = "repeated=both"
    assert insert(s, [row]) == 1
    assert s.show("twice", output_topic=OUT).dst_policy == "repeated=both"
    claimed = s.claim_schedules(10, 0, us + 1000)
    assert [c.deadline_us for c in claimed] == [us]
    # the second 02:30 (CET) is next, an hour later, not the next day's
    assert s.show("twice", output_topic=OUT).deadline == datetime(2026, 10, 25, 1, 30, tzinfo=timezone.utc)
    row.dst_policy = None
    assert s.apply([], [row], []) == (0, 1, 0, 0)
    assert s.show("twice", output_topic=OUT).dst_policy is None


def test_list_schedules_by_next_occurrence(s, backend):
    t = backend.now_us() + 3_600_000_000
    assert s.list_schedules() == []
    insert(s, [r("later", t + 1000, cron="0 9 * * *", timezone="Europe/Paris", topic="t.x", ordering_key="o"),
               r("sooner", t, cron="*/5 * * * *"), r("plain", t)])
    sooner, later = s.list_schedules()
    assert sooner[:6] == ("sooner", "*/5 * * * *", "UTC", t, None, None)
    assert later[:6] == ("later", "0 9 * * *", "Europe/Paris", t + 1000, "t.x", "o")
    assert later.created_at <= from_us(backend.now_us())


# -- parked messages -------------------------------------------------------------------------------

def test_parked_messages_are_listed_newest_first_a_page_at_a_time(s, backend):
    assert parked.list_parked(s).items == []
    s.park([Parked(f"p{i}", f"chronos.input/0/{i}", "out", None, b"k", b"v" * 100 if i else None,
                   codec.encode_headers([("h", b"\xff")]), "message_too_large: too large") for i in range(3)])
    page = parked.list_parked(s, limit=2)
    assert [p.message_id for p in page.items] == ["p2", "p1"] and page.cursor is not None
    assert (page.items[0].value_size, page.items[0].value_preview, page.items[0].headers) == \
        (100, b"v" * 64, [("h", b"\xff")])
    assert (page.items[0].topic, page.items[0].reason, page.items[0].deadline) == \
        ("out", "message_too_large: too large", None)
    assert page.items[0].parked_at <= from_us(backend.now_us())
    last = parked.list_parked(s, limit=2, before=page.cursor)
    assert [(p.message_id, p.value_size, p.source) for p in last.items] == [("p0", None, "chronos.input/0/0")]
    assert last.cursor is None
    with pytest.raises(ConfigError, match="limit"):
        parked.list_parked(s, limit=0)


def test_a_row_parked_by_a_firer_is_listed_with_its_store_source(s, backend):
    due = backend.now_us() - 1000
    insert(s, [r("big", due, topic="t.x")])
    (claimed,) = s.claim(10, 0)
    assert s.park_claimed([(claimed, "message_too_large: too large")], OUT) == 1
    (p,) = parked.list_parked(s).items
    assert (p.message_id, p.source, p.topic, p.deadline) == ("big", "store/big", "t.x", from_us(due))


def park(s, *messages: Parked) -> None:
    s.park(list(messages))


def pm(mid: str | None, topic: str = OUT, *, value: bytes | None = b"v", key: bytes | None = b"k",
       headers: list | None = None, reason: str = "too_large: MSG_SIZE_TOO_LARGE: too large") -> Parked:
    return Parked(mid, f"store/{mid}", topic, None, key, value, codec.encode_headers(headers or []), reason)


def test_parked_messages_are_filtered_found_walked_and_shown(s, backend):
    park(s, pm("a-1", "t.x"), pm("a-2", reason="publish_failed: TOPIC_AUTHORIZATION_FAILED: denied"),
         pm(None, "dlq", reason="missing_id: no chronosMessageId; dead-letter topic: MSG_SIZE_TOO_LARGE: too large"),
         pm("b-1", "t.x", value=None, key=None))
    numbers = [p.number for p in reversed(parked.list_parked(s).items)]
    assert numbers == sorted(numbers)

    def listed(**f) -> list:
        return [p.message_id for p in parked.list_parked(s, filters=ParkedFilters(**f)).items]
    assert listed(topic="t.x") == ["b-1", "a-1"]
    assert listed(reason="too_large") == ["b-1", "a-1"]
    assert listed(reason="missing_id") == [None] and listed(reason="too") == []
    assert listed(id_prefix="a-") == ["a-2", "a-1"]
    now = from_us(backend.now_us())
    assert listed(parked_before=now + timedelta(seconds=1)) == ["b-1", None, "a-2", "a-1"]
    assert listed(parked_after=now + timedelta(seconds=1)) == []
    assert listed(parked_after=now - timedelta(hours=1), topic="t.x", id_prefix="b") == ["b-1"]
    # an action's walk: oldest first, after a cursor, with the filters
    walked = s.walk_parked(ParkedFilters(), limit=3)
    assert [r.number for r in walked] == numbers[:3]
    assert [r.number for r in s.walk_parked(ParkedFilters(), limit=3, after=walked[-1].number)] == numbers[3:]
    assert [r.number for r in s.walk_parked(ParkedFilters(topic="t.x"), limit=10)] == [numbers[0], numbers[3]]
    header_bytes = len(codec.encode_headers([]))
    assert s.walk_parked(ParkedFilters(topic="t.x"), limit=1)[0] == (numbers[0], "t.x", 1 + 1 + header_bytes)
    assert s.find_parked([numbers[3], 999_999, numbers[1]]) == [(numbers[1], OUT, 2 + header_bytes),
                                                                (numbers[3], "t.x", header_bytes)]
    shown = s.show_parked(numbers[3])
    assert (shown.message_id, shown.key, shown.value_size, shown.value_preview, shown.topic) == ("b-1", None, None, b"", "t.x")
    assert s.show_parked(999_999) is None
    j = parked.to_json(parked.list_parked(s, limit=1))
    assert j["parked"][0]["number"] == numbers[3] and j["next"] == numbers[3]


def test_a_parked_message_is_loaded_whole_byte_for_byte(s):
    headers = [("trace", b"\x00\xff"), ("trace", None), ("chronosMessageId", b"big")]
    park(s, pm("big", value=b"x" * 200_000, key=b"\xfe", headers=headers), pm("tomb", value=None, key=None))
    big, tomb = (p.number for p in reversed(parked.list_parked(s).items))
    (loaded_tomb, loaded_big) = s.load_parked([tomb, 999_999, big])[::-1]
    assert loaded_big == (big, "big", OUT, b"\xfe", b"x" * 200_000, codec.encode_headers(headers))
    assert codec.decode_headers(loaded_big.headers) == headers
    assert (loaded_tomb.key, loaded_tomb.value) == (None, None)


def test_settling_a_replay_deletes_the_acknowledged_keeps_the_refused_with_their_reason_and_counts_it(s):
    park(s, pm("ok"), pm("refused"), pm("untouched"))
    ok, refused, untouched = (p.number for p in reversed(parked.list_parked(s).items))
    assert s.settle_replayed([ok, 999_999], [(refused, "too_large: again (replay to out)")], counted=True) == 1
    assert s.settle_replayed([], [], counted=False) == 0
    left = {p.number: p.reason for p in parked.list_parked(s).items}
    assert left == {refused: "too_large: again (replay to out)", untouched: "too_large: MSG_SIZE_TOO_LARGE: too large"}
    assert s.action_totals()["replay_parked"] == (1, 1)


def test_dropping_parked_messages_deletes_them_and_counts_it(s):
    park(s, pm("a"), pm("b"))
    a, b = (p.number for p in reversed(parked.list_parked(s).items))
    assert s.drop_parked([a, 999_999], counted=True) == [a]
    assert s.drop_parked([], counted=True) == []
    assert [p.number for p in parked.list_parked(s).items] == [b]
    assert s.action_totals()["drop_parked"] == (2, 1)


# -- replaying and dropping parked messages (chronos.ops.parked), Kafka being the in-memory twin ----

DESTINATIONS = parked.Destinations(OUT, "dlq", re.compile(r"t\..*"))


def kafka(*topics: str) -> MemoryKafka:
    return MemoryKafka({t: 2 for t in (OUT, "dlq", *topics)})


def on(k: MemoryKafka, topic: str) -> list:
    return [(m.key(), m.value(), m.headers()) for part in k.partitions[topic] for m in part]


def test_replay_publishes_byte_for_byte_in_the_order_parked_then_deletes_and_counts(s):
    headers = [("trace", b"\x00\xff"), ("trace", None)]
    park(s, pm("one", headers=headers, key=b"same"), pm("two", "t.x", key=b"same"), pm("three", key=b"same", value=None))
    k = kafka("t.x", "t.y")
    made = []

    def producer():
        made.append(MemoryProducer(k))
        return made[-1]
    one, two, three = (p.number for p in reversed(parked.list_parked(s).items))
    result = parked.replay(s, producer, DESTINATIONS, numbers=[three, one])
    assert (result.changed, result.sample, result.refused, result.not_found) == (2, [one, three], [], [])
    assert on(k, OUT) == [(b"same", b"v", headers), (b"same", None, None)]
    # each to its own topic, or all to one given
    result = parked.replay(s, producer, DESTINATIONS, filters=ParkedFilters(), to="t.y")
    assert (result.changed, result.to) == (1, "t.y") and on(k, "t.y") == [(b"same", b"v", None)]
    assert parked.list_parked(s).items == [] and len(made) == 2
    assert s.action_totals()["replay_parked"] == (2, 3)
    assert parked.to_json(result) == {"action": "replay", "dry_run": False, "to": "t.y", "changed": 1, "sample": [two],
                                      "not_found": [], "not_allowed": [], "refused": [], "unanswered": []}


def test_replay_checks_the_allow_list_and_leaves_what_kafka_refuses_parked_with_the_new_reason(s):
    park(s, pm("elsewhere", "other.topic"), pm("huge", value=b"x" * 1_000_001), pm("fine"), pm("gone", "t.gone"))
    elsewhere, huge, fine, gone = (p.number for p in reversed(parked.list_parked(s).items))
    k = kafka()
    with pytest.raises(ConfigError, match="--to 'other.topic' is neither the output topic"):
        parked.replay(s, lambda: MemoryProducer(k), DESTINATIONS, numbers=[fine], to="other.topic")
    result = parked.replay(s, lambda: MemoryProducer(k), DESTINATIONS, filters=ParkedFilters())
    assert (result.changed, result.not_allowed) == (1, [elsewhere])
    assert [n for n, _ in result.refused] == [huge, gone]
    reasons = {p.number: p.reason for p in parked.list_parked(s).items}
    assert reasons[huge].startswith("too_large: MSG_SIZE_TOO_LARGE:") and reasons[huge].endswith(f"(replay to {OUT})")
    assert reasons[gone].startswith("publish_failed: _UNKNOWN_TOPIC:") and reasons[gone].endswith("(replay to t.gone)")
    assert reasons[elsewhere] == "too_large: MSG_SIZE_TOO_LARGE: too large" and fine not in reasons
    with pytest.raises(ReplayRefused, match="3 stay parked: Kafka refused 2 .* and CHRONOS_ALLOWED_TOPICS does not "
                                            "allow the topic of 1"):
        result.check()
    # the dead-letter topic is always a destination
    assert parked.replay(s, lambda: MemoryProducer(k), DESTINATIONS, numbers=[elsewhere], to="dlq").changed == 1


def test_a_replay_kafka_does_not_answer_leaves_the_rows_as_they_were_and_stops(s):
    park(s, pm("a"), pm("b"))
    k = kafka()
    k.answering = False
    result = parked.replay(s, lambda: MemoryProducer(k), DESTINATIONS, filters=ParkedFilters(), hold_bytes=1, timeout=0)
    assert (result.changed, len(result.unanswered), result.refused) == (0, 1, [])   # stopped after the first
    assert {p.reason for p in parked.list_parked(s).items} == {"too_large: MSG_SIZE_TOO_LARGE: too large"}
    with pytest.raises(UnavailableError, match="did not acknowledge 1 replays in time"):
        result.check()


def test_a_replay_that_dies_between_the_publish_and_the_delete_publishes_again(s, backend):
    park(s, pm("once"))
    k = kafka()

    class DiesAtTheDelete:
        def __getattr__(self, name):
            return getattr(s, name)

        def settle_replayed(self, *args, **kw):
            raise StoreUnavailable("PostgreSQL went away")
    with pytest.raises(StoreUnavailable):
        parked.replay(DiesAtTheDelete(), lambda: MemoryProducer(k), DESTINATIONS, filters=ParkedFilters())
    assert len(parked.list_parked(s).items) == 1 and len(on(k, OUT)) == 1   # published, still parked
    assert parked.replay(s, lambda: MemoryProducer(k), DESTINATIONS, filters=ParkedFilters()).changed == 1
    assert parked.list_parked(s).items == [] and len(on(k, OUT)) == 2       # at least once


def test_parked_actions_need_confirming_above_the_threshold_and_report_unknown_numbers(s):
    park(s, *(pm(f"m{i}") for i in range(5)))
    numbers = sorted(p.number for p in parked.list_parked(s).items)
    k = kafka()
    for act in (lambda **kw: parked.drop(s, **kw), lambda **kw: parked.replay(s, lambda: MemoryProducer(k),
                                                                              DESTINATIONS, **kw)):
        with pytest.raises(NeedsConfirmation, match="more than 3 parked messages"):
            act(filters=ParkedFilters(), confirm_above=3, batch=2)
        dry = act(filters=ParkedFilters(), dry_run=True, batch=2)
        assert (dry.changed, dry.sample) == (5, numbers)
        with pytest.raises(ConfigError, match="not both"):
            act(numbers=[numbers[0]], filters=ParkedFilters())
    assert len(parked.list_parked(s).items) == 5 and on(k, OUT) == []
    result = parked.drop(s, numbers=[numbers[0], 999_999])
    assert (result.changed, result.not_found) == (1, [999_999])
    with pytest.raises(NotFound, match="#999999"):
        result.check()
    assert parked.drop(s, filters=ParkedFilters(), confirm_above=3, yes=True, batch=2).changed == 4
    assert s.action_totals()["drop_parked"] == (2, 5)
