"""The console in a real Chromium against a real `chronos up`: one stack for the whole module."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from chronos import codec

from chronos.domain import cron
from chronos.domain.model import Row
from chronos.adapters.postgres.store import Store

from consolekit import TOKEN

pytestmark = pytest.mark.browser

KNOWN = 20
SCRIPT_VALUE = b"<script>window.__pwned = 1</script>"
SCHEDULE_ID = '<img src=x onerror="window.__pwned = 1">yearly'
YEARLY = "0 3 1 1 *"


@pytest.fixture(scope="module")
def known(stack) -> dict:
    """Far-future messages and one recurring schedule written straight to the store."""
    now_us = cron.to_us(datetime.now(timezone.utc))
    day_us = 86_400_000_000
    rows = [Row(id=f"known-{i:03d}", deadline_us=now_us + day_us + i * 1_000_000, topic=None,
                key=f"key-{i % 4}".encode(), value=b"plain value" if i else SCRIPT_VALUE,
                headers=codec.encode_headers([("trace-id", f"trace-{i}".encode()), ("bin", b"\x00\xff")]))
            for i in range(KNOWN)]
    # once a year, so that no occurrence falls due (and the firer moves the schedule on) while the tests look
    first = cron.first_occurrence(YEARLY, "Europe/Paris", None, now_us)
    rows.append(Row(id=SCHEDULE_ID, deadline_us=first, topic=None, key=None, value=b"tick",
                    headers=codec.encode_headers([]), cron=YEARLY, timezone="Europe/Paris"))
    store = Store(stack["database_url"])
    assert store.insert(rows) == KNOWN + 1
    store.close()
    return {"schedule_next": cron.from_us(first)}


def field(page, name: str) -> str:
    return page.locator(f"[data-field={name}]").inner_text()


def wait_until(page, condition: str, arg=None, what: str = "") -> None:
    """Wait for a JS condition on the live page; on timeout, say what the page showed."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    try:
        page.wait_for_function(condition, arg=arg, timeout=30000)
    except PlaywrightTimeout:
        shown = page.evaluate("() => Object.fromEntries([...document.querySelectorAll('[data-field]')]"
                              ".map(e => [e.dataset.field, e.textContent]))")
        raise AssertionError(f"{what} did not happen within 30 s; the page shows {shown}") from None


def test_overview_shows_the_figures_of_the_store(stack, known, page):
    page.goto(stack["console_url"])
    assert field(page, "waiting") == f"{KNOWN}"
    assert field(page, "due_now") == "0"
    assert field(page, "in_flight") == "0"
    assert field(page, "past_hold_time") == "0"
    assert field(page, "recurring_schedules") == "1"
    assert field(page, "parked") == "0"
    assert field(page, "next_deadline").startswith("in ")
    assert page.locator("#metrics-note").inner_text().startswith("Rates and lateness from the /metrics of 3")


def test_overview_updates_when_new_messages_arrive(stack, known, page):
    from chronos.client import Scheduler
    page.goto(stack["console_url"])
    before = int(field(page, "waiting").replace(",", ""))
    # the rate is over the last 5 s: remember every value the page showed
    page.evaluate("""() => {
        const el = document.querySelector('[data-field=rate_in]');
        window.__rates = [];
        new MutationObserver(() => window.__rates.push(el.textContent)).observe(el, {childList: true});
    }""")
    scheduler = Scheduler(stack["bootstrap_servers"], input_topic=stack["input_topic"])
    with scheduler:
        for i in range(3):
            scheduler.send_later("later", b"arrives", delay=timedelta(days=2), message_id=f"arrival-{i}")
            scheduler.send_later("soon", b"fires", delay=timedelta(seconds=5), message_id=f"fires-{i}")
    # the page refreshes itself: no reload, just wait for the figures to change
    wait_until(page, "n => document.querySelector('[data-field=waiting]').textContent === String(n)",
               before + 3, "waiting going up by 3")
    # the programs' /metrics: messages in, and the lateness of the three that fired
    wait_until(page, "() => window.__rates.some(t => !['-', '0.0/s'].includes(t))", what="a rate of messages in")
    wait_until(page, "() => Number(document.querySelector('[data-field=lateness_count]')"
               ".textContent.replace(/,/g, '')) >= 3", what="the lateness of 3 fired messages")
    assert page.locator("[data-chart=lateness] svg rect").count() > 0


