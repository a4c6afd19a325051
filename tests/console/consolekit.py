"""What the console's tests share: the browser's location and flags, the token, and a
`chronos console` process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

CHROMIUM = os.environ.get("CHRONOS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TOKEN = "console-test-token-0123456789"


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
