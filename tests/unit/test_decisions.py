"""Pure decisions with `now` passed in: intake verdicts, consumer batch sorting, publish timing, where a claim starts."""

from __future__ import annotations

import re
import uuid

import pytest

from chronos import codec
from chronos.roles.consumer import commit_offsets, sort_batch
from chronos.roles.detector import suspected_nodes
from chronos.domain.model import Mark
from chronos.roles.firer.decisions import TICK, ClaimCursor, PublishTiming
from chronos.domain.intake import Rules, Verdict, decide
from chronos.commands.send import parse_duration
from chronos.config import ConfigError
from kafka_double import FakeMessage

NOW = 1_800_000_000_000_000
RULES = Rules(timing_advance_us=50_000, output_topic="out", allowed_topics=re.compile("out|billing\\..*"))


def parsed(deadline_us=NOW + 10_000_000, **kw):
    base = dict(error=None, message_id="m", deadline_us=deadline_us, topic=None, ordering_key=None,
                action=None, cron=None, timezone=None, headers=[])
    base.update(kw)
    return codec.Parsed(**base)


@pytest.mark.parametrize("deadline,verdict", [
    (NOW + 10_000_000, Verdict.ENQUEUE),
    (NOW + 50_001, Verdict.ENQUEUE),
    (NOW + 50_000, Verdict.LATE),       # within the timing advance
    (NOW, Verdict.LATE),
    (NOW - 3_600_000_000, Verdict.LATE),  # no lateness limit by default
])
def test_late_or_enqueue(deadline, verdict):
    assert decide(parsed(deadline), NOW, RULES).verdict is verdict


def test_invalid_keeps_the_reason():
    d = decide(parsed(error="bad_deadline: x"), NOW, RULES)
    assert d.verdict is Verdict.INVALID and d.reason == "bad_deadline: x"


def test_destination_topic_must_be_allowed():
    assert decide(parsed(topic="billing.eu"), NOW, RULES).verdict is Verdict.ENQUEUE
    d = decide(parsed(topic="payments"), NOW, RULES)
    assert d.verdict is Verdict.INVALID and d.reason.startswith("topic_not_allowed")


def test_max_lateness():
    rules = Rules(50_000, "out", re.compile("out"), max_lateness_us=1_000_000)
    assert decide(parsed(NOW - 900_000), NOW, rules).verdict is Verdict.LATE
    d = decide(parsed(NOW - 1_100_000), NOW, rules)
    assert d.verdict is Verdict.INVALID and d.reason.startswith("too_late")




def hdrs(mid, deadline_ms, *extra):
    return [("chronosMessageId", mid.encode()), ("chronosDeadline", str(deadline_ms).encode()), *extra]


def test_sort_batch_splits_invalid_late_and_enqueue():
    now_ms = NOW // 1000
    msgs = [FakeMessage(hdrs("a", now_ms + 60_000, ("x", b"1"), ("x", None))),
            FakeMessage(hdrs("b", now_ms - 10)),
            FakeMessage([("chronosDeadline", b"123")]),
            FakeMessage(hdrs("a", now_ms + 90_000)),      # same id in the batch: first wins
            FakeMessage(hdrs("c", now_ms + 60_000), key=None, value=None)]
    batch = sort_batch(msgs, NOW, RULES)
    assert list(batch.rows) == ["a", "c"]
    assert batch.rows["a"].deadline_us == (now_ms + 60_000) * 1000
    assert codec.decode_headers(batch.rows["a"].headers) == [("x", b"1"), ("x", None)]
    assert (batch.rows["c"].key, batch.rows["c"].value) == (None, None)
    assert [p.message_id for _, p in batch.late] == ["b"]
    assert [r.split(":")[0] for _, r, _ in batch.dead] == ["missing_id"]
    assert batch.duplicates == 1


