"""The console over plain HTTP: secrets, cross-site requests, host names, bad addresses.

Each test runs a real `chronos console` process against a fresh database of the session's
PostgreSQL; no broker is needed.
"""

from __future__ import annotations

import http.client
import re
import time
import urllib.parse
import uuid
from urllib.parse import urlsplit

import pytest

from chronos import codec

from chronos.domain.model import Parked, Row
from chronos.adapters.postgres.store import Store

from kits.stack import clean_env
from consolekit import TOKEN, Console

PASSWORD = "s3cret-db-password"
SASL = "s3cret-sasl-password"


@pytest.fixture
def console(database_url, tmp_path):
    parts = urlsplit(database_url)
    with_password = parts._replace(netloc=f"{parts.username}:{PASSWORD}@{parts.hostname}:{parts.port}").geturl()
    props = tmp_path / "kafka.properties"
    props.write_text(f"sasl.password={SASL}\n")
    c = Console(tmp_path, env=clean_env(CHRONOS_DATABASE_URL=with_password, CHRONOS_CONSOLE_TOKEN=TOKEN,
                                        CHRONOS_KAFKA_PROPERTIES_FILE=str(props), CHRONOS_CONFIRM_ABOVE="2"))
    yield c
    c.stop()


def request(url: str, path: str, method: str = "GET", body: str | None = None,
            headers: dict | None = None) -> tuple[int, dict, str]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    text = response.read().decode(errors="replace")
    conn.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, text


