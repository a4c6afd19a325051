"""Fixtures of the console's tests: a real `chronos up` (with its console), a second, read-only
`chronos console` on the same store, and a real Chromium driven by Playwright.

The browser is Debian's `chromium` (`make test` installs it); a missing browser fails these
tests with a message saying how to install it, it never skips them.
"""

from __future__ import annotations

import os
from typing import Iterator

import pytest

from kits.stack import ChronosUp, clean_env
from consolekit import CHROMIUM, CHROMIUM_ARGS, TOKEN, Console


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[dict]:
    """`chronos up` with a console token; its ready file's contents."""
    up = ChronosUp("--console-port", "0", workdir=tmp_path_factory.mktemp("console-up"),
               env={"CHRONOS_CONSOLE_TOKEN": TOKEN})
    try:
        info = up.start()
        info["ready_file"] = str(up.ready_file)
        info["workdir"] = up.workdir
        yield info
    finally:
        up.stop(60)


@pytest.fixture(scope="module")
def read_only_console(stack) -> Iterator[Console]:
    """A second console on the same store, without a token."""
    console = Console(stack["workdir"], "--ready-file", stack["ready_file"], env=clean_env())
    yield console
    console.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"the console's browser tests need Chromium at {CHROMIUM}: install Debian's package "
                    "(`apt-get install chromium`; `make test` does it) or set CHRONOS_CHROMIUM", pytrace=False)
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield browser
        browser.close()


@pytest.fixture
def page(browser) -> Iterator[object]:
    """A page in a fresh browser context (no cookies from another test)."""
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(15000)
    yield page
    context.close()
