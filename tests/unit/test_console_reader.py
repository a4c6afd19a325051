"""The console's store reader lends its one connection statement by statement to an action that waits
between its statements (a replay waiting on Kafka), so the pages read on meanwhile."""

from __future__ import annotations

import asyncio
import threading

import pytest

pytest.importorskip("starlette")  # the console extra, installed with the dev one


class Store:
    """Two statements; the first one's caller then waits for the page's read to have run."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def first(self) -> str:
        self.calls.append("first")
        return "first"

    def read(self) -> str:
        self.calls.append("read")
        return "read"


def test_a_page_reads_while_an_action_waits_between_its_statements():
    from chronos.console.live import StoreReader
    store = Store()
    reader = StoreReader(store, 5000, "out")
    read_done = threading.Event()

    def action(s) -> str:
        s.first()
        assert read_done.wait(10), "the page's read waited for the action"  # Kafka's answer, say
        return s.read()

    async def both() -> tuple[str, str]:
        acting = asyncio.ensure_future(reader.call_between(action))
        while store.calls != ["first"]:
            await asyncio.sleep(0.01)
        page = await asyncio.wait_for(reader.call(lambda s: s.read()), 10)
        read_done.set()
        return await acting, page
    assert asyncio.run(both()) == ("read", "read")
    assert store.calls == ["first", "read", "read"]
