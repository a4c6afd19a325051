"""A benchmark's run stops its stack however it ends: done, failed, interrupted by Ctrl-C, or sent SIGTERM
by the script that drives it (which once left a stack and its load running for minutes)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from types import SimpleNamespace

import pytest

from kits import stack as stack_module
from kits.stack import ChronosOnPostgres, StackFailed, run_on
from benchmarks.harness.targets import ChronosTarget


class FakeStack:
    starting = "starting the fake stack"

    def __init__(self):
        self.stopped: list[bool] = []

    def start(self) -> dict:
        return {"ready": True}

    def stop(self, keep: bool = False) -> None:
        self.stopped.append(keep)


def test_a_finished_run_returns_its_result_and_removes_the_stack():
    stack = FakeStack()
    assert run_on(stack, lambda info: info["ready"]) == (0, True)
    assert stack.stopped == [False]


def test_a_failed_stack_is_kept_for_a_look():
    stack = FakeStack()

    def fails(info):
        raise StackFailed("the consumer exited")
    assert run_on(stack, fails) == (3, None)
    assert stack.stopped == [True]


def test_a_sigterm_stops_the_stack_as_ctrl_c_does_and_the_handler_before_is_back():
    stack = FakeStack()
    before = signal.getsignal(signal.SIGTERM)
    reached = []

    def terminated_midway(info):
        os.kill(os.getpid(), signal.SIGTERM)
        reached.append("after the signal")  # not reached: the signal interrupts the run

    assert run_on(stack, terminated_midway) == (130, None)
    assert stack.stopped == [True] and reached == []
    assert signal.getsignal(signal.SIGTERM) is before


# -- `chronos up` on a PostgreSQL of its own (the longevity benchmark's aged database) ---------------

class FakePostgres:
    def __init__(self, log: list):
        self.log = log

    def start(self) -> dict:
        self.log.append("postgres start")
        return {"database_url": "postgresql://bench/db", "postgres_pid": 4242}

    def check_alive(self) -> None:
        pass

    def stop(self, keep: bool = False) -> None:
        self.log.append(f"postgres stop keep={keep}")


class FakeChronos:
    def __init__(self, log: list, *args: str):
        self.log, self.args = log, args

    def start(self) -> dict:
        self.log.append(f"chronos start {' '.join(self.args)}")
        return {"database_url": self.args[1], "broker_pid": 7}

    def check_alive(self) -> None:
        pass

    def halt(self) -> bool:
        self.log.append("chronos halt")
        return True

    def stop(self, keep: bool = False) -> None:
        self.log.append(f"chronos stop keep={keep}")
        if "--fail-to-stop" in self.args:
            raise RuntimeError("chronos up did not stop")


def on_postgres(monkeypatch, *args: str) -> tuple[ChronosOnPostgres, list]:
    log: list = []
    monkeypatch.setattr(stack_module, "OwnPostgres", lambda: FakePostgres(log))
    monkeypatch.setattr(stack_module, "ChronosUp", lambda *a: FakeChronos(log, *a))
    return ChronosOnPostgres(*args), log


def test_renewing_the_stack_restarts_chronos_and_its_broker_on_the_same_running_postgresql(monkeypatch):
    stack, log = on_postgres(monkeypatch, "--firers", "2")
    info = stack.start()
    assert info == {"database_url": "postgresql://bench/db", "broker_pid": 7, "postgres_pid": 4242}
    assert stack.renew()["postgres_pid"] == 4242
    assert log == ["postgres start", "chronos start --database-url postgresql://bench/db --firers 2",
                   "chronos halt", "chronos start --database-url postgresql://bench/db --firers 2"]


def test_a_halt_leaves_the_stack_s_directory_for_the_next_start_without_a_word(tmp_path, capsys):
    """A renewal halts `chronos up` (its directory is the next start's): nothing said of keeping it, which
    `stop(keep=True)` says for a look at the logs."""
    import subprocess
    from kits.stack import ChronosUp
    up = ChronosUp(workdir=tmp_path)
    up.proc = subprocess.Popen(["sleep", "60"])
    assert up.halt(timeout=10) and up.proc.returncode == -signal.SIGTERM
    assert tmp_path.is_dir() and capsys.readouterr().out == ""
    up.owned = True  # a directory of its own, kept for a look at its logs
    up.stop(keep=True)
    assert tmp_path.is_dir() and "kept in" in capsys.readouterr().out


def test_a_sigterm_stops_chronos_and_then_its_postgresql_even_when_chronos_fails_to_stop(monkeypatch):
    stack, log = on_postgres(monkeypatch, "--fail-to-stop")

    def terminated_midway(info):
        os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(RuntimeError):
        run_on(stack, terminated_midway)
    assert log[-2:] == ["chronos stop keep=True", "postgres stop keep=True"]


def test_a_step_s_load_generator_and_helpers_are_ended_with_the_benchmark_that_spawned_them():
    """Daemonic: multiprocessing ends them when the benchmark exits, however its run ended (a SIGTERM's
    KeyboardInterrupt escaping a step's clean-up left the reader and the probe running)."""
    ctx = mp.get_context("spawn")
    args = SimpleNamespace(fetch_wait_ms=5, linger_ms=5, duration=1, delay=(1, 2), drain_timeout=1,
                           probe_interval_ms=25)
    target = ChronosTarget(args, {"bootstrap_servers": "127.0.0.1:9", "output_topic": "out", "input_topic": "in"})
    assert target.producer(ctx, None, None).daemon
