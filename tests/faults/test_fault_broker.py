"""Scenario 5: pause the broker (SIGSTOP for 10 s, then SIGCONT) under load."""

from __future__ import annotations

import os
import signal
import time

import pytest

from faultchecks import check_common
from helpers import wait_for
from kits.faults import Scenario

pytestmark = [pytest.mark.faults, pytest.mark.slow]

PROGRAMS = ("consumer_00", "firer_00", "firer_01", "detector_00")
HOLD_S = 3.0


def claiming_again(firer_log: str) -> bool:
    """Whether the firer resumed its claims: at the first acknowledgement, or, once the silent producer was
    replaced (its publishes purged: none left to acknowledge), when Kafka answered the claimer's own request."""
    return "Kafka acknowledges again" in firer_log or "Kafka answers again: claiming rows" in firer_log


def test_broker_paused_10s(tmp_path, fault_report):
    with Scenario("5 broker SIGSTOP 10 s", tmp_path, "--firers", "2", hold_s=HOLD_S) as sc:
        pid = sc.info["broker_pid"]
        time.sleep(5)  # past the longest delay of the load: rows waiting and in flight when it stops
        paused = time.time()
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(10)
        finally:
            os.kill(pid, signal.SIGCONT)
        sc.fault("broker SIGSTOP 10 s", paused, end=time.time())
        # load on after the thaw, until the firers claim and publish again
        firers = ("firer_00", "firer_01")
        try:
            wait_for(lambda: all(claiming_again(sc.stack.log(name)) for name in firers), 60, "both firers claiming again")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n" + "\n".join(f"--- {name}\n{sc.stack.log(name)[-6000:]}"
                                                         for name in firers)) from None
        report = sc.finish(window_explains=True)
        fault_report(report)
        check_common(sc, report)
        for name in PROGRAMS:
            assert sc.stack.log(name).count("starting: node") == 1, sc.stack.log(name)[-3000:]
        # While Kafka does not acknowledge, the firers stop claiming: only the rows in flight when it
        # stopped answering are handed to a peer and published again, once (a consumer that lost its
        # group session may also publish a late message again).
        assert max(len(a) for a in sc.reader.arrivals.values()) <= 3
        assert report.duplicates <= sc.rate * (HOLD_S / 2 + 2), report.duplicates
        for name in ("firer_00", "firer_01"):
            log = sc.stack.log(name)
            assert "for Kafka's acknowledgement: claiming nothing" in log, log[-3000:]
