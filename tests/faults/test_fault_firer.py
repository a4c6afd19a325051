"""Scenario 2: SIGKILL a firer between claiming and deleting; a peer re-fires its rows after the hold time."""

from __future__ import annotations

import re
import time

import pytest

from faultchecks import check_common
from kits.faults import Scenario

pytestmark = [pytest.mark.faults, pytest.mark.slow]

HOLD_S = 3.0


def reset_counts(detector_logs: str) -> dict[str, int]:
    """Rows the detectors handed back, per suspected node, from their log lines."""
    counts: dict[str, int] = {}
    for node, n in re.findall(r"suspected failure of ([0-9a-f-]{36}): (\d+) rows", detector_logs):
        counts[node] = counts.get(node, 0) + int(n)
    return counts


def check_held_rows_refired(sc: Scenario, kills) -> None:
    """Every row a killed firer held was delivered, the last time only after the hold time, by a peer."""
    arrivals = sc.reader.arrivals
    assert sum(len(f.held) for f in kills) > 0, "no firer was killed while holding rows"
    for f in kills:
        for mid, readied_at in f.held.items():
            assert mid in arrivals, f"{mid} held by the killed firer was never delivered"
            # the dead firer never deletes it: a peer publishes it after the detector resets it
            assert max(arrivals[mid]) >= readied_at + HOLD_S - 0.1, (mid, readied_at, arrivals[mid])


def finish_after_firer_kills(sc: Scenario, kills, fault_report, detectors: tuple[str, ...]) -> None:
    """The verdict of a scenario that killed firers holding rows: the common checks, every held row
    re-fired by a peer, duplicates only among the held rows (published, not yet deleted), and each
    held row handed back exactly once by one of the detectors."""
    report = sc.finish()
    fault_report(report)
    check_common(sc, report)
    check_held_rows_refired(sc, kills)
    held = set().union(*(f.held for f in kills))
    assert set(report.duplicated_ids) <= held
    counts = reset_counts("".join(sc.stack.log(d) for d in detectors))
    for f in kills:
        assert counts.get(f.node, 0) == len(f.held), (f.node, counts, len(f.held))


def test_firer_sigkilled_while_holding_rows(tmp_path, fault_report):
    with Scenario("2 firer SIGKILL x3", tmp_path, "--firers", "2", hold_s=HOLD_S) as sc:
        time.sleep(4)
        kills = []
        for name in ("firer_00", "firer_01", "firer_00"):
            kills.append(sc.kill_firer(name))
            time.sleep(HOLD_S + 4)
        finish_after_firer_kills(sc, kills, fault_report, ("detector_00",))
        supervisord = (sc.stack.log_dir / "supervisord.log").read_text()
        assert supervisord.count("exited: firer_00 (terminated by SIGKILL; not expected)") == 2
        assert supervisord.count("exited: firer_01 (terminated by SIGKILL; not expected)") == 1
