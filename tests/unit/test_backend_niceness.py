"""Which process `niceness.lower` lowers: only the one of the number PostgreSQL gives that is a PostgreSQL process
of this host started when PostgreSQL says the session's process did; never one it would raise."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from chronos.adapters.postgres import niceness

STARTED = 1_800_000_000.0


class Conn:
    """A connection whose server says its process is 4242, started at STARTED."""

    def execute(self, query):
        assert "pg_backend_pid()" in query
        return self

    def fetchone(self):
        return (4242, STARTED)


def lowered(found, *, now: int = 0, refuse: bool = False) -> tuple[bool, list]:
    calls: list = []

    def setpriority(which, pid, value):
        if refuse:
            raise PermissionError("not permitted")
        calls.append((which, pid, value))
    done = niceness.lower(Conn(), 10, started=lambda pid: found if pid == 4242 else None,
                          setpriority=setpriority, getpriority=lambda which, pid: now)
    return done, calls


def test_the_servers_process_on_this_host_is_lowered():
    assert lowered(("postgres", STARTED + 0.4)) == (True, [(os.PRIO_PROCESS, 4242, 10)])


@pytest.mark.parametrize("found", [None, ("python3", STARTED), ("postgres", STARTED - 30.0)],
                         ids=["no such process", "not PostgreSQL", "started at another time"])
def test_a_process_that_is_not_the_sessions_server_is_left_alone(found):
    assert lowered(found) == (False, [])


def test_a_process_already_lower_is_not_raised():
    assert lowered(("postgres", STARTED), now=15) == (True, [])


def test_without_the_right_to_lower_it_nothing_changes():
    assert lowered(("postgres", STARTED), refuse=True) == (False, [])


def test_the_name_and_start_of_a_process_are_read_from_proc(tmp_path: Path):
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n")
    (tmp_path / "77").mkdir()
    rest = " ".join(["S"] + ["0"] * 18 + ["500"] + ["0"] * 10)  # the 22nd field: 500 ticks after boot
    (tmp_path / "77" / "stat").write_text(f"77 (post gres) x) {rest}\n")
    name, started = niceness.process_started(77, tmp_path)
    assert name == "post gres) x" and started == pytest.approx(1_700_000_000 + 500 / os.sysconf("SC_CLK_TCK"))
    assert niceness.process_started(78, tmp_path) is None


def test_this_process_is_found_as_started_before_now():
    found = niceness.process_started(os.getpid())
    assert found is not None and found[0].startswith(("python", "pytest")) and 0 < time.time() - found[1] < 86_400
