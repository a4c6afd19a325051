"""`chronos up`'s decisions with fakes in place of its services (chronos.up): starting a dead embedded
PostgreSQL or broker again, following supervisord's programs, the watch that ties them, its options."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import orjson
import pytest

from chronos.config import ConfigError, Settings
from chronos.embedded.procs import EmbeddedError
from chronos.adapters.kafka.brokerstats import read_stats
from chronos.embedded.watch import BrokerWatch
from chronos.errors import StackError, UnavailableError
from chronos.up import recovery
from chronos.up.command import positive_mb
from chronos.up.programs import PROGRAM_SETTLE_S, Programs
from chronos.up.stack import Options, Stack
from chronos.up.supervisor import SupervisorError

MB = 2 ** 20
COUNTS = {"consumer": 1, "firer": 1, "detector": 1}


class FlakyServer:
    """An embedded server that died (SIGKILL) and does not start at the first `failures` attempts."""

    port, pid, returncode = 9092, 111, -9

    def __init__(self, failures: int, error: Exception | None = None):
        self.failures, self.notes, self.starts = failures, [], 0
        self.error = error or EmbeddedError("port 9092 is already in use")
        self.running = False

    def start(self, timeout: float = 30.0) -> None:
        self.starts += 1
        if self.failures:
            self.failures -= 1
            raise self.error
        self.pid, self.running = 222, True

    def note(self, line: str) -> None:
        self.notes.append(line)


class NoWait:
    """A stop event that is set after `waits` waits (never, by default) and does not wait: the backoff's
    pauses take no time here."""

    def __init__(self, waits: int | None = None) -> None:
        self.waits = waits
        self.waited: list[float] = []

    def is_set(self) -> bool:
        return self.waits is not None and len(self.waited) >= self.waits

    def wait(self, timeout: float | None = None) -> bool:
        self.waited.append(timeout or 0.0)
        return self.is_set()


@dataclass
class FakeOffsets:
    messages: int
    unread_input: int
    exact: bool = True

    def unread(self, topic: str) -> int:
        return self.unread_input


class OffsetReader:
    """The broker's offsets, as its watch reads them: always the same here."""

    def read(self) -> FakeOffsets:
        return FakeOffsets(100, 7)

    def close(self) -> None:
        pass


class FakeSupervisor:
    """supervisord's answers, made up: `infos` is what getAllProcessInfo says; `down` makes every call fail."""

    def __init__(self, infos: list[dict] | None = None, down: bool = False):
        self.infos, self.down = infos or [], down
        self.calls: list[str] = []

    def _answer(self, call: str) -> None:
        self.calls.append(call)
        if self.down:
            raise SupervisorError("[Errno 2] No such file or directory")

    def programs(self) -> list[dict]:
        self._answer("programs")
        return self.infos

    def stop_all(self) -> None:
        self._answer("stop all")

    def start_group(self, group: str) -> None:
        self._answer(f"start {group}")

    def stop_group(self, group: str) -> None:
        self._answer(f"stop {group}")


def info(name: str, state: str = "RUNNING", pid: int = 100, exitstatus: int = 0, ran: float = 5.0,
         log: Path = Path("/nonexistent.log")) -> dict:
    """One program's process info as supervisord gives it."""
    return {"name": name, "group": name.rpartition("_")[0], "statename": state, "pid": pid,
            "exitstatus": exitstatus, "start": 1000.0, "now": 1000.0 + ran, "stdout_logfile": str(log)}


def programs(supervisor: FakeSupervisor, counts: dict[str, int] = COUNTS) -> Programs:
    return Programs(supervisor, counts, Path("/logs"))


# -- starting an embedded service again ------------------------------------------------------------


def test_describe_exit():
    assert recovery.describe_exit(-9) == "killed by SIGKILL"
    assert recovery.describe_exit(-200) == "killed by signal 200"
    assert recovery.describe_exit(1) == "exit code 1"


def test_a_dead_postgres_is_started_again_with_backoff(tmp_path, capsys):
    pg, stopping = FlakyServer(failures=3), NoWait()
    assert recovery.restart_postgres(pg, stopping, tmp_path / "postgres.log")
    out = capsys.readouterr().out
    assert "the embedded PostgreSQL (pid 111) stopped unexpectedly (killed by SIGKILL); starting it again on port " \
           "9092: it recovers from its write-ahead log while the programs wait and reconnect" in out
    assert out.count("the embedded PostgreSQL does not start again (port 9092 is already in use); retrying in") == 3
    assert stopping.waited == [1.0, 2.0, 4.0]
    assert "the embedded PostgreSQL runs again (pid 222) after " in out
    assert f"s; see {tmp_path / 'postgres.log'} for its recovery" in out


