"""The fault-test harness on one stack: a real `chronos up`, a steady load, a reader, and the verdict.

Used by the fault scenarios (tests/faults, tests/ha), the soak run (benchmarks/soak.py) and the
PostgreSQL failures under load (benchmarks/ha.py), on the stack of kits.stack (`chronos up` as a
subprocess, its supervisord through chronos.up.supervisor): a `Scenario` starts the stack, the load and
the reader (kits.traffic), records each fault it injects (a program killed, with what it held), and
`finish` drains it and returns the verdict (kits.verdicts).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Callable

import orjson

from kits.stack import ChronosUp
from kits.traffic import Load, OffsetWatcher, Reader, held_rows
from kits.verdicts import Fault, Report, analyse, session_losses


class Scenario:
    """A stack under steady load for one fault scenario; `finish` drains it and returns the verdict."""

    def __init__(self, name: str, workdir: Path, *up_args: str, rate: float = 500, hold_s: float = 3.0,
                 partitions: int = 4, seed: int | None = None, linger_ms: int = 5, fetch_wait_ms: int = 10):
        self.name, self.rate, self.hold_s, self.partitions, self.seed = name, rate, hold_s, partitions, seed
        self.linger_ms, self.fetch_wait_ms = linger_ms, fetch_wait_ms
        self.stack = ChronosUp("--hold-time-ms", str(int(hold_s * 1000)), "--partitions", str(partitions), *up_args,
                           workdir=workdir)
        self.faults: list[Fault] = []
        self.load: Load | None = None
        self.reader: Reader | None = None
        self.offsets: OffsetWatcher | None = None

    def __enter__(self) -> "Scenario":
        try:
            info = self.stack.start()
            self.reader = Reader(info["bootstrap_servers"], info["output_topic"], self.fetch_wait_ms)
            self.reader.start()
            self.reader.wait_assigned()
            self.offsets = OffsetWatcher(info["bootstrap_servers"], "chronos", info["input_topic"], self.partitions)
            self.load = Load(info["bootstrap_servers"], info["input_topic"], rate=self.rate, seed=self.seed,
                             linger_ms=self.linger_ms)
            self.load.start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    @property
    def info(self) -> dict:
        return self.stack.info

    def fault(self, what: str, start: float, **kw) -> Fault:
        f = Fault(what, start, **kw)
        self.faults.append(f)
        return f

    def kill_consumer(self, name: str) -> Fault:
        """SIGKILL a running consumer; record the committed offsets at that moment and its restart."""
        pid, at = self.stack.kill_program(name)
        f = self.fault(f"SIGKILL {name}", at, committed=self.offsets.committed())
        _, f.back_running = self.stack.wait_running(name, not_pid=pid)
        return f

    def kill_firer(self, name: str, wait_held: float = 5.0, *, deletes: bool = False) -> Fault:
        """SIGKILL a running firer while it holds claimed rows; record those rows and its restart. A firer whose
        claims delete (`deletes`) has its batches rolled back as its connections close: what it held is read
        while it is stopped (SIGSTOP), so that it claims and commits nothing between that read and the kill."""
        pid, node = self._firer_holding(name, wait_held)
        url = self.info["database_url"]
        before = {}
        if deletes:
            os.kill(pid, signal.SIGSTOP)
            before = held_rows(url, node)
        pid, at = self.stack.kill_program(name)
        # its PostgreSQL backend may still finish a statement sent just before the kill
        time.sleep(0.5)
        f = self.fault(f"SIGKILL {name}", at, held={**before, **held_rows(url, node)}, node=node)
        _, f.back_running = self.stack.wait_running(name, not_pid=pid)
        return f

    def freeze_firer(self, name: str, until: Callable[[dict[str, float]], bool], timeout: float,
                     wait_held: float = 5.0) -> Fault:
        """SIGSTOP a running firer while it holds claimed rows, until `until(rows it held when it froze)` holds (it
        fails if that takes more than `timeout` seconds), then SIGCONT it; record the rows it held."""
        pid, node = self._firer_holding(name, wait_held)
        os.kill(pid, signal.SIGSTOP)
        at = time.time()
        try:
            held = held_rows(self.info["database_url"], node)
            end = time.monotonic() + timeout
            while not until(held):
                assert time.monotonic() < end, f"{name} frozen for {timeout:g} s, and still not so"
                time.sleep(0.05)
        finally:
            os.kill(pid, signal.SIGCONT)
        return self.fault(f"SIGSTOP {name} {time.time() - at:.0f} s", at, end=time.time(), held=held, node=node)

    def _firer_holding(self, name: str, wait_held: float) -> tuple[int, str]:
        """(pid, node) of a running firer, once it holds rows (or `wait_held` seconds went by)."""
        pid = self.stack.running(name) or self.stack.wait_running(name)[0]
        node = self.stack.node_of(name, pid)
        url = self.info["database_url"]
        end = time.monotonic() + wait_held
        while not held_rows(url, node) and time.monotonic() < end:
            time.sleep(0.02)
        return pid, node

    def lag(self) -> int:
        """Messages on the input topic past the consumer group's committed offsets (from what the load
        had acknowledged: the embedded broker's own end offsets are not reliable)."""
        ends: dict[int, int] = {}
        for s in list(self.load.sent.values()):
            ends[s.partition] = max(ends.get(s.partition, 0), s.offset + 1)
        committed = self.offsets.committed()
        return sum(max(0, end - max(committed.get(p, 0), 0)) for p, end in ends.items())

    def finish(self, *, window_explains: bool = False, settle: float = 3.0, drain: float = 30.0) -> Report:
        """Stop the load, wait for every message (at most `drain` s past the last due time), and judge."""
        assert self.load is not None and self.reader is not None
        self.load.stop()
        wait = max(0.0, self.load.last_due - time.time()) + self.hold_s + drain
        self.reader.wait_for(self.load.sent, timeout=wait)
        time.sleep(settle)  # late duplicates
        self.reader.stop()
        self.dump(self.stack.workdir / "raw.json")
        observed = session_losses(self.stack.log_dir)
        report = analyse(self.name, self.load, self.reader, self.faults + observed, hold_s=self.hold_s,
                         window_explains=window_explains)
        report.session_losses = len(observed)
        if report.lost:
            # The reader at the head of the output topic has been seen to skip a few messages that
            # are on the topic (the embedded broker's fetches; docs/operations/embedded-stack.md): what counts is the topic.
            found = self.reader.reread(set(report.lost))
            report.lost_found_on_reread = sorted(found)
            report.lost = [m for m in report.lost if m not in found]
            report.delivered += len(found)
        return report

    def dump(self, path: Path) -> None:
        """Everything sent and read, and the faults, for a look after the run."""
        path.write_bytes(orjson.dumps({
            "sent": {m: [s.deadline, s.produced, s.partition, s.offset] for m, s in self.load.sent.items()},
            "arrivals": self.reader.arrivals,
            "faults": [{"what": f.what, "start": f.start, "end": f.end, "back_running": f.back_running,
                        "held": len(f.held), "node": f.node} for f in self.faults]}))

    def __exit__(self, *exc) -> None:
        if self.load is not None and self.load.is_alive():
            self.load._halt.set()
            self.load.join(10)
        if self.reader is not None and self.reader.is_alive():
            self.reader.stop()
        if self.offsets is not None:
            self.offsets.close()
            self.offsets = None
        self.stack.stop()
