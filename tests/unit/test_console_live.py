"""The console's pure parts: scrape parsing, windowed rates and quantiles, charts, sessions, origins."""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import datetime, timezone

import pytest

from chronos.console.auth import Auth, same_origin
from chronos.console.live import History, Scrape, histogram_svg, parse_scrape, quantile

SCRAPE = """\
# HELP chronos_messages_fired_total messages published
# TYPE chronos_messages_fired_total counter
chronos_messages_fired_total{node="a",role="firer"} 120.0
chronos_messages_consumed_total{node="c",role="consumer"} 300.0
chronos_messages_dead_lettered_total{node="c",reason="bad_id",role="consumer"} 2.0
chronos_messages_dead_lettered_total{node="c",reason="too_late",role="consumer"} 1.0
chronos_fire_lateness_seconds_bucket{le="-0.05",node="a",role="firer"} 0.0
chronos_fire_lateness_seconds_bucket{le="0.0",node="a",role="firer"} 10.0
chronos_fire_lateness_seconds_bucket{le="0.01",node="a",role="firer"} 100.0
chronos_fire_lateness_seconds_bucket{le="+Inf",node="a",role="firer"} 120.0
chronos_fire_lateness_seconds_count{node="a",role="firer"} 120.0
chronos_batch_size_count{node="a",role="firer",step="claim"} 7.0
process_cpu_seconds_total 1.5
"""


def test_parse_scrape_sums_what_the_overview_needs():
    s = parse_scrape(SCRAPE)
    assert (s.consumed, s.fired, s.dead) == (300.0, 120.0, 3.0)
    assert s.buckets == ((-0.05, 0.0), (0.0, 10.0), (0.01, 100.0), (float("inf"), 120.0))


def test_a_process_whose_publishing_stalled_is_counted_until_it_recovers():
    stalled = SCRAPE + 'chronos_publishing_stalled_seconds{node="a",role="firer"} 12.5\n'
    assert parse_scrape(stalled).stalled == 12.5 and parse_scrape(SCRAPE).stalled == 0.0
    h = History()
    h.add(0.0, {"a": parse_scrape(stalled), "b": parse_scrape(SCRAPE)})
    assert h.stalled() == (1, 12.5)
    h.add(1.0, {"a": parse_scrape(SCRAPE), "b": parse_scrape(SCRAPE)})
    assert h.stalled() == (0, 0.0)


def _scrape(fired: float, cumulative: list[float]) -> Scrape:
    bounds = (0.0, 0.01, float("inf"))
    return Scrape(consumed=fired * 2, fired=fired, dead=0.0, buckets=tuple(zip(bounds, cumulative)))


def test_history_rates_and_window_survive_a_restarted_process():
    h = History(window=10.0)
    h.add(0.0, {"f": _scrape(100, [10, 90, 100])})
    h.add(1.0, {"f": _scrape(150, [15, 135, 150])})
    assert h.rates(over=5) == {"in": 100.0, "fired": 50.0, "dead": 0.0}
    # the firer restarted: its counters start again from zero, and all it counted is new
    h.add(2.0, {"f": _scrape(20, [0, 20, 20])})
    lateness = h.lateness()
    assert lateness["counts"] == [5, 60, 5]  # 5+0 at <=0, 40+20 at <=10ms, 5+0 above
    assert lateness["count"] == 70
    # steps older than the window drop out of the sums
    h.add(12.5, {"f": _scrape(30, [0, 30, 30])})
    assert h.lateness()["counts"] == [0, 10, 0]


def test_history_counts_a_silent_process_as_down_and_loses_nothing_it_counted():
    h = History()
    h.add(0.0, {"a": _scrape(1, [1, 1, 1]), "b": None})
    assert (h.sources, h.sources_up) == (2, 1)
    assert h.rates() is None  # one sample: no rate yet
    h.add(1.0, {"a": None, "b": None})
    h.add(2.0, {"a": _scrape(5, [1, 5, 5]), "b": None})
    assert h.rates(over=5) == {"in": 4.0, "fired": 2.0, "dead": 0.0}  # 4 fired over the 2 s since its last answer


