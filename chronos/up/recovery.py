"""What `chronos up` does when an embedded service dies under it: start it again on the same port,
retrying with backoff until it runs or `chronos up` is asked to stop.

An embedded PostgreSQL recovers from its write-ahead log like after any crash, while the programs
wait and reconnect. An embedded broker kept everything in memory, so the programs are stopped while
it is down, its topics are created again, and the programs are started afresh; the line it prints
says what was lost with it.

Each step takes what it acts on as an argument (the server, the programs, the stop event), so a
recovery tests with fakes.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Callable, Protocol

from chronos.embedded.procs import EmbeddedError
from chronos.embedded.watch import BrokerWatch
from chronos.errors import UnavailableError
from chronos.runtime.backoff import Backoff

# the first pause after a failed start, and the longest
RETRY_FIRST_S, RETRY_CAP_S = 1.0, 30.0


class Restartable(Protocol):
    """An embedded server that can be started again on its port (chronos.embedded's PostgreSQL and broker)."""

    @property
    def port(self) -> int: ...

    @property
    def pid(self) -> int | None: ...

    @property
    def returncode(self) -> int | None: ...

    def start(self, timeout: float = 30.0) -> None: ...


class Stopping(Protocol):
    """`chronos up` being asked to stop (a threading.Event): the pauses between attempts wait on it."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class AllPrograms(Protocol):
    """The programs under supervisord, all at once (chronos.up.programs.Programs)."""

    def stop_all(self) -> None: ...

    def start_all(self) -> None: ...


def describe_exit(code: int | None) -> str:
    """How a process ended, from its return code: "killed by SIGKILL", "exit code 1"."""
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def start_again(server: Restartable, what: str, stopping: Stopping, retry_on: tuple[type[Exception], ...],
                timeout: float, then: Callable[[], None] = lambda: None) -> bool:
    """Start `server` (then `then`) until both succeed, a line and a pause with backoff after each attempt
    that raised one of `retry_on`: True once they did, False when `stopping` came first."""
    backoff = Backoff(first=RETRY_FIRST_S, cap=RETRY_CAP_S)
    while not stopping.is_set():
        try:
            server.start(timeout=timeout)
            then()
            return True
        except retry_on as exc:
            delay = backoff.failed()
            print(f"the {what} does not start again ({exc}); retrying in {delay:.0f}s", flush=True)
            stopping.wait(delay)
    return False


def restart_postgres(pg: Restartable, stopping: Stopping, log_path: Path, cell: str = "") -> bool:
    """Start the embedded PostgreSQL (of `cell`, with cells) again on its port, retrying with backoff until it
    runs: True once it does, False when `chronos up` is asked to stop first.

    It recovers from its write-ahead log (`log_path` says how). Meanwhile the programs wait and reconnect,
    the consumer commits nothing, and the broker keeps what it holds.
    """
    how = describe_exit(pg.returncode)
    down = time.monotonic()
    what = f"embedded PostgreSQL of cell {cell}" if cell else "embedded PostgreSQL"
    print(f"the {what} (pid {pg.pid}) stopped unexpectedly ({how}); starting it again on port "
          f"{pg.port}: it recovers from its write-ahead log while the programs wait and reconnect", flush=True)
    if not start_again(pg, what, stopping, (EmbeddedError,), timeout=60):
        return False
    print(f"the {what} runs again (pid {pg.pid}) after {time.monotonic() - down:.1f}s; see "
          f"{log_path} for its recovery", flush=True)
    return True


def restart_broker(broker: Restartable, watch: BrokerWatch, programs: AllPrograms, create_topics: Callable[[], None],
                   stopping: Stopping, say: Callable[[str], None]) -> bool:
    """Start the embedded broker again on its port and recreate the topics, retrying with backoff; the
    programs are stopped meanwhile and started afresh after. True once it runs again, False when `chronos
    up` is asked to stop first.

    It kept everything in memory: topics, messages, the groups' committed offsets are gone. The line it
    `say`s tells how many input messages not yet read by the consumer group were lost, from the `watch`'s
    last sample of the offsets. The messages waiting in PostgreSQL are safe.

    The programs are restarted rather than left to reconnect because a restarted broker hands out
    idempotent producer ids again from the start: a producer that kept an id of the dead broker
    shares it with a new one, and its next message, taken for a duplicate, is acknowledged and
    stored nowhere (measured). While the broker is down they can do nothing anyway: the firer
    hands its claimed rows back as it stops.
    """
    how = describe_exit(broker.returncode)
    old_pid = broker.pid
    print(f"the embedded broker (pid {old_pid}) stopped unexpectedly ({how}); stopping the programs and "
          f"starting it again on port {broker.port}", flush=True)
    programs.stop_all()
    # start() returns at once when the broker runs and only the topics failed
    if not start_again(broker, "embedded broker", stopping, (EmbeddedError, UnavailableError), timeout=30,
                       then=create_topics):
        return False
    programs.start_all()
    say(watch.restarted(old_pid, how, broker.pid, broker.port, time.time()))
    return True
