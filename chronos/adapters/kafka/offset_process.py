"""An `OffsetReader` in a process of its own, so that librdkafka crashing in it cannot take its caller down.

`chronos up` samples its embedded broker every few seconds with an `OffsetReader`, whose exact end
offsets come from fetching the last batch of every partition of every topic. When a topic is deleted
while (or shortly after) such a fetch, librdkafka 2.16 can crash its own main thread on the embedded
broker's answer (a `strcmp` on a NULL topic name in `rd_kafka_metadata_update_op`, the handling of the
leader hints a fetch response carries): in `chronos up` itself that was a SIGSEGV that took the whole
stack down, the memory-only broker and every message it held with it. Here the reader runs in a child
process (`python -m chronos.adapters.kafka.offset_process`) that answers one JSON line per `read`; if
it dies, the read is `UnavailableError` (the sample is skipped, as for a broker that does not answer),
a warning says so, and the next read starts another.

The child gets its settings on its standard input, never on its command line (they may hold
secrets), and exits when its standard input closes: with its parent.
"""

from __future__ import annotations

import logging
import select
import signal
import subprocess
import sys
from typing import Any

import orjson

from chronos.adapters.kafka.admin import BrokerOffsets, OffsetReader
from chronos.errors import UnavailableError

log = logging.getLogger("chronos.kafka")

READ = b"read\n"
ANSWER_MARGIN_S = 5.0  # beyond the reader's own timeouts: a child that answers later is stuck, and replaced


def _plain(config: dict[str, Any]) -> dict[str, Any]:
    """The client properties that go to the child: strings, numbers and booleans (callbacks stay here)."""
    return {k: v for k, v in config.items() if isinstance(v, (str, int, float, bool))}


class OffsetReaderProcess:
    """`OffsetReader`'s interface (`read()`, `close()`), the reading done in a child process."""

    def __init__(self, bootstrap: str, group: str, topic: str, extra: dict[str, Any] | None = None,
                 timeout: float = 2.0, secrets: list[str] | None = None):
        self.settings = {"bootstrap": bootstrap, "group": group, "topic": topic, "extra": _plain(extra or {}),
                         "timeout": timeout, "secrets": secrets or []}
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def _start(self) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        assert proc.stdin is not None
        proc.stdin.write(orjson.dumps(self.settings) + b"\n")
        proc.stdin.flush()
        return proc

    def read(self) -> BrokerOffsets:
        """The broker's offsets now. UnavailableError if the broker does not answer, or if the reading
        process died or hung (it is replaced at the next read)."""
        if self.proc is None:
            self.proc = self._start()
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        ready: list = [proc.stdout]
        try:
            proc.stdin.write(READ)
            proc.stdin.flush()
            # list, watermarks, the ends' fetch and the committed offsets each wait up to `timeout`
            ready, _, _ = select.select([proc.stdout], [], [], 4 * self.timeout + ANSWER_MARGIN_S)
            line = proc.stdout.readline() if ready else b""
        except OSError:  # a broken pipe: it died
            line = b""
        if not line:
            raise UnavailableError(self._lost(proc, stuck=not ready))
        answer = orjson.loads(line)
        if "unavailable" in answer:
            raise UnavailableError(answer["unavailable"])
        return BrokerOffsets(ends={(t, p): (low, high) for t, p, low, high in answer["ends"]},
                             committed={(t, p): offset for t, p, offset in answer["committed"]},
                             exact=answer["exact"])

    def _lost(self, proc: subprocess.Popen, stuck: bool) -> str:
        """Stop what is left of the child (`stuck`: it did not answer in time; else its output ended,
        it is dying); the reason a read failed, also logged as a warning."""
        self.proc = None
        try:
            code = proc.wait(timeout=0 if stuck else 2)  # a dead child's pipe closes before it can be reaped
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            how = "answered nothing in time"
        else:
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        why = f"the embedded broker's offset reader (pid {proc.pid}) {how}; another starts at the next sample"
        log.warning("%s", why)
        return why

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            assert proc.stdin is not None
            proc.stdin.close()  # the child closes its consumer and exits
            proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()


def serve() -> None:
    """The child: settings on the first line of standard input, then a JSON answer per `read` line."""
    settings = orjson.loads(sys.stdin.buffer.readline())
    out = sys.stdout.buffer
    reader = None
    try:
        for line in sys.stdin.buffer:
            if line != READ:
                continue
            try:
                if reader is None:
                    reader = OffsetReader(settings["bootstrap"], settings["group"], settings["topic"],
                                          settings["extra"], timeout=settings["timeout"], secrets=settings["secrets"])
                offsets = reader.read()
                answer: dict[str, Any] = {
                    "ends": [[t, p, low, high] for (t, p), (low, high) in offsets.ends.items()],
                    "committed": [[t, p, offset] for (t, p), offset in offsets.committed.items()],
                    "exact": offsets.exact}
            except UnavailableError as exc:
                answer = {"unavailable": str(exc)}
            except Exception as exc:  # noqa: BLE001 - said to the parent, which decides; never a silent death
                answer = {"unavailable": f"{type(exc).__name__}: {exc}"}
            out.write(orjson.dumps(answer) + b"\n")
            out.flush()
    finally:
        if reader is not None:
            reader.close()


if __name__ == "__main__":
    serve()