def test_commit_offsets_take_the_next_offset_per_partition():
    msgs = [FakeMessage([], offset=5, partition=0), FakeMessage([], offset=9, partition=0),
            FakeMessage([], offset=2, partition=1)]
    assert commit_offsets(msgs) == {("in", 0): 10, ("in", 1): 3}


def test_publish_timing_never_advances_more_than_the_timing_advance():
    t = PublishTiming(timing_advance_ms=50)
    for _ in range(200):
        t.observe_ack(0.5)
    assert t.advance == pytest.approx(0.05)
    t2 = PublishTiming(timing_advance_ms=50)
    for _ in range(200):
        t2.observe_ack(0.004)
    assert t2.advance == pytest.approx(0.004 + TICK, rel=0.05)  # the acknowledgement time, plus one loop tick


def test_publish_timing_follows_the_database_clock():
    t = PublishTiming(timing_advance_ms=50)
    t.observe_clock(db_us=1_000_002_000_000, before=1_000_000.0, after=1_000_000.002)
    assert t.offset_us == pytest.approx(1_998_000, abs=2)
    assert t.local_deadline(1_000_010_000_000) == pytest.approx(1_000_008.002, abs=1e-5)


def test_suspected_nodes_counts_per_node():
    a, b = uuid.uuid4(), uuid.uuid4()
    assert suspected_nodes([a, b, a]) == [(a, 2), (b, 1)]


@pytest.mark.parametrize("text,seconds", [("5s", 5), ("250ms", 0.25), ("2m", 120), ("1.5h", 5400), ("3", 3)])
def test_parse_duration(text, seconds):
    assert parse_duration(text).total_seconds() == seconds


def test_parse_duration_rejects_garbage():
    with pytest.raises(ConfigError):
        parse_duration("soon")


def act(mid, deadline_ms, action=None, **extra):
    h = [("chronosMessageId", mid.encode())]
    if deadline_ms is not None:
        h.append(("chronosDeadline", str(deadline_ms).encode()))
    if action:
        h.append(("chronosAction", action.encode()))
    h += [(k, v.encode()) for k, v in extra.items()]
    return FakeMessage(h, value=f"{mid}-{action}-{deadline_ms}".encode())