def test_overview_shows_the_postgres_server_and_the_one_each_process_uses(stack, page):
    from psycopg.conninfo import conninfo_to_dict
    params = conninfo_to_dict(stack["database_url"])
    server = f"{params['host']}:{params['port']}"
    page.goto(stack["console_url"])
    assert field(page, "postgres_role") == "primary"
    assert field(page, "postgres_note").startswith(f"{server} · PostgreSQL ")
    # each process's own view comes from its /metrics, scraped in the background: wait for all three
    wait_until(page, "s => [...document.querySelectorAll('#postgres tbody tr')].filter("
               "tr => tr.children[1].textContent.startsWith(s)).length === 3", server, "three processes on " + server)
    rows = [row.split("\t") for row in page.locator("#postgres tbody tr").all_inner_texts()]
    assert sorted(r[0].split()[0] for r in rows) == ["consumer", "detector", "firer"]
    for process, _server, sessions_here, _reconnects, changes, unanswered, *note in rows:
        assert int(sessions_here) >= 1 and (changes, unanswered) == ("0", "0") and note in ([], [""]), process
    assert page.locator("#postgres-apart").is_hidden()


def test_the_live_refresh_fills_the_tables_as_text(stack, page):
    # the store's side is tested over HTTP (test_console_http); here the page's script, fed one answer
    import orjson
    page.goto(stack["console_url"])
    apart = "1 process not on the console's server db1:5432: firer 726ff2a2 has none"
    answer = {"display": {"postgres_apart": apart}, "charts": {}, "nodes": [["node-1", "5", "1.0 s", "0"]],
              "throttled": [["<b>slow</b>", "2/s", "3", "1.5 s"]], "postgres_apart": apart,
              "postgres_processes": [["firer 726ff2a2", "none", "0", "3", "1", "2", "no connection open"]]}
    page.route("**/api/overview", lambda route: route.fulfill(content_type="application/json",
                                                              body=orjson.dumps(answer)))
    wait_until(page, "() => document.querySelector('#throttled tbody td') !== null", what="the throttled row")
    assert page.locator("#throttled tbody tr").all_inner_texts() == ["<b>slow</b>\t2/s\t3\t1.5 s"]
    assert page.locator("#nodes tbody td").first.inner_text() == "node-1"
    assert page.locator("#postgres tbody tr").all_inner_texts() == \
        ["firer 726ff2a2\tnone\t0\t3\t1\t2\tno connection open"]
    assert page.locator("#postgres-apart").is_visible() and field(page, "postgres_apart") == apart


def test_schedules_page_lists_next_occurrences_and_shows_ids_as_text(stack, known, page):
    page.goto(stack["console_url"] + "schedules")
    row = page.locator("#schedules tbody tr")
    assert row.count() == 1
    assert row.locator("td.id").inner_text() == SCHEDULE_ID
    occurrences = row.locator("ol.occurrences time")
    assert occurrences.count() == 5
    assert occurrences.first.get_attribute("datetime") == known["schedule_next"].isoformat()
    assert page.evaluate("window.__pwned") is None


def test_sign_in_with_the_token(stack, page):
    page.goto(stack["console_url"] + "login")
    page.fill("input[name=token]", "not-the-token-at-all")
    page.click("button[type=submit]")
    assert page.locator(".error-message").inner_text() == "That is not the token."
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url(stack["console_url"])
    assert page.locator("header form button").inner_text() == "sign out"
    cookie = page.context.cookies()[0]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and TOKEN not in cookie["value"]


def test_read_only_console_says_so(read_only_console, page):
    page.goto(read_only_console.url)
    assert "Read-only" in page.locator("#read-only-notice").inner_text()
    page.goto(read_only_console.url + "login")
    assert page.locator("h1").inner_text() == "Read-only console"