def test_history_counts_rates_before_any_process_has_a_lateness_histogram():
    """A process's lateness histogram appears with its first fired message: two rounds of scrapes before
    that once raised IndexError, which ended the console's sampling for good (rates '-' thereafter)."""
    h = History()
    h.add(0.0, {"c": Scrape(consumed=3.0), "f": Scrape()})
    h.add(1.0, {"c": Scrape(consumed=9.0), "f": Scrape()})
    assert h.rates(over=5) == {"in": 6.0, "fired": 0.0, "dead": 0.0}
    h.add(2.0, {"c": Scrape(consumed=9.0), "f": _scrape(4, [1, 4, 4])})
    h.add(3.0, {"c": Scrape(consumed=9.0), "f": _scrape(6, [1, 6, 6])})
    assert h.lateness()["count"] == 2


def test_quantile_interpolates_inside_the_bucket():
    bounds = (-0.05, 0.0, 0.01, 0.1, float("inf"))
    counts = (0, 0, 50, 50, 0)
    assert quantile(bounds, counts, 0.5) == pytest.approx(0.01)
    assert quantile(bounds, counts, 0.75) == pytest.approx(0.055)
    assert quantile(bounds, (0, 0, 0, 0, 10), 0.99) == 0.1  # past the last finite bound


def test_histogram_svg_escapes_and_says_when_empty():
    assert "no message fired" in histogram_svg(None)
    svg = histogram_svg({"count": 3, "bounds": [0.005, float("inf")], "counts": [2, 1]})
    assert svg.count("<rect") == 2 and "5ms" in svg and "more" in svg


def test_sessions_and_form_tokens_are_bound_to_the_token():
    auth = Auth("a-long-enough-token")
    cookie = auth.new_session()
    sid = auth.session(cookie)
    assert sid is not None and auth.check_form(sid, auth.form_token(sid))
    assert auth.session(cookie[:-1] + ("0" if cookie[-1] != "0" else "1")) is None
    assert auth.session("forged.cookie") is None
    assert not auth.check_form(sid, Auth("another-long-token").form_token(sid))
    assert not auth.check_form(None, "x")
    assert Auth("a-new-token-value").session(cookie) is None  # a new token ends every session
    assert not Auth(None).check_token("") and Auth(None).session(cookie) is None


@pytest.mark.parametrize("headers,ok", [
    ({}, True),
    ({"origin": "http://127.0.0.1:9700", "sec-fetch-site": "same-origin"}, True),
    ({"origin": "http://evil.example", "sec-fetch-site": "cross-site"}, False),
    ({"sec-fetch-site": "same-site"}, False),
    ({"origin": "null"}, False),
    ({"origin": "https://127.0.0.1:9700"}, False),
])
def test_same_origin(headers, ok):
    assert same_origin(headers, "http", "127.0.0.1:9700") is ok