def test_no_secret_on_any_page_response_or_log_line(console):
    bodies = []
    for path in ("/", "/api/overview", "/schedules", "/messages", "/messages/x", "/parked", "/login", "/nowhere",
                 "/static/console.js"):
        status, headers, text = request(console.url, path)
        assert status in (200, 404), (path, status)
        assert "default-src 'none'" in headers["content-security-policy"]
        assert headers["x-content-type-options"] == "nosniff"
        bodies.append(text)
    status, headers, text = request(console.url, "/login", "POST", "token=wrong-token-value",
                                    {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 403
    bodies.append(text + str(headers))
    console.stop()
    bodies.append(console.log.read_text())
    for secret in (PASSWORD, SASL, TOKEN):
        assert not any(secret in body for body in bodies), secret


def test_sign_in_from_another_site_is_refused(console):
    form = urllib.parse.urlencode({"token": TOKEN})
    base = {"Content-Type": "application/x-www-form-urlencoded"}
    status, headers, _ = request(console.url, "/login", "POST", form,
                                 {**base, "Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"})
    assert status == 403 and "set-cookie" not in headers
    status, headers, _ = request(console.url, "/login", "POST", form, base)
    assert status == 303 and "HttpOnly" in headers["set-cookie"] and "SameSite=strict" in headers["set-cookie"]


def test_a_foreign_host_name_is_refused_on_loopback(console):
    # DNS rebinding: a page on evil.example whose name now points at 127.0.0.1 cannot read the console
    status, _, _ = request(console.url, "/api/overview", headers={"Host": "evil.example"})
    assert status == 400
    assert request(console.url, "/api/overview", headers={"Host": "localhost"})[0] == 200


@pytest.mark.parametrize("path", ["/static/../../etc/passwd", "/%FF%FE", "/schedules/%00", "/" + "x" * 5000,
                                  "/messages/%FF%FE", "/messages/a%00b", "/messages/" + "x" * 129,
                                  "/messages/no-such-id", "/messages/%2F%25%22%3Cscript%3E"])
def test_bad_addresses_get_a_404_page(console, path):
    status, headers, text = request(console.url, path)
    assert status == 404, text
    assert "Traceback" not in text and headers["content-type"].startswith("text/html")


def test_pages_say_when_postgresql_cannot_be_reached(tmp_path):
    c = Console(tmp_path, env=clean_env(CHRONOS_DATABASE_URL="postgresql://chronos@127.0.0.1:1/chronos"))
    try:
        status, _, text = request(c.url, "/")
        assert status == 200 and "cannot connect to PostgreSQL at postgresql://chronos@127.0.0.1:1/chronos" in text
        assert 'id="store-error" >' in text  # shown, not hidden
        status, _, text = request(c.url, "/schedules")
        assert status == 200 and "PostgreSQL: cannot connect to PostgreSQL" in text and "Traceback" not in text
    finally:
        c.stop()


def test_a_bad_search_is_a_400_page_and_an_action_without_a_session_is_refused(console):
    status, _, text = request(console.url, "/messages?state=sleeping")
    assert status == 400 and "unknown state &#39;sleeping&#39;" in text
    status, _, text = request(console.url, "/messages?limit=0")
    assert status == 400 and "limit must be between 1 and 500" in text
    form = urllib.parse.urlencode({"action": "cancel", "id_prefix": "", "expected": "1"})
    status, _, text = request(console.url, "/actions/apply", "POST", form,
                              {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 403 and "Sign in with the console token first." in text


FORM = {"Content-Type": "application/x-www-form-urlencoded"}
OUT = "chronos.output"


@pytest.fixture
def store(database_url):
    s = Store(database_url, node_id=uuid.uuid4())
    yield s
    s.close()


def far(store: Store, *ids: str, key: bytes = b"k") -> None:
    deadline = time.time_ns() // 1000 + 86_400_000_000
    store.insert([Row(i, deadline + n, None, key, b"v", codec.encode_headers([])) for n, i in enumerate(ids)])


def present(store: Store, *ids: str) -> list[str]:
    return [i for i in ids if store.show(i, output_topic=OUT) is not None]


def sign_in(url: str) -> tuple[str, str]:
    """A fresh session: its cookie header and the form token its pages carry."""
    status, headers, _ = request(url, "/login", "POST", urllib.parse.urlencode({"token": TOKEN}), FORM)
    assert status == 303
    cookie = headers["set-cookie"].split(";")[0]
    status, _, text = request(url, "/messages?id_prefix=m", headers={"Cookie": cookie})
    assert status == 200
    return cookie, re.search(r'name="form_token" value="([^"]+)"', text).group(1)


def post(url: str, path: str, fields: dict, cookie: str | None = None, **headers: str) -> tuple[int, str]:
    extra = {**FORM, **({"Cookie": cookie} if cookie else {}), **{k.replace("_", "-"): v for k, v in headers.items()}}
    status, _, text = request(url, path, "POST", urllib.parse.urlencode(fields), extra)
    assert "Traceback" not in text
    return status, text


def test_actions_need_a_session_its_form_token_and_the_consoles_own_origin(console, store):
    far(store, "m1", "m2")
    cookie, token = sign_in(console.url)
    other_cookie, other_token = sign_in(console.url)
    origin = console.url.rstrip("/")
    cancel = {"action": "cancel", "id": "m1", "expected": "1"}
    forged_cookie = "chronos_console=" + "A" * 24 + "." + "0" * 64
    refusals = [
        ({**cancel, "form_token": token}, None, {}, "Sign in with the console token first."),
        ({**cancel, "form_token": token}, forged_cookie, {}, "Sign in with the console token first."),
        (cancel, cookie, {}, "The form is stale or forged"),
        ({**cancel, "form_token": other_token}, cookie, {}, "The form is stale or forged"),
        ({**cancel, "form_token": token}, cookie, {"Origin": "http://evil.example"}, "did not come from"),
        ({**cancel, "form_token": token}, cookie, {"Origin": "null"}, "did not come from"),
        ({**cancel, "form_token": token}, cookie, {"Sec_Fetch_Site": "cross-site", "Origin": origin},
         "did not come from"),
        ({**cancel, "form_token": token}, cookie, {"Sec_Fetch_Site": "same-site"}, "did not come from"),
    ]
    for path in ("/actions/preview", "/actions/apply"):
        for fields, jar, headers, why in refusals:
            status, text = post(console.url, path, fields, jar, **headers)
            assert status == 403 and why in text, (path, fields, jar, headers, text[-400:])
    assert present(store, "m1", "m2") == ["m1", "m2"]
    # the same request from the console's own page goes through
    same = {"Origin": origin, "Sec_Fetch_Site": "same-origin"}
    status, text = post(console.url, "/actions/preview", {**cancel, "form_token": token}, cookie, **same)
    assert status == 200 and "This will cancel <b>1</b> message." in text
    assert present(store, "m1") == ["m1"]  # the preview changed nothing
    status, text = post(console.url, "/actions/apply", {**cancel, "form_token": token}, cookie, **same)
    assert status == 200 and "1 message cancelled." in text
    assert present(store, "m1", "m2") == ["m2"]
    assert store.action_totals()["cancel"] == (1, 1)


def test_a_read_only_console_refuses_every_action(database_url, store, tmp_path):
    far(store, "m1")
    c = Console(tmp_path, env=clean_env(CHRONOS_DATABASE_URL=database_url))
    try:
        for path in ("/actions/preview", "/actions/apply"):
            status, text = post(c.url, path, {"action": "cancel", "id": "m1", "expected": "1"},
                                Origin=c.url.rstrip("/"))
            assert status == 403 and "This console is read-only" in text
        assert request(c.url, "/login", "POST", "token=x", FORM)[0] == 403
    finally:
        c.stop()
    assert present(store, "m1") == ["m1"]


BAD_ACTIONS = [
    ({"action": "reschedule", "id": "m1", "delay": "soon"}, "is not a duration like 500ms"),
    ({"action": "reschedule", "id": "m1", "delay": "-5m"}, "must not be negative"),
    ({"action": "reschedule", "id": "m1", "at": "2030-01-01", "delay": "5m"}, "(one of them)"),
    ({"action": "reschedule", "id": "m1", "at": "next tuesday"}, "new deadline is neither ISO-8601 nor relative"),
    ({"action": "explode", "id": "m1"}, "unknown action &#39;explode&#39;"),
    ({"action": "cancel"}, "an action on a search needs at least one filter"),
    ({"action": "cancel", "key": "hex:zz"}, "is not hex after"),
    ({"action": "cancel", "state": "asleep"}, "unknown state &#39;asleep&#39;"),
    ({"action": "cancel", "due_after": "2h", "due_before": "1h"}, "must be before"),
]


def test_bad_action_input_is_a_clear_400_page_and_changes_nothing(console, store):
    far(store, "m1")
    cookie, token = sign_in(console.url)
    for fields, why in BAD_ACTIONS:
        for path in ("/actions/preview", "/actions/apply"):
            status, text = post(console.url, path, {**fields, "form_token": token, "expected": "1"}, cookie)
            assert status == 400 and why in text, (fields, path, text[-400:])
    status, text = post(console.url, "/actions/apply", {"action": "cancel", "id": "m1", "form_token": token},
                        cookie)
    assert status == 400 and "the confirmation form is incomplete" in text
    assert present(store, "m1") == ["m1"]


BAD_SEARCHES = [
    ("after=not-a-cursor", "is not a cursor printed by"),
    ("key=hex:0g", "is not hex after"),
    ("due_after=tomorrow", "due after is neither ISO-8601 nor relative"),
    ("due_after=2h&due_before=1h", "must be before"),
    ("id_prefix=m&after=WyJkIiwxLDJd", "a cursor of a listing with other filters"),
    ("limit=ten", "limit must be a whole number"),
]


def test_a_malformed_filter_is_a_clear_400_page(console):
    for query, why in BAD_SEARCHES:
        status, _, text = request(console.url, "/messages?" + query)
        assert status == 400 and why in text and "Traceback" not in text, (query, text[-400:])
        assert 'id="search"' in text  # the search form is still there to fix it


def test_more_than_confirm_above_needs_the_count_typed_and_a_grown_match_changes_nothing(console, store):
    far(store, "m1", "m2", "m3", key=b"three")
    cookie, token = sign_in(console.url)
    search = {"action": "cancel", "key": "three", "form_token": token}
    status, text = post(console.url, "/actions/preview", search, cookie)
    assert status == 200 and "This will cancel <b>3</b> messages." in text and 'name="typed"' in text
    status, text = post(console.url, "/actions/apply", {**search, "expected": "3"}, cookie)
    assert status == 400 and "(CHRONOS_CONFIRM_ABOVE): type the count, 3, to confirm" in text
    assert present(store, "m1", "m2", "m3") == ["m1", "m2", "m3"]
    # confirmed for 2, but 3 match by now: nothing changes
    status, text = post(console.url, "/actions/apply", {**search, "expected": "2"}, cookie)
    assert status == 409 and "nothing was changed" in text
    assert present(store, "m1", "m2", "m3") == ["m1", "m2", "m3"]
    status, text = post(console.url, "/actions/apply", {**search, "expected": "3", "typed": "3"}, cookie)
    assert status == 200 and "3 messages cancelled." in text
    assert present(store, "m1", "m2", "m3") == []


def test_message_page_shows_failed_publishes_and_the_parked_page_lists_parked_messages(console, store):
    store.insert([Row("retried", time.time_ns() // 1000 - 1000, None, b"k", b"v", codec.encode_headers([]))])
    (claimed,) = store.claim(10, 0)
    store.retry_later([(claimed, "publish_failed: <b>denied</b>", 60_000)])
    status, _, text = request(console.url, "/messages/retried")
    assert status == 200 and "1, last: publish_failed: &lt;b&gt;denied&lt;/b&gt;" in text
    assert "scheduled for" in text
    store.park([Parked(f"p{i}", f"chronos.input/0/{i}", "out", None, b"k", b"<script>x</script>",
                       codec.encode_headers([]), "message_too_large: no topic took it") for i in range(51)])
    status, _, text = request(console.url, "/parked")
    assert status == 200 and text.count("message_too_large: no topic took it") == 50
    assert "&lt;script&gt;x&lt;/script&gt;" in text and "<script>x" not in text
    older = re.search(r'href="(/parked\?before=\d+)"', text).group(1)
    status, _, text = request(console.url, older)
    assert status == 200 and text.count("message_too_large") == 1 and ">p0<" in text
    assert request(console.url, "/parked?before=x")[0] == 400
    status, _, text = request(console.url, "/api/overview")
    assert '"parked":"51"' in text


def test_search_pages_follow_the_cursor_of_chronos_list(console, store):
    far(store, "m1", "m2", "m3", "x1")
    ids = re.compile(r'<td class="id"><a href="/messages/([^"]+)">')
    status, _, text = request(console.url, "/messages?id_prefix=m&limit=2")
    assert status == 200 and ids.findall(text) == ["m1", "m2"]
    following = re.search(r'href="(/messages\?[^"]+)" id="next-page"', text).group(1).replace("&amp;", "&")
    status, _, text = request(console.url, following)
    assert status == 200 and ids.findall(text) == ["m3"] and 'id="next-page"' not in text


def test_the_overview_shows_the_backlog_a_fire_rate_limit_holds_back(console, store, database_url):
    import orjson
    import psycopg
    due = time.time_ns() // 1000 - 5_000_000
    store.insert([Row(f"slow-{i}", due + i, "slow.topic", b"k", b"v", codec.encode_headers([])) for i in range(3)])
    with psycopg.connect(database_url, autocommit=True) as conn:
        # the bucket a firer limiting slow.topic to 2/s keeps (chronos.domain.ratelimit): empty now
        conn.execute("INSERT INTO chronos_rate_limits (topic, rate, tokens, refilled_at) "
                     "VALUES ('slow.topic', 2, 0, now())")
    status, _, text = request(console.url, "/api/overview")
    assert status == 200
    ((topic, limit, rows, late),) = orjson.loads(text)["throttled"]
    assert (topic, limit, rows) == ("slow.topic", "2/s", "3") and late.endswith(" s")
    status, _, text = request(console.url, "/")
    assert status == 200 and "<td>slow.topic</td><td>2/s</td><td>3</td>" in text


def test_fire_now_and_a_reschedule_by_delay_from_a_message_page(console, store):
    from datetime import datetime, timedelta, timezone
    far(store, "m1", "m2")
    cookie, token = sign_in(console.url)
    before = datetime.now(timezone.utc)
    for fields in ({"action": "fire_now", "id": "m1"}, {"action": "reschedule", "id": "m2", "delay": "2h"}):
        status, text = post(console.url, "/actions/preview", {**fields, "form_token": token}, cookie)
        assert status == 200 and "<b>1</b> message" in text
        # the confirmation carries the time it showed, not the delay: confirming later changes nothing
        confirm = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', text))
        status, text = post(console.url, "/actions/apply", confirm, cookie)
        assert status == 200 and "1 message " in text
    fired, moved = (store.show(i, output_topic=OUT) for i in ("m1", "m2"))
    assert fired.deadline <= datetime.now(timezone.utc)
    assert before + timedelta(hours=2) <= moved.deadline <= datetime.now(timezone.utc) + timedelta(hours=2)
    assert {a: n for a, (n, _) in store.action_totals().items()} == {"fire_now": 1, "reschedule": 1}
