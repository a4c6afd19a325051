"""Fixtures of the console's tests: a real `chronos up` (with its console), a second, read-only
`chronos console` on the same store, and a real Chromium driven by Playwright.

The browser is Debian's `chromium` (`make test` installs it); a missing browser fails these
tests with a message saying how to install it, it never skips them.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import orjson
import pytest

CHROMIUM = os.environ.get("CHRONOS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TOKEN = "console-test-token-0123456789"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOS_")}
    env.update(extra)
    return env


def wait_for(condition, timeout: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} before {what}:\n"
                                 + (log.read_text(errors="replace") if log else ""))
        time.sleep(0.1)
    raise AssertionError(f"not {what} within {timeout}s:\n" + (log.read_text(errors="replace") if log else ""))


class Console:
    """A `chronos console` process; its URL is read from its first log line."""

    def __init__(self, workdir: Path, *args: str, env: dict[str, str]):
        self.log = workdir / f"console-{time.monotonic_ns()}.log"
        self.proc = subprocess.Popen([sys.executable, "-m", "chronos", "console", "--port", "0", *args],
                                     env=env, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT)
        match = wait_for(lambda: re.search(r"console serving on (http://\S+)", self.log.read_text()), 30,
                         "serving", self.proc, self.log)
        self.url = match.group(1) + "/"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(15)


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[dict]:
    """`chronos up` with a console token; its ready file's contents."""
    workdir = tmp_path_factory.mktemp("console-up")
    ready = workdir / "ready.json"
    out = workdir / "up.out"
    proc = subprocess.Popen([sys.executable, "-m", "chronos", "up", "--ready-file", str(ready),
                             "--console-port", "0"], cwd=workdir, stdout=open(out, "wb"),
                            stderr=subprocess.STDOUT, env=clean_env(CHRONOS_CONSOLE_TOKEN=TOKEN))
    try:
        info = wait_for(lambda: ready.exists() and orjson.loads(ready.read_bytes()), 90, "ready", proc, out)
        info["ready_file"] = str(ready)
        info["workdir"] = workdir
        yield info
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)


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
