"""The console's Parked pages and their actions over plain HTTP: a real `chronos console` process on a
fresh database of the session's PostgreSQL and, for replays, the session's broker. The browser's side
is in test_console_browser.py."""

from __future__ import annotations

import re
import urllib.parse

import pytest

from chronos import codec
from chronos.adapters.kafka.admin import create_topics
from chronos.adapters.postgres.store import Store
from chronos.domain.model import Parked

from kits.stack import clean_env
from consolekit import TOKEN, Console
from helpers import Collector
from test_console_http import FORM, post, request

HEADERS = [("trace", b"\x00\xff"), ("note", b"<b>bold</b>")]


@pytest.fixture
def store(database_url):
    s = Store(database_url)
    yield s
    s.close()


@pytest.fixture
def console(database_url, broker, topics, tmp_path):
    c = Console(tmp_path, env=clean_env(CHRONOS_DATABASE_URL=database_url, CHRONOS_CONSOLE_TOKEN=TOKEN,
                                        CHRONOS_CONFIRM_ABOVE="2", CHRONOS_KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap_servers,
                                        CHRONOS_OUTPUT_TOPIC=topics["output"], CHRONOS_DLQ_TOPIC=topics["dlq"],
                                        CHRONOS_ALLOWED_TOPICS="allowed-.*"))
    yield c
    c.stop()


def park(store: Store, *messages: tuple[str | None, str, str]) -> list[int]:
    """Park (message id, topic, reason) messages; their numbers, oldest first."""
    store.park([Parked(mid, f"store/{mid}", topic, None, b"key", b"<script>v</script>", codec.encode_headers(HEADERS),
                       reason) for mid, topic, reason in messages])
    return sorted(p.number for p in store.list_parked(limit=100))[-len(messages):]


def sign_in(url: str, number: int) -> tuple[str, str]:
    """A fresh session: its cookie header and the form token the page of parked message `number` carries."""
    status, headers, _ = request(url, "/login", "POST", urllib.parse.urlencode({"token": TOKEN}), FORM)
    assert status == 303
    cookie = headers["set-cookie"].split(";")[0]
    status, _, text = request(url, f"/parked/{number}", headers={"Cookie": cookie})
    assert status == 200
    return cookie, re.search(r'name="form_token" value="([^"]+)"', text).group(1)


def numbers(store: Store) -> list[int]:
    return sorted(p.number for p in store.list_parked(limit=100))


def confirmed(text: str) -> dict[str, str]:
    """The hidden fields of a confirmation page's form."""
    return dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', text))


def test_the_parked_page_filters_and_links_each_message_to_its_page(console, store, topics):
    big, refused = park(store, ("big", topics["output"], "too_large: MSG_SIZE_TOO_LARGE: too large"),
                        ("refused", "t.x", "publish_failed: TOPIC_AUTHORIZATION_FAILED: denied"))
    status, _, text = request(console.url, "/parked?reason=too_large")
    assert status == 200 and f'href="/parked/{big}">#{big}<' in text and f"#{refused}<" not in text
    assert "&lt;script&gt;v&lt;/script&gt;" in text and "<script>v" not in text
    status, _, text = request(console.url, f"/parked/{refused}")
    assert status == 200 and "publish_failed: TOPIC_AUTHORIZATION_FAILED: denied" in text
    assert "&lt;b&gt;bold&lt;/b&gt;" in text and "00 ff" in text and "Sign in</a> to replay or drop" in text
    assert request(console.url, "/parked/999999")[0] == 404 and request(console.url, "/parked/x")[0] == 404
    for query, why in (("reason=too%20large", "a reason&#39;s code"), ("parked_after=someday", "--parked-after"),
                       ("parked_after=-1h&parked_before=-2h", "must be before"), ("before=0", "page cursor")):
        status, _, text = request(console.url, "/parked?" + query)
        assert status == 400 and why in text and 'id="parked-search"' in text, (query, text[-400:])


def test_parked_actions_need_a_session_its_form_token_the_consoles_origin_and_a_target(console, store, topics):
    (number,) = park(store, ("m", topics["output"], "too_large: x"))
    cookie, token = sign_in(console.url, number)
    drop = {"action": "drop", "number": str(number), "expected": "1"}
    for path in ("/parked/actions/preview", "/parked/actions/apply"):
        for fields, jar, headers, why in (
                ({**drop, "form_token": token}, None, {}, "Sign in with the console token first."),
                (drop, cookie, {}, "The form is stale or forged"),
                ({**drop, "form_token": token}, cookie, {"Origin": "http://evil.example"}, "did not come from")):
            status, text = post(console.url, path, fields, jar, **headers)
            assert status == 403 and why in text, (path, fields, text[-400:])
        for fields, why in (({"action": "purge", "number": str(number)}, "unknown action &#39;purge&#39;"),
                            ({"action": "drop"}, "needs a number or at least one filter"),
                            ({"action": "drop", "number": "x"}, "is not the number of a parked message"),
                            ({"action": "drop", "reason": "too large"}, "a reason&#39;s code"),
                            ({"action": "replay", "number": str(number), "to": "elsewhere"},
                             "neither the output topic, nor the dead-letter topic")):
            status, text = post(console.url, path, {**fields, "form_token": token, "expected": "1"}, cookie)
            assert status == 400 and why in text, (path, fields, text[-400:])
    assert numbers(store) == [number]