def test_unknown_address_is_a_404_page(stack, page):
    response = page.goto(stack["console_url"] + "no/such/page")
    assert response.status == 404
    assert page.locator("h1").inner_text() == "Not found"


def sign_in(page, url: str) -> None:
    page.goto(url + "login")
    page.fill("input[name=token]", TOKEN)
    page.click("button[type=submit]")
    page.wait_for_url(url)


def search(page, url: str, **filters: str) -> list[str]:
    page.goto(url + "messages")
    for name, value in filters.items():
        page.fill(f"#search [name={name}]", value)
    page.click("#search button[type=submit]")
    page.wait_for_load_state()
    return page.locator("#results td.id").all_inner_texts()


def test_search_finds_messages_by_id_prefix_and_by_key(stack, known, page):
    assert search(page, stack["console_url"], id_prefix="known-01") == [f"known-{i:03d}" for i in range(10, 20)]
    assert page.locator("#key-search-note").count() == 0
    assert search(page, stack["console_url"], key="key-1") == [f"known-{i:03d}" for i in range(1, KNOWN, 4)]
    # the stack's database has no key-search index (chronos key-search on builds it): the page says what that costs
    assert page.locator("#key-search-note").inner_text().startswith(
        "The database has no key-search index: this search reads the rows in deadline order")
    assert search(page, stack["console_url"], due_after="not a time") == []
    assert "due after is neither ISO-8601 nor relative" in page.locator("#search-error").inner_text()


def test_detail_page_shows_headers_and_the_script_value_as_text(stack, known, page):
    search(page, stack["console_url"], id_prefix="known-000")
    page.click("#results td.id a")
    assert page.url == stack["console_url"] + "messages/known-000"
    assert page.locator("#state").inner_text() == "waiting"
    headers = dict(zip(page.locator("#headers td:nth-child(1)").all_inner_texts(),
                       page.locator("#headers td:nth-child(2)").all_inner_texts()))
    assert headers == {"trace-id": "trace-0", "bin": "00 ff"}
    assert page.locator("#value").inner_text() == SCRIPT_VALUE.decode()
    assert page.evaluate("window.__pwned") is None
    # an id with every awkward character has a stable address
    assert page.goto(stack["console_url"] + "messages/" + "%2F%25%22%C3%A9").status == 404


def test_search_then_cancel_from_the_message_page_removes_it_from_the_store(stack, known, page):
    sign_in(page, stack["console_url"])
    assert search(page, stack["console_url"], id_prefix="known-005") == ["known-005"]
    page.click("#results td.id a")
    page.wait_for_url(stack["console_url"] + "messages/known-005")
    page.click("#cancel")
    assert page.locator("#confirm-count").inner_text() == "This will cancel 1 message."
    page.click("#confirm-button")
    assert page.locator("#done-count").inner_text() == "1 message cancelled."
    store = Store(stack["database_url"])
    try:
        assert store.show("known-005", output_topic=stack["output_topic"]) is None
        assert store.action_totals()["cancel"][1] >= 1
    finally:
        store.close()


def test_reschedule_every_message_a_search_matches_after_seeing_the_count(stack, known, page):
    sign_in(page, stack["console_url"])
    matched = search(page, stack["console_url"], key="key-3")
    assert len(matched) == 5
    page.fill(".actions [name=at]", "2031-02-03T04:05:06Z")
    page.click(".actions button[value=reschedule]")
    assert page.locator("#confirm-count").inner_text() == \
        "This will reschedule 5 messages (to 2031-02-03T04:05:06.000000Z)."
    page.click("#confirm-button")
    assert page.locator("#done-count").inner_text() == "5 messages rescheduled."
    store = Store(stack["database_url"])
    try:
        for message_id in matched:
            m = store.show(message_id, output_topic=stack["output_topic"])
            assert (m.state, m.deadline) == ("waiting", datetime(2031, 2, 3, 4, 5, 6, tzinfo=timezone.utc))
    finally:
        store.close()


