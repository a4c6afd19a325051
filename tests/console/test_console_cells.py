"""The console over several cells, through plain HTTP: the overview's totals and its table of cells, the messages
of every cell with the cell of each, a message's cell, an action across the cells counted in each, the schedules
and the parked messages of every cell (each named CELL#NUMBER) with a replay or drop in its cell.

A real `chronos console` with CHRONOS_CELLS, over two fresh databases of the session's PostgreSQL."""

from __future__ import annotations

import re
import time
import uuid

import orjson
import pytest

from chronos import codec
from chronos.adapters.postgres.store import Store
from chronos.domain.model import Parked, Row
from kits.stack import clean_env
from consolekit import TOKEN, Console
from test_console_http import post, request, sign_in

OUT = "chronos.output"


@pytest.fixture
def cells(two_cells):
    stores = {cell: Store(url, node_id=uuid.uuid4()) for cell, url in two_cells.items()}
    for cell, share in (("a", [0, 1]), ("b", [2, 3])):
        stores[cell].open_partitions(share, 1)
    yield stores
    for store in stores.values():
        store.close()


@pytest.fixture
def console(two_cells, tmp_path):
    c = Console(tmp_path, env=clean_env(CHRONOS_CELLS=" ".join(f"{cell}={url}" for cell, url in two_cells.items()),
                                        CHRONOS_CONSOLE_TOKEN=TOKEN))
    yield c
    c.stop()


def far(store: Store, *ids: str, hours: int = 24, cron: str | None = None) -> None:
    deadline = time.time_ns() // 1000 + hours * 3_600_000_000
    store.insert([Row(i, deadline + n, None, b"k", b"v", codec.encode_headers([]), cron=cron)
                  for n, i in enumerate(ids)])


def park(store: Store, mid: str) -> None:
    store.park([Parked(mid, f"store/{mid}", OUT, None, b"k", mid.encode(), codec.encode_headers([]),
                       "too_large: MSG_SIZE_TOO_LARGE: too large")])


def test_every_page_covers_every_cell_and_names_the_cell_of_each_thing(console, cells):
    far(cells["a"], "m-a1", "m-a2")
    far(cells["b"], "m-b1", hours=12)
    far(cells["b"], "tick-b", hours=1, cron="0 * * * *")
    park(cells["a"], "p-a")
    park(cells["b"], "p-b")
    # the overview: the totals, and each cell's own figures with its partitions
    live = orjson.loads(request(console.url, "/api/overview")[2])
    assert live["store"]["waiting"] == 3 and live["display"]["cells_note"] == "2 cells"  # a schedule is not waiting
    assert [row[:3] for row in live["cells"]] == [["a", "0-1", "2"], ["b", "2-3", "1"]]
    status, _, text = request(console.url, "/")
    assert status == 200 and 'id="cells"' in text and "<td>2-3</td>" in text
    # the messages of every cell, in deadline order, each with its cell
    status, _, text = request(console.url, "/messages?id_prefix=m-")
    assert status == 200
    assert re.findall(r'>(m-\w+)</a></td>\s*<td class="cell">(\w)</td>', text) == [
        ("m-a1", "a"), ("m-a2", "a"), ("m-b1", "b")]
    status, _, text = request(console.url, "/messages/m-b1")
    assert status == 200 and re.search(r"<dt>cell</dt><dd>b</dd>", text)
    # the schedules, each with its cell
    status, _, text = request(console.url, "/schedules")
    assert status == 200 and re.search(r'tick-b</td>\s*<td class="cell">b</td>', text)
    # the parked messages of both cells, each named with its cell, and one of them shown
    status, _, text = request(console.url, "/parked")
    assert status == 200 and sorted(re.findall(r'href="/parked/(\w)/(\d+)">(\w#\d+)</a>', text)) == [
        ("a", "1", "a#1"), ("b", "1", "b#1")]
    status, _, text = request(console.url, "/parked/b/1")
    assert status == 200 and '<dd id="cell">b</dd>' in text and "p-b" in text
    assert request(console.url, "/parked/c/1")[0] == 404


def test_an_action_acts_in_every_cell_and_says_what_it_did_in_each(console, cells):
    far(cells["a"], "m-a1", "m-a2")
    far(cells["b"], "m-b1")
    park(cells["a"], "p-a")
    park(cells["b"], "p-b")
    cookie, token = sign_in(console.url)
    cancel = {"action": "cancel", "id_prefix": "m-", "form_token": token}
    status, text = post(console.url, "/actions/preview", cancel, cookie)
    assert status == 200 and "This will cancel <b>3</b> messages." in text
    assert "By cell, would change: a 2, b 1." in text
    status, text = post(console.url, "/actions/apply", {**cancel, "expected": "3"}, cookie)
    assert status == 200 and "By cell, cancelled: a 2, b 1." in text
    assert [store.action_totals()["cancel"] for store in cells.values()] == [(1, 2), (1, 1)]
    assert all(store.show(i, output_topic=OUT) is None for store in cells.values() for i in ("m-a1", "m-b1"))
    # a parked message named with its cell is dropped in that cell only
    drop = {"action": "drop", "number": "b#1", "form_token": token}
    status, text = post(console.url, "/parked/actions/preview", drop, cookie)
    assert status == 200 and "This will drop <b>1</b> parked message." in text
    status, text = post(console.url, "/parked/actions/apply", {**drop, "expected": "1"}, cookie)
    assert status == 200 and "By cell, dropped: a 0, b 1." in text
    assert [len(store.list_parked(limit=10)) for store in cells.values()] == [1, 0]
    status, text = post(console.url, "/parked/actions/preview", {**drop, "number": "1"}, cookie)
    assert status == 400 and "with cells a parked message is CELL#NUMBER" in text


@pytest.mark.browser
def test_the_overview_in_a_browser_shows_each_cell_and_follows_them_live(console, cells, page):
    far(cells["a"], "m-a1")
    page.goto(console.url)
    rows = page.locator("#cells tbody tr")
    assert rows.count() == 2
    assert rows.nth(0).inner_text().split("\t")[:3] == ["a", "0-1", "1"]
    assert rows.nth(1).inner_text().split("\t")[:3] == ["b", "2-3", "0"]
    assert page.locator("[data-field=cells_note]").inner_text() == "2 cells"
    # a message written to cell b shows in its row and in the totals, without reloading the page
    far(cells["b"], "m-b1", "m-b2")
    page.wait_for_function("() => document.querySelector('#cells tbody tr:nth-child(2) td:nth-child(3)')"
                           ".textContent === '2'", timeout=30000)
    assert page.locator("[data-field=waiting]").inner_text() == "3"