def test_replay_and_drop_from_the_parked_pages(console, store, broker, topics):
    allowed = f"allowed-{topics['output']}"
    create_topics(broker.bootstrap_servers, {allowed: 1})
    one, two, *three = park(store, ("one", topics["output"], "too_large: x"), ("two", "gone", "too_large: x"),
                            *((f"bad-{i}", topics["dlq"], "missing_id: x") for i in range(3)))
    cookie, token = sign_in(console.url, one)
    collect = Collector(broker.bootstrap_servers, [topics["output"], allowed])
    # one, to the topic it was going to
    status, text = post(console.url, "/parked/actions/preview", {"action": "replay", "number": str(one),
                                                                 "form_token": token}, cookie)
    assert status == 200 and "This will replay <b>1</b> parked message (each to the topic it was going to)." in text
    status, text = post(console.url, "/parked/actions/apply", confirmed(text), cookie)
    assert status == 200 and "1 parked message replayed." in text
    # its own topic is not allowed: it stays parked until given one that is
    status, text = post(console.url, "/parked/actions/preview", {"action": "replay", "number": str(two),
                                                                 "form_token": token}, cookie)
    assert status == 200 and "<b>0</b>" in text and "CHRONOS_ALLOWED_TOPICS does not allow" in text
    status, text = post(console.url, "/parked/actions/preview", {"action": "replay", "number": str(two), "to": allowed,
                                                                 "form_token": token}, cookie)
    assert status == 200 and f"(to {allowed})" in text
    status, text = post(console.url, "/parked/actions/apply", confirmed(text), cookie)
    assert status == 200 and "1 parked message replayed." in text
    got = collect.until(lambda ms: len(ms) >= 2, timeout=30)
    assert sorted((m.topic, m.key, m.value, tuple(m.headers)) for m in got) == sorted(
        (t, b"key", b"<script>v</script>", tuple(HEADERS)) for t in (topics["output"], allowed))
    collect.close()
    # three by a search: more than CHRONOS_CONFIRM_ABOVE (2) needs the count typed; a grown match changes nothing
    search = {"action": "drop", "reason": "missing_id", "form_token": token}
    status, text = post(console.url, "/parked/actions/preview", search, cookie)
    assert status == 200 and "This will drop <b>3</b> parked messages." in text and 'name="typed"' in text
    status, text = post(console.url, "/parked/actions/apply", {**search, "expected": "3"}, cookie)
    assert status == 400 and "type the count, 3, to confirm" in text
    status, text = post(console.url, "/parked/actions/apply", {**search, "expected": "2", "typed": "2"}, cookie)
    assert status == 409 and "nothing was done" in text
    assert numbers(store) == three
    status, text = post(console.url, "/parked/actions/apply", {**search, "expected": "3", "typed": "3"}, cookie)
    assert status == 200 and "3 parked messages dropped." in text
    assert numbers(store) == []
    assert {a: t for a, t in store.action_totals().items()} == {"replay_parked": (2, 2), "drop_parked": (1, 3)}


def test_a_console_without_kafka_says_a_replay_needs_it_and_still_drops(database_url, store, topics, tmp_path):
    (number,) = park(store, ("m", topics["output"], "too_large: x"))
    c = Console(tmp_path, env=clean_env(CHRONOS_DATABASE_URL=database_url,
                                        CHRONOS_CONSOLE_TOKEN=TOKEN))
    try:
        cookie, token = sign_in(c.url, number)
        status, text = post(c.url, "/parked/actions/preview", {"action": "replay", "number": str(number),
                                                               "form_token": token}, cookie)
        assert status == 400 and "This console has no Kafka to replay to" in text
        status, text = post(c.url, "/parked/actions/preview", {"action": "drop", "number": str(number),
                                                               "form_token": token}, cookie)
        assert status == 200 and "This will drop <b>1</b> parked message." in text
        status, text = post(c.url, "/parked/actions/apply", confirmed(text), cookie)
        assert status == 200 and "1 parked message dropped." in text
    finally:
        c.stop()
    assert numbers(store) == []


def test_a_read_only_console_refuses_parked_actions(database_url, store, topics, tmp_path):
    (number,) = park(store, ("m", topics["output"], "too_large: x"))
    c = Console(tmp_path, env=clean_env(CHRONOS_DATABASE_URL=database_url))
    try:
        for path in ("/parked/actions/preview", "/parked/actions/apply"):
            form = urllib.parse.urlencode({"action": "drop", "number": str(number), "expected": "1"})
            status, _, text = request(c.url, path, "POST", form, {**FORM, "Origin": c.url.rstrip("/")})
            assert status == 403 and "This console is read-only" in text
        status, _, text = request(c.url, f"/parked/{number}")
        assert status == 200 and 'id="drop"' not in text and "Read-only console" in text
    finally:
        c.stop()
    assert numbers(store) == [number]