def test_batch_applies_schedule_cancel_replace_per_id_in_order():
    t = NOW // 1000 + 60_000
    batch = sort_batch([
        act("a", t), act("a", None, "cancel"),                 # scheduled then cancelled: cancel
        act("b", t, "replace"), act("b", t + 5),               # replaced then a duplicate: replace stands
        act("c", None, "cancel"), act("c", t + 1),             # cancel then schedule: replace with the new one
        act("d", t), act("d", t + 9, "replace"),               # schedule then replace: replace, later deadline
        act("e", NOW // 1000 - 5, "replace"),                  # a late replace: fires now, waiting one goes
        act("f", t), act("f", t + 1),                          # plain duplicate
    ], NOW, RULES)
    assert batch.of("cancel") == ["a", "e"]
    assert {r.id: r.deadline_us // 1000 for r in batch.of("replace")} == {"b": t, "c": t + 1, "d": t + 9}
    assert [r.id for r in batch.of("insert")] == ["f"]
    assert [p.message_id for _, p in batch.late] == ["e"]
    assert batch.duplicates == 2


def test_recurring_schedule_fires_first_at_its_first_occurrence():
    batch = sort_batch([act("daily", None, chronosCron="0 9 * * *", chronosTimeZone="Europe/Paris")], NOW, RULES)
    (row,) = batch.of("insert")
    assert (row.cron, row.timezone) == ("0 9 * * *", "Europe/Paris")
    from chronos.domain import cron
    first = cron.from_us(row.deadline_us)
    assert first.astimezone(cron.parse("* * * * *", "Europe/Paris").zone).hour == 9
    assert row.deadline_us >= NOW


@pytest.mark.parametrize("extra", [{"chronosCron": "61 * * * *"}, {"chronosCron": "* * * * *",
                                                                    "chronosTimeZone": "Nowhere/City"}])
def test_bad_cron_is_dead_lettered(extra):
    batch = sort_batch([act("x", None, **extra)], NOW, RULES)
    assert [r.split(":")[0] for _, r, _ in batch.dead] == ["bad_cron"]


def test_unknown_action_is_dead_lettered():
    batch = sort_batch([act("x", NOW // 1000 + 1000, "postpone")], NOW, RULES)
    assert [r.split(":")[0] for _, r, _ in batch.dead] == ["bad_action"]


def test_a_claim_starts_past_the_last_only_after_one_that_came_back_full_where_the_last_seq_is_not_known():
    cursor = ClaimCursor(every=0.2)
    assert cursor.start(10.0) is None  # nothing before: the window
    cursor.ended([(5, 2), (7, 1), (6, 9)], whole=True, backlog=True)
    assert cursor.start(10.05) == Mark(7, 1)  # past the last row in (deadline, seq) order
    cursor.ended([(8, 1)], whole=True, backlog=False)  # short: a row written late below it is the window's
    assert cursor.start(10.06) is None
    cursor.ended([], whole=True, backlog=True)
    assert cursor.start(10.07) is None


def test_a_claim_of_the_window_comes_at_most_every_so_often_and_a_full_claim_is_one():
    cursor = ClaimCursor(every=0.2)
    assert cursor.start(10.0) is None
    cursor.ended([(1, 1)], whole=True, backlog=True)
    assert cursor.start(10.19) == Mark(1, 1)
    cursor.ended([(2, 1)], whole=True, backlog=True)
    assert cursor.start(10.2) is None  # the window's turn: rows written below the mark since are found
    cursor.ended([(3, 1)], whole=True, backlog=True)
    assert cursor.start(10.3) == Mark(3, 1)
    assert cursor.start(10.31, full=True) is None  # a full claim finds all the window does, and more
    cursor.ended([(4, 1)], whole=True, backlog=True)
    assert cursor.start(10.5) == Mark(4, 1)  # the full claim began the next 0.2 s
    assert cursor.start(10.52) is None


def test_with_the_last_seq_known_every_claim_that_took_all_it_chose_moves_the_mark_and_looks_below_it():
    cursor = ClaimCursor(every=0.2)
    cursor.seq_read(100)
    cursor.seq_read(120)
    assert cursor.since is None  # two reads: the one two before the last is not known yet
    cursor.seq_read(140)
    assert cursor.start(10.0, full=True) is None
    cursor.ended([(5, 2)], whole=True, backlog=False)
    assert cursor.start(10.1) == Mark(5, 2, 100)  # short claims too; below the mark, rows past seq 100
    cursor.ended([(9, 150)], whole=True, backlog=False)
    cursor.ended([(8, 160)], whole=True, backlog=False)  # a row written late, found below the mark
    assert cursor.start(10.7) == Mark(9, 150, 100)  # which stays where it was
    cursor.ended([], whole=True, backlog=False)
    assert cursor.start(10.95) == Mark(9, 150, 100)  # no claim of the window comes between full ones
    cursor.ended([(12, 170)], whole=False, backlog=False)  # a row it chose was held back by its ordering key
    assert cursor.start(10.96) is None
    cursor.ended([(13, 171)], whole=True, backlog=False)
    assert cursor.start(10.97) == Mark(13, 171, 100)
    cursor.seq_read(200)  # a read moves the floor, not the mark: a row drawn before the read before the
    assert cursor.start(11.0) == Mark(13, 171, 120)  # last is looked at until this one
    assert cursor.start(11.1, full=True) is None  # a full claim starts the mark again
    cursor.ended([(14, 180)], whole=True, backlog=False)
    assert cursor.start(11.2) == Mark(14, 180, 120)
    cursor.seq_read(None)  # the schema cannot say: the claims of the window again
    cursor.ended([(15, 181)], whole=True, backlog=False)
    assert cursor.start(11.6) is None
