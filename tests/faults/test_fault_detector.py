"""Scenario 3: SIGKILL the detector (together with a firer), with two detectors running at once."""

from __future__ import annotations

import time

import pytest

from kits.faults import Scenario
from test_fault_firer import HOLD_S, finish_after_firer_kills, wait_handed_back

pytestmark = [pytest.mark.faults, pytest.mark.slow]

DETECTORS = ("detector_00", "detector_01")


def test_detector_sigkilled_and_two_detectors(tmp_path, fault_report):
    with Scenario("3 detector SIGKILL, 2 detectors", tmp_path, "--firers", "2", "--detectors", "2", "--firer-claim", "stamp",
                  hold_s=HOLD_S) as sc:
        time.sleep(4)
        kills = []
        for detector, firer in (("detector_00", "firer_00"), ("detector_01", "firer_01")):
            # the detector dies with the firer: the other detector must hand the firer's rows back
            pid, at = sc.stack.kill_program(detector)
            f = sc.fault(f"SIGKILL {detector}", at)
            kills.append(sc.kill_firer(firer))
            _, f.back_running = sc.stack.wait_running(detector, not_pid=pid)
            wait_handed_back(sc, kills[-1], DETECTORS)
        pid, at = sc.stack.kill_program("detector_00")  # and alone, while nothing is stale
        sc.fault("SIGKILL detector_00", at).back_running = sc.stack.wait_running("detector_00", not_pid=pid)[1]
        # two detectors at once: every held row was handed back exactly once, by one of them
        finish_after_firer_kills(sc, kills, fault_report, DETECTORS)