def test_a_form_on_another_origin_cannot_act_even_with_the_session_and_its_form_token(stack, known, page):
    """127.0.0.1 on another port is the same site: the SameSite cookie goes along, the Origin check stops it."""
    sign_in(page, stack["console_url"])
    page.goto(stack["console_url"] + "messages/known-007")
    form_token = page.locator("input[name=form_token]").first.get_attribute("value")
    evil = "http://127.0.0.1:1/evil"
    page.route(evil, lambda route: route.fulfill(content_type="text/html", body=f"""
        <form method="post" action="{stack['console_url']}actions/apply">
          <input name="action" value="cancel"><input name="id" value="known-007">
          <input name="expected" value="1"><input name="form_token" value="{form_token}">
        </form>"""))
    page.goto(evil)
    with page.expect_navigation():
        page.evaluate("document.forms[0].submit()")
    assert "This request did not come from the console's own page." in page.locator("main").inner_text()
    store = Store(stack["database_url"])
    try:
        assert store.show("known-007", output_topic=stack["output_topic"]).state == "waiting"
    finally:
        store.close()


def test_read_only_mode_refuses_actions(stack, known, read_only_console, page):
    page.goto(read_only_console.url + "messages/known-006")
    assert page.locator("#cancel").count() == 0
    response = page.request.post(read_only_console.url + "actions/apply",
                                 form={"action": "cancel", "id": "known-006", "expected": "1"})
    assert response.status == 403 and "read-only" in response.text()
    # the token console refuses too without a session and its form token
    response = page.request.post(stack["console_url"] + "actions/apply",
                                 form={"action": "cancel", "id": "known-006", "expected": "1"})
    assert response.status == 403
    page.goto(read_only_console.url + "messages/known-006")
    assert page.locator("#state").inner_text() == "waiting"


def test_replay_a_parked_message_from_its_page_and_drop_others_from_a_search(stack, page):
    from chronos.domain.model import Parked
    from helpers import Collector
    url = stack["console_url"]
    store = Store(stack["database_url"])
    try:
        store.park([Parked("parked-1", "store/parked-1", stack["output_topic"], None, b"parked-key", b"parked value",
                           codec.encode_headers([("trace", b"\x00\xff")]), "too_large: MSG_SIZE_TOO_LARGE: too large")]
                   + [Parked(None, f"{stack['input_topic']}/0/{i}", stack["dlq_topic"], None, None, b"v",
                             codec.encode_headers([]), "missing_id: no chronosMessageId") for i in range(2)])
    finally:
        store.close()
    sign_in(page, url)
    page.goto(url + "parked")
    page.fill("#parked-search [name=reason]", "too_large")
    page.click("#parked-search button[type=submit]")
    page.wait_for_load_state()
    assert page.locator("#parked td.id").all_inner_texts() == ["parked-1"]
    page.click("#parked td.number a")
    assert page.locator("#reason").inner_text() == "too_large: MSG_SIZE_TOO_LARGE: too large"
    page.click("#replay")
    assert page.locator("#confirm-count").inner_text() == \
        "This will replay 1 parked message (each to the topic it was going to)."
    page.click("#confirm-button")
    assert page.locator("#done-count").inner_text() == "1 parked message replayed."
    collect = Collector(stack["bootstrap_servers"], [stack["output_topic"]])
    try:
        (got,) = [m for m in collect.until(lambda ms: any(m.key == b"parked-key" for m in ms)) if m.key == b"parked-key"]
    finally:
        collect.close()
    assert (got.value, got.headers) == (b"parked value", [("trace", b"\x00\xff")])
    # the others, by a search
    page.goto(url + "parked?reason=missing_id")
    assert page.locator("#parked td.id").count() == 2
    page.click("#drop-all")
    assert page.locator("#confirm-count").inner_text() == "This will drop 2 parked messages."
    page.click("#confirm-button")
    assert page.locator("#done-count").inner_text() == "2 parked messages dropped."
    page.goto(url + "parked")
    assert page.locator("#parked tbody").inner_text().strip() == "No parked message."
