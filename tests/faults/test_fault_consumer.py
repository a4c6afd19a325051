"""Scenario 1: SIGKILL a consumer at random moments, repeatedly, under load."""

from __future__ import annotations

import random
import time

import pytest

from kits.faults import Scenario
from faultchecks import check_common

pytestmark = [pytest.mark.faults, pytest.mark.slow]

KILLED = ("consumer_00", "consumer_01", "consumer_00")


def test_consumer_sigkilled_repeatedly(tmp_path, fault_report):
    """Each consumer, and one again once supervisord has started it anew."""
    rng = random.Random()
    with Scenario("1 consumer SIGKILL x3", tmp_path, "--consumers", "2", "--firers", "2") as sc:
        time.sleep(4)
        for name in KILLED:
            sc.stack.wait_running(name)
            time.sleep(rng.uniform(0.0, 2.0))
            sc.kill_consumer(name)
            time.sleep(rng.uniform(1.0, 4.0))
        report = sc.finish()
        fault_report(report)
        check_common(sc, report)
        log = (sc.stack.log_dir / "supervisord.log").read_text()
        assert log.count("(terminated by SIGKILL; not expected)") == len(KILLED), log
        starts = sum(sc.stack.log(n).count("consumer starting: node") for n in ("consumer_00", "consumer_01"))
        assert starts == 2 + len(KILLED)
