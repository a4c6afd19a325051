"""How one claim under fire-rate limits is shared between topics (chronos.domain.ratelimit.claim_by_topic),
with claims that hand out made-up rows."""

from __future__ import annotations

from datetime import datetime, timezone

from chronos.domain.model import Claimed
from chronos.domain.ratelimit import FireRateLimits, TopicRates, claim_by_topic

OUT = "out"
AT = datetime(2026, 1, 1, tzinfo=timezone.utc)


class Backlog:
    """Due rows per topic (None: the output topic), and the claims made of it."""

    def __init__(self, rows: dict[str | None, int], budget: dict[str, int]):
        self.rows = dict(rows)
        self.budget = budget
        self.calls: list[tuple] = []
        self.seq = 0

    def take(self, topic: str | None, n: int) -> list[Claimed]:
        n = min(n, self.rows[topic])
        self.rows[topic] -= n
        self.seq += n
        return [Claimed(f"{topic}-{self.seq - i}", 1000 - self.seq + i, topic, None, None, None, AT, self.seq - i)
                for i in range(n)]

    def claim(self, topic: str | None, at_most: int) -> list[Claimed]:
        self.calls.append(("claim", topic, at_most))
        return self.take(topic, at_most)

    def granted(self, name: str, topic: str | None, rate: float, at_most: int) -> list[Claimed]:
        self.calls.append(("granted", name, topic, rate, at_most))
        return self.take(topic, min(at_most, self.budget[name]))


def limits(**rates) -> FireRateLimits:
    return FireRateLimits(TopicRates(tuple(rates.items())))


def test_limited_topics_go_first_and_the_others_share_what_is_left():
    b = Backlog({None: 1000, "other": 30, "fragile": 30}, {"fragile": 5})
    rows, full = claim_by_topic(limits(fragile=5.0), OUT, ["fragile", "other"], 100, b.claim, b.granted)
    assert b.calls == [("granted", "fragile", "fragile", 5.0, 34), ("claim", None, 48), ("claim", "other", 47),
                           ("claim", None, 17)]
    topics = [r.topic for r in rows]
    assert (topics.count("fragile"), topics.count("other"), topics.count(None)) == (5, 30, 65)
    assert full   # the output topic filled its share: a backlog to drain at once
    assert rows == sorted(rows, key=lambda r: (r.deadline_us, r.seq))


def test_the_output_topic_is_limited_under_its_own_name():
    b = Backlog({None: 30}, {OUT: 5})
    rows, full = claim_by_topic(limits(out=5.0), OUT, [], 200, b.claim, b.granted)
    assert b.calls == [("granted", OUT, None, 5.0, 200)] and len(rows) == 5 and not full


def test_a_claim_ended_by_budgets_or_due_rows_is_not_full():
    b = Backlog({None: 3, "a": 2}, {})
    rows, full = claim_by_topic(FireRateLimits(), OUT, ["a"], 100, b.claim, b.granted)
    assert len(rows) == 5 and not full
