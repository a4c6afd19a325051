"""chronos.runtime.orphans with real processes: children that die with their parent, the data directory
lock, and stopping what a killed `chronos up` left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from chronos.runtime import orphans
from helpers import exited, wait_exited

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc")


PARENT = """
import signal, subprocess, sys
from chronos.runtime.orphans import child_dies_with_us
child = subprocess.Popen(["sleep", "300"], preexec_fn=child_dies_with_us(signal.SIGTERM))
print(child.pid, flush=True)
sys.stdin.read()
"""


def test_a_child_dies_with_its_parent_killed_outright():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        child = int(parent.stdout.readline())
        assert not exited(child)
        parent.kill()
        parent.wait()
        assert wait_exited(child, timeout=10.0), "the child outlived its parent"
    finally:
        parent.kill()


HOLDER = """
import sys
from pathlib import Path
from chronos.runtime.orphans import StackLock
assert StackLock(Path(sys.argv[1])).acquire()
print("held", flush=True)
sys.stdin.read()
"""


def test_the_lock_is_refused_while_its_holder_lives_and_free_once_it_is_killed(tmp_path):
    path = tmp_path / "run" / "up.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"held"
        lock = orphans.StackLock(path)
        assert not lock.acquire()
        assert lock.owner() == str(holder.pid)
        holder.kill()
        holder.wait()
        assert lock.acquire() and lock.held
        assert lock.owner() == str(os.getpid())
        lock.release()
        assert not lock.held
    finally:
        holder.kill()


def _spawn(cmd: list[str], data_dir: Path | None, **kwargs) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop(orphans.STACK_ENV, None)
    if data_dir is not None:
        env[orphans.STACK_ENV] = str(data_dir)
    return subprocess.Popen(cmd, env=env, **kwargs)


def test_leftovers_of_a_data_directory_are_found_and_stopped(tmp_path):
    data_dir = tmp_path / "data"
    stubborn = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                      "print('ignoring SIGTERM', flush=True); time.sleep(300)"]
    ours = [_spawn(["sleep", "300"], data_dir), _spawn(stubborn, data_dir, stdout=subprocess.PIPE)]
    others = [_spawn(["sleep", "300"], tmp_path / "another"), _spawn(["sleep", "300"], None)]
    try:
        assert ours[1].stdout.readline() == b"ignoring SIGTERM\n"
        found = orphans.leftovers(data_dir)
        assert {p.pid for p in found} == {p.pid for p in ours}
        assert any(str(p) == f"sleep 300 (pid {ours[0].pid})" for p in found), found
        stuck = orphans.stop_leftovers(found, data_dir, own_exit=0.2, term=1.0)
        assert stuck == []
        for p in ours:
            p.wait(5)
        assert ours[0].returncode == -signal.SIGTERM
        assert ours[1].returncode == -signal.SIGKILL  # it ignored SIGTERM
        assert all(p.poll() is None for p in others)  # not of this data directory
        assert orphans.leftovers(data_dir) == []
    finally:
        for p in ours + others:
            p.kill()
            p.wait()
