"""Scenario 6: run two of every role, then remove one of each (a graceful stop, as an operator would)."""

from __future__ import annotations

import time

import pytest

from faultchecks import check_common
from helpers import wait_for
from kits.faults import Scenario

pytestmark = [pytest.mark.faults, pytest.mark.slow]

REMOVED = ("consumer_01", "firer_01", "detector_01")


def test_two_of_each_then_remove_one_of_each(tmp_path, fault_report):
    with Scenario("6 2 of each, remove 1 each", tmp_path, "--consumers", "2", "--firers", "2",
                  "--detectors", "2") as sc:
        time.sleep(5)  # past the longest delay of the load: each holds work when it is stopped
        # each has started (logged its node) before it is stopped: on a loaded machine a process can
        # take longer than the sleep to get there, and would then log nothing to check
        for name in REMOVED:
            sc.stack.wait_running(name, timeout=60)
        # and the group has settled with both consumers: every partition committed since the later one started
        # (the embedded broker's group stays without an assignment for a minute and more when a member leaves
        # during the first join)
        since = sc.offsets.committed()
        wait_for(lambda: all(o > since[p] for p, o in sc.offsets.committed().items()), 60,
                 "every partition committed with both consumers running")
        supervisor = sc.stack.supervisor()
        for name in REMOVED:
            at = time.time()
            committed = sc.offsets.committed() if name.startswith("consumer") else None
            supervisor.stop(name)
            sc.fault(f"stop {name}", at, end=time.time(), committed=committed)
        # load on the remaining one of each, until they have delivered everything sent before the stops
        before = list(sc.load.sent)
        assert not sc.reader.wait_for(before, timeout=60), "what was sent before the stops not delivered"
        report = sc.finish()
        fault_report(report)
        check_common(sc, report, stopped=REMOVED)
        assert {n: p["statename"] for n, p in sc.stack.programs().items() if n in REMOVED} == \
            dict.fromkeys(REMOVED, "STOPPED")
        # each stopped gracefully (exit 0, its closing line logged), handing its work to its peer
        assert "stopping: consumed" in sc.stack.log("consumer_01")
        assert "stopping: claimed" in sc.stack.log("firer_01")
        assert "stopping: reset" in sc.stack.log("detector_01")
        supervisord = (sc.stack.log_dir / "supervisord.log").read_text()
        for name in REMOVED:
            assert f"stopped: {name} (exit status 0)" in supervisord, supervisord