def test_the_backoff_between_attempts_is_capped():
    stopping = NoWait()
    assert recovery.start_again(FlakyServer(failures=8), "embedded PostgreSQL", stopping, (EmbeddedError,),
                                timeout=60)
    assert stopping.waited == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_an_error_not_retried_goes_up():
    with pytest.raises(UnavailableError):
        recovery.start_again(FlakyServer(failures=1, error=UnavailableError("no")), "embedded PostgreSQL", NoWait(),
                             (EmbeddedError,), timeout=60)


def test_asked_to_stop_while_retrying_gives_up(tmp_path, capsys):
    pg, stopping = FlakyServer(failures=10), NoWait(waits=2)
    assert not recovery.restart_postgres(pg, stopping, tmp_path / "postgres.log")
    assert pg.starts == 2 and "runs again" not in capsys.readouterr().out


def broker_watch(tmp_path: Path, said: list[str]) -> BrokerWatch:
    watch = BrokerWatch(tmp_path / "stats.json", "in", reader=OffsetReader, say=said.append, warning_bytes=MB)
    watch.record(FakeOffsets(100, 7), 1000.0)
    return watch


def test_a_dead_broker_is_started_again_with_backoff_then_its_topics_then_the_programs(tmp_path, capsys):
    broker, steps, said = FlakyServer(failures=2), [], []
    supervisor = FakeSupervisor([info("consumer_00", pid=5)])
    progs = programs(supervisor)
    watch = broker_watch(tmp_path, said)
    stopping = NoWait()
    assert recovery.restart_broker(broker, watch, progs, lambda: steps.append("topics"), stopping, said.append)
    out = capsys.readouterr().out
    assert "the embedded broker (pid 111) stopped unexpectedly (killed by SIGKILL); stopping the programs and " \
           "starting it again on port 9092" in out
    # no program runs while the broker is down and until its topics are back
    assert supervisor.calls == ["stop all", "start consumer", "start firer", "start detector", "programs"]
    assert steps == ["topics"] and broker.starts == 3
    assert out.count("the embedded broker does not start again (port 9092 is already in use); retrying in") == 2
    assert stopping.waited == [1.0, 2.0]
    assert "started again on port 9092; it kept messages in memory only: about 7 input messages" in said[-1]
    assert progs.pids == {"consumer_00": 5}
    assert read_stats(watch.path)["restarts"] == 1


def test_topics_that_cannot_be_created_are_retried_on_the_running_broker(tmp_path, capsys):
    broker, said, attempts = FlakyServer(failures=0), [], []

    def topics() -> None:
        attempts.append(1)
        if len(attempts) < 3:
            raise UnavailableError("the broker does not answer")
    assert recovery.restart_broker(broker, broker_watch(tmp_path, said), programs(FakeSupervisor()), topics, NoWait(),
                                   said.append)
    assert len(attempts) == 3
    assert capsys.readouterr().out.count("does not start again (the broker does not answer)") == 2


def test_a_broker_not_back_before_the_stop_leaves_the_programs_stopped(tmp_path):
    supervisor, said = FakeSupervisor(), []
    assert not recovery.restart_broker(FlakyServer(failures=10), broker_watch(tmp_path, said), programs(supervisor),
                                       lambda: None, NoWait(waits=1), said.append)
    assert supervisor.calls == ["stop all"] and not said


# -- the programs ------------------------------------------------------------------------------


def test_programs_are_started_once_each_has_run_a_while():
    supervisor = FakeSupervisor([info("consumer_00", pid=1), info("firer_00", pid=2, ran=PROGRAM_SETTLE_S / 2)])
    progs = programs(supervisor, {"consumer": 1, "firer": 1})
    assert not progs.started(supervisor.infos)
    supervisor.infos[1] = info("firer_00", pid=2)
    assert progs.started(supervisor.infos) and progs.pids == {"consumer_00": 1, "firer_00": 2}


def test_a_role_asked_for_none_is_stopped_and_not_waited_for():
    supervisor = FakeSupervisor([info("consumer_00", state="STOPPED", pid=0), info("firer_00", pid=2)])
    progs = programs(supervisor, {"consumer": 0, "firer": 1})
    assert progs.started(supervisor.infos)
    assert supervisor.calls == ["stop consumer"] and progs.pids == {"firer_00": 2}


def test_a_program_that_fails_at_start_is_an_error_with_its_log(tmp_path):
    log = tmp_path / "firer_00.log"
    log.write_text("one\ntwo\nthree\nfour\n")
    progs = programs(FakeSupervisor())
    with pytest.raises(StackError, match=r"program firer_00 failed \(EXITED, exit 2\): two \| three \| four"):
        progs.started([info("firer_00", state="EXITED", exitstatus=2, log=log)])


