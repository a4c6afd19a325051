"""What `chronos up` keeps watching on its embedded broker: its memory, the messages it holds, and
what a restart of it loses.

The embedded broker keeps every message in memory and never frees one, so `chronos up` samples
it every few seconds (`BrokerWatch.tick`): its resident memory from /proc, the messages it holds
on all topics and the input messages the consumer group has not read yet (from offsets, see
`chronos.adapters.kafka.admin.OffsetReader`). It writes each sample to a small JSON file (the
stats file) that the detector exports as gauges and `chronos status` shows, warns once the memory
passes a threshold, and, when the broker died, says from the last sample what was lost with it:
a dead broker cannot be asked.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import orjson

from chronos.adapters.kafka.brokerstats import rss_bytes
from chronos.errors import UnavailableError

log = logging.getLogger("chronos.up")

SAMPLE_EVERY_S = 5.0
WARN_CAP_BYTES = 2 * 1024 ** 3
# once warned, warn again only when the memory has grown this much further
WARN_AGAIN_FACTOR = 1.5


def machine_memory_bytes() -> int | None:
    """The machine's memory (Linux /proc/meminfo), None when unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def default_warning_bytes(machine: int | None) -> int:
    """The memory above which the broker is worth a warning: 2 GiB, or half the machine's memory
    when that is less (the OOM killer would come first)."""
    return WARN_CAP_BYTES if machine is None else min(WARN_CAP_BYTES, machine // 2)


class Offsets(Protocol):
    """What a sample needs from the broker (an `OffsetReader`'s result)."""

    exact: bool

    @property
    def messages(self) -> int: ...

    def unread(self, topic: str) -> int: ...


@dataclass
class BrokerStats:
    """The stats file's contents. `sampled_at`: unix time of the last sample of the offsets (None
    before the first one); `input_unread`: input messages past the consumer group's committed
    offsets then; `exact`: every end offset was known exactly (else the counts are lower bounds);
    `lost_input`: input messages not yet read that restarts lost, all restarts together."""

    pid: int | None = None
    port: int | None = None
    rss_bytes: int | None = None
    messages: int | None = None
    input_unread: int | None = None
    exact: bool = True
    sampled_at: float | None = None
    restarts: int = 0
    lost_input: int = 0
    last_restart: dict[str, Any] | None = None
    warning_bytes: int = 0


def loss_line(pid: int | None, how: str, port: int, stats: BrokerStats, now: float) -> str:
    """What to say when the broker (pid `pid`) died (`how`) and runs again on `port`: what it lost,
    from the last sample in `stats`."""
    head = (f"the embedded broker (pid {pid}) stopped unexpectedly ({how}); started again on port {port}; "
            "it kept messages in memory only: ")
    if stats.sampled_at is None or stats.input_unread is None:
        lost = "how many input messages not yet read by the consumer group were lost is unknown (never sampled)"
    else:
        about = "about" if stats.exact else "at least"
        seen = time.strftime("%H:%M:%S", time.localtime(stats.sampled_at))
        lost = (f"{about} {stats.input_unread:,} input messages not yet read by the consumer group were lost "
                f"(last seen {seen}, {now - stats.sampled_at:.0f}s before; {stats.messages or 0:,} messages on "
                "all its topics, read or not, are gone)")
    return head + lost + "; messages waiting in PostgreSQL are safe and fire as the programs start again"


@dataclass
class BrokerWatch:
    """Samples the embedded broker now and then, keeps the last sample, writes the stats file.

    `reader` makes an offset reader (`read()`, `close()`) for the broker; `say` prints and logs a
    line for the operator.
    """

    path: Path
    input_topic: str
    reader: Callable[[], Any]
    say: Callable[[str], None]
    warning_bytes: int
    every_s: float = SAMPLE_EVERY_S
    stats: BrokerStats = field(default_factory=BrokerStats)
    next_at: float = 0.0
    warned_at: int = 0
    _reader: Any = None

    def __post_init__(self) -> None:
        self.stats.warning_bytes = self.warning_bytes

    def started(self, pid: int | None, port: int) -> None:
        """The broker runs (again) as `pid` on `port`: it holds nothing yet."""
        self.stats.pid, self.stats.port = pid, port
        self.stats.messages = self.stats.input_unread = None
        self.stats.sampled_at, self.stats.exact = None, True
        self.warned_at = 0
        self.next_at = 0.0
        self.write()

    def tick(self, now: float) -> None:
        """Sample if it is time (`now`: time.monotonic())."""
        if now < self.next_at:
            return
        self.next_at = now + self.every_s
        self.sample()

    def sample(self) -> None:
        """Read the broker's memory and offsets now and write the stats file. A broker that does not
        answer keeps the previous offsets (the last known ones are what a restart reports)."""
        if self.stats.pid is not None:
            self.stats.rss_bytes = rss_bytes(self.stats.pid)
        try:
            if self._reader is None:
                self._reader = self.reader()
            offsets = self._reader.read()
        except UnavailableError as exc:
            log.info("cannot sample the embedded broker's offsets: %s", exc)
        else:
            self.record(offsets, time.time())
        self.check_memory()
        self.write()

    def record(self, offsets: Offsets, at: float) -> None:
        self.stats.messages = offsets.messages
        self.stats.input_unread = offsets.unread(self.input_topic)
        self.stats.exact = offsets.exact
        self.stats.sampled_at = at

    def check_memory(self) -> None:
        """Warn when the memory passes the threshold, and again each time it grows by half as much again."""
        rss = self.stats.rss_bytes
        if rss is None or rss < self.warning_bytes or rss < self.warned_at * WARN_AGAIN_FACTOR:
            return
        self.warned_at = rss
        held = f" holding {self.stats.messages:,} messages" if self.stats.messages is not None else ""
        self.say(f"warning: the embedded broker (pid {self.stats.pid}) uses {rss / 2 ** 20:,.0f} MB of memory{held}, "
                 f"above the warning threshold of {self.warning_bytes / 2 ** 20:,.0f} MB; it keeps every message in "
                 "memory and frees none: plan a restart of chronos up at a quiet moment (it loses the messages "
                 "held, read or not), or run against a real Kafka cluster (--bootstrap-servers)")

    def restarted(self, old_pid: int | None, how: str, new_pid: int | None, port: int, now: float) -> str:
        """Count a restart of the broker and what it lost; the line to say."""
        line = loss_line(old_pid, how, port, self.stats, now)
        lost = self.stats.input_unread or 0
        self.stats.restarts += 1
        self.stats.lost_input += lost
        self.stats.last_restart = {"at": now, "old_pid": old_pid, "how": how, "lost_input": lost,
                                   "lost_exact": self.stats.exact and self.stats.sampled_at is not None,
                                   "last_sampled_at": self.stats.sampled_at}
        self.started(new_pid, port)
        return line

    def write(self) -> None:
        """Replace the stats file atomically (readers never see half of it)."""
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_bytes(orjson.dumps(asdict(self.stats)))
        os.replace(tmp, self.path)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self.path.unlink(missing_ok=True)
