"""A benchmark's run stops its stack however it ends: done, failed, interrupted by Ctrl-C, or sent SIGTERM
by the script that drives it (which once left a stack and its load running for minutes)."""

from __future__ import annotations

import os
import signal

from benchmarks.harness.stack import StackFailed, run_on


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