def test_waiting_for_the_programs_asks_until_they_run_and_gives_up_on_its_check():
    supervisor = FakeSupervisor(down=True)
    progs, looks = programs(supervisor), []

    def check() -> None:
        looks.append(1)
        if len(looks) == 3:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        progs.wait_started(check, sleep=lambda s: None)
    assert supervisor.calls == ["programs", "programs"]
    with pytest.raises(StackError, match="the programs did not all reach RUNNING within -1s; see /logs"):
        progs.wait_started(lambda: None, timeout=-1, sleep=lambda s: None)


def test_while_running_a_restart_is_told_and_a_final_exit_is_an_error(capsys):
    progs = programs(FakeSupervisor())
    progs.pids = {"firer_00": 2}
    progs.check([info("firer_00", pid=3)])
    assert "program firer_00 was restarted by supervisord (pid 2 -> 3); see /nonexistent.log" in capsys.readouterr().out
    assert progs.pids == {"firer_00": 3}
    progs.check([info("firer_00", state="BACKOFF", pid=0, exitstatus=1)])  # supervisord restarts it
    with pytest.raises(StackError, match=r"program firer_00 stopped for good \(EXITED, exit 4: the database is "
                                         r"not migrated\): \(no log at /nonexistent.log\)"):
        progs.check([info("firer_00", state="EXITED", pid=0, exitstatus=4)])
    with pytest.raises(StackError, match="it cannot be spawned"):
        progs.check([info("firer_00", state="FATAL", pid=0)])


def test_supervisord_not_answering_is_a_warning_when_stopping_or_starting_the_programs(caplog):
    progs = programs(FakeSupervisor(down=True))
    progs.stop_all()
    progs.start_all()
    assert [r.getMessage() for r in caplog.records] == [
        "cannot stop the programs through supervisord: [Errno 2] No such file or directory",
        "cannot start the programs through supervisord: [Errno 2] No such file or directory"]


# -- the watch ---------------------------------------------------------------------------------


@dataclass
class StopAfter:
    """The stop event of `chronos up`: set once the watch has looked `looks` times (its waits take no time)."""

    looks: int
    waited: list[float] = field(default_factory=list)

    def is_set(self) -> bool:
        return len(self.waited) > self.looks

    def wait(self, timeout: float | None = None) -> bool:
        self.waited.append(timeout or 0.0)
        return self.is_set()


def test_the_watch_starts_a_dead_postgres_again_and_rewrites_the_ready_file(tmp_path, capsys):
    ready = tmp_path / "ready.json"
    stack = Stack(Options(Settings(), tmp_path, COUNTS, ready_file=ready))
    stack.postgres = FlakyServer(failures=1)
    stack.programs = programs(FakeSupervisor([info("consumer_00")]))
    stack.watch(StopAfter(looks=3))
    assert "the embedded PostgreSQL runs again (pid 222)" in capsys.readouterr().out
    assert orjson.loads(ready.read_bytes())["postgres_pid"] == 222


def test_the_watch_starts_a_dead_broker_again_with_its_topics(tmp_path, monkeypatch, capsys):
    created = []
    monkeypatch.setattr("chronos.up.stack.create_topics", lambda bootstrap, topics, **kw: created.append(topics))
    ready = tmp_path / "ready.json"
    stack = Stack(Options(Settings(kafka_bootstrap_servers="127.0.0.1:9092"), tmp_path, COUNTS, partitions=3,
                          ready_file=ready))
    stack.broker = FlakyServer(failures=0)
    stack.broker_watch = broker_watch(tmp_path, [])
    stack.programs = programs(FakeSupervisor([info("consumer_00")]))
    stack.watch(StopAfter(looks=2))
    assert created == [{"chronos.input": 3, "chronos.output": 3, "chronos.dlq": 3}]
    assert orjson.loads(ready.read_bytes())["broker_pid"] == 222
    assert stack.broker.notes and "about 7 input messages" in stack.broker.notes[-1]


def test_the_watch_stops_on_a_program_that_stopped_for_good(tmp_path):
    stack = Stack(Options(Settings(), tmp_path, COUNTS))
    stack.programs = programs(FakeSupervisor([info("detector_00", state="EXITED", exitstatus=2)]))
    with pytest.raises(StackError, match="a configuration error"):
        stack.watch(StopAfter(looks=5))


# -- the command's options ------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "-5", "2GB", "1.5"])
def test_a_bad_memory_threshold_is_a_clear_error(value):
    with pytest.raises(ConfigError, match="must be a positive whole number of MB"):
        positive_mb(value)
    assert positive_mb("512") == 512 and positive_mb(None) is None