def test_console_without_its_extra_says_how_to_install_it():
    code = ("import sys\n"
            "sys.modules['starlette'] = None\n"
            "from chronos.cli import main\n"
            "sys.exit(main(['console', '--database-url', 'postgresql://x@127.0.0.1:1/x']))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 2
    assert "pip install 'chronos-scheduler[console]'" in out.stderr and "Traceback" not in out.stderr


def test_console_token_is_a_secret_and_must_not_be_short():
    from chronos import config
    settings = config.load(None, {"CHRONOS_CONSOLE_TOKEN": "twelve-chars"}, default_ready_file=False)
    assert "twelve-chars" in settings.secrets()
    with pytest.raises(config.ConfigError, match="at least 12 characters"):
        config.load(None, {"CHRONOS_CONSOLE_TOKEN": "short"}, default_ready_file=False)


def test_the_waiting_count_stays_within_its_share_of_a_core():
    from chronos.console.live import CountPolicy
    policy = CountPolicy(every=1.0, budget=0.01)
    assert policy.due(0.0)
    policy.counted(0.0, took=0.005)        # a small table: count every second
    assert not policy.due(0.5) and policy.due(1.0)
    policy.counted(1.0, took=0.05)         # 50 ms a count: every 5 s keeps it at 1% of a core
    assert not policy.due(5.9) and policy.due(6.0)
    policy.counted(6.0, took=10.0)         # never rarer than every 30 s
    assert policy.due(36.0)


def test_any_number_of_pages_cost_one_store_read_a_second():
    import asyncio
    import threading

    from chronos.console.live import StoreReader
    from chronos.domain.model import Overview

    class CountingStore:
        calls = 0

        def overview(self, hold_ms, *, exact=None):
            CountingStore.calls += 1
            assert threading.current_thread() is not threading.main_thread()  # off the event loop
            return Overview.build(datetime(2026, 1, 1, tzinfo=timezone.utc), None, None, 7, 7, 0, [], 0)

        def throttled(self, output_topic):
            return []

        def server_view(self):
            from chronos.domain.model import ServerView
            return ServerView(datetime(2026, 1, 1, tzinfo=timezone.utc), "db1:5432", None, False, "18.1", [], [])

    now = [100.0]
    reader = StoreReader(CountingStore(), 5000, "out", ttl=1.0, clock=lambda: now[0])

    async def pages(n):
        return await asyncio.gather(*(reader.overview() for _ in range(n)))

    async def scenario():
        results = await pages(10)
        assert CountingStore.calls == 1 and all(r[0]["waiting"] == 7 for r in results)
        assert results[0][0]["postgres"]["server"] == "db1:5432"  # read in the same call
        now[0] += 0.5
        await pages(10)
        assert CountingStore.calls == 1
        now[0] += 0.6
        await pages(10)
        assert CountingStore.calls == 2
    asyncio.run(scenario())


def test_up_without_the_console_extra_starts_without_a_console():
    code = ("import sys\n"
            "sys.modules['jinja2'] = None\n"
            "from chronos.console.launch import ConsoleProcess\n"
            "print(ConsoleProcess.available())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "the console extra is not installed (pip install 'chronos-scheduler[console]')"


def test_the_overview_shows_the_embedded_broker_when_there_is_one():
    from chronos.console.views import display
    store = {"waiting_age_s": 0, "waiting": 1, "waiting_estimated": False, "due_now": 0, "in_flight": 0,
             "oldest_overdue_s": None, "past_hold_time": 0, "parked": 0, "recurring_schedules": None,
             "next_deadline_in_s": None, "next_deadline": None, "at": "now",
             "embedded_broker": {"pid": 7, "rss_bytes": 3 * 2 ** 30, "messages": 2_160_000, "input_unread": 4,
                                 "exact": True, "sampled_at": None, "memory_warning_bytes": 2 * 2 ** 30,
                                 "restarts": 1, "lost_input": 12}}
    shown = display(store, None, None)
    assert shown["broker_rss"] == "3,072 MB"
    assert shown["broker_note"] == "2,160,000 messages held; above 2,048 MB: plan a restart; restarted 1x, " \
                                   "about 12 unread lost"
    assert "broker_rss" not in display({**store, "embedded_broker": None}, None, None)


# -- the PostgreSQL server each process uses ---------------------------------------------------------

FIRER, CONSUMER, DETECTOR, GONE = ("726ff2a2-1003-47ca-9c7c-afc7aa3844fe", "11aa22bb-0000-4000-8000-000000000001",
                                   "33cc44dd-0000-4000-8000-000000000002", "55ee66ff-0000-4000-8000-000000000003")
LINKS = f"""\
chronos_postgres_connects_total{{node="{FIRER}",role="firer"}} 3.0
chronos_postgres_server_changes_total{{node="{FIRER}",role="firer"}} 1.0
chronos_postgres_unanswered_total{{node="{FIRER}",role="firer"}} 1.0
chronos_postgres_read_only_total{{node="{FIRER}",role="firer"}} 0.0
chronos_postgres_connected{{node="{FIRER}",role="firer",server="db2:5433"}} 2.0
"""


def test_a_scrape_carries_the_servers_its_process_is_connected_to_and_a_silent_one_keeps_its_name():
    s = parse_scrape(SCRAPE + LINKS)
    (link,) = s.links
    assert (link.role, link.node, link.servers, link.reconnects, link.server_changes, link.unanswered) == \
        ("firer", FIRER, (("db2:5433", 2),), 1, 1, 1)
    assert s.fired == 120.0 and parse_scrape(SCRAPE).links == ()
    h = History()
    h.add(0.0, {"a": s, "b": None})
    assert [(a.url, a.answered, a.reported) for a in h.asked()] == [("a", True, s.links), ("b", False, ())]
    h.add(1.0, {"a": None, "b": None})
    assert [(a.answered, a.reported) for a in h.asked()] == [(False, s.links), (False, ())]


def _postgres(processes=(), held=()):
    from chronos.domain.model import NodeLoad, ServerView, Sessions, Standby
    from chronos.ops import status
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    view = ServerView(at, "db1:5432", "10.0.0.1:5432", False, "18.1", [Standby("pg2", "10.0.0.2", "streaming", "sync")],
                      [Sessions(role, node, n, ["10.0.0.9"], at, True) for role, node, n in processes])
    return status.postgres_dict(view, [NodeLoad(uuid.UUID(node), rows, 0, 1.0, at) for node, rows in held])


def test_the_overview_lists_each_processes_server_and_flags_one_elsewhere_or_on_none():
    from chronos.console.views import display, postgres_processes
    from chronos.ops import servers, status
    postgres = _postgres(processes=[("consumer", CONSUMER, 1), ("detector", DETECTOR, 1)], held=[(GONE, 4)])
    asked = [servers.Asked("http://h:1/metrics", True, parse_scrape(LINKS).links),
             servers.Asked("http://h:2/metrics", True, (servers.Reported("consumer", CONSUMER, (("db1:5432", 1),), 1),)),
             servers.Asked("http://h:3/metrics", True, (servers.Reported("detector", DETECTOR, (), 2),)),
             servers.Asked("http://h:4/metrics", False),
             # it names the console's server but has no session there: an address that moved under it
             servers.Asked("http://h:5/metrics", True, (servers.Reported("firer", GONE, (("db1:5432", 1),), 1),))]
    rows, banner = postgres_processes(postgres, status.reported_dicts(asked, postgres))
    assert rows == [["firer 726ff2a2", "db2:5433 ×2", "0", "1", "1", "1", "another server than the console's"],
                    ["consumer 11aa22bb", "db1:5432", "1", "0", "0", "0", ""],
                    ["detector 33cc44dd", "none", "1", "2", "0", "0", "no connection open"],
                    ["http://h:4/metrics", "-", "-", "-", "-", "-", "no answer"],
                    ["firer 55ee66ff", "db1:5432", "0", "0", "0", "0",
                     "no session on the console's server: another one behind the same address"]]
    assert banner == "3 processes not on the console's server db1:5432: firer 726ff2a2 is on db2:5433 ×2; " \
                     "detector 33cc44dd has none; firer 55ee66ff is on db1:5432 (no session on the console's)"
    # all on the console's server: no banner; a firer holding rows that no URL answered for is listed
    rows, banner = postgres_processes(postgres, status.reported_dicts(asked[1:2], postgres))
    assert banner == "" and rows[-1] == ["firer 55ee66ff", "-", "0", "-", "-", "-", "holds 4 rows but has no "
                                         "session on this server: connected elsewhere, or gone"]
    # no /metrics URL known: the sessions on the console's server are all there is
    rows, banner = postgres_processes(postgres, None)
    assert rows[0] == ["consumer 11aa22bb", "-", "1", "-", "-", "-", "sessions on this server; its /metrics not asked"]
    assert banner == "" and len(rows) == 3
    assert postgres_processes(None, None) == ([], "")
    shown = display({**STORE, "postgres": postgres}, None, None)
    assert (shown["postgres_role"], shown["postgres_note"]) == ("primary", "db1:5432 · PostgreSQL 18.1 · 1 standby (sync)")


STORE = {"waiting_age_s": 0, "waiting": 1, "waiting_estimated": False, "due_now": 0, "in_flight": 0,
         "oldest_overdue_s": None, "past_hold_time": 0, "parked": 0, "recurring_schedules": None,
         "next_deadline_in_s": None, "next_deadline": None, "at": "now", "embedded_broker": None}


def test_a_failed_round_of_scrapes_does_not_end_the_sampling(caplog):
    """The sampler is a task of its own: a round that raised once ended it, and the overview's live figures
    stayed as they were, with nothing said."""
    import asyncio

    from chronos.console.live import MetricsSampler
    sampler = MetricsSampler(["http://127.0.0.1:9/metrics"], every=0.01, idle_every=0.01)
    sampler._one = lambda url: Scrape(consumed=1.0)
    rounds: list[float] = []
    add = sampler.history.add

    def add_failing_once(now, scrapes):
        rounds.append(now)
        if len(rounds) == 1:
            raise IndexError("tuple index out of range")
        add(now, scrapes)
    sampler.history.add = add_failing_once

    async def three_rounds():
        task = asyncio.create_task(sampler.run())
        end = asyncio.get_running_loop().time() + 10
        while len(rounds) < 3 and not task.done() and asyncio.get_running_loop().time() < end:
            await asyncio.sleep(0.01)
        task.cancel()
    asyncio.run(three_rounds())
    assert len(rounds) >= 3
    assert sampler.history.sources_up == 1
    assert "a round of the processes' metrics failed (IndexError" in caplog.text
