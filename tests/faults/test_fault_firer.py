"""Scenario 2: SIGKILL a firer between claiming and deleting; a peer re-fires its rows after the hold time (at
once, when its claims delete: PostgreSQL rolls its batches back). Scenario 2f: SIGSTOP a firer past the hold
time; a peer fires its rows, and once thawed it publishes none of them."""

from __future__ import annotations

import re
import time

import pytest

from faultchecks import check_common
from helpers import wait_for
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


def wait_handed_back(sc: Scenario, kill, detectors: tuple[str, ...]) -> None:
    """Wait until the detectors have handed back every row the killed firer held (after the hold time)."""
    wait_for(lambda: reset_counts("".join(sc.stack.log(d) for d in detectors)).get(kill.node, 0) >= len(kill.held),
             HOLD_S + 30, f"the {len(kill.held)} rows of {kill.what} handed back")


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
    with Scenario("2 firer SIGKILL x3 (stamp)", tmp_path, "--firers", "2", "--firer-claim", "stamp",
                  hold_s=HOLD_S) as sc:
        time.sleep(4)
        kills = []
        for name in ("firer_00", "firer_01", "firer_00"):
            kills.append(sc.kill_firer(name))
            wait_handed_back(sc, kills[-1], ("detector_00",))
        finish_after_firer_kills(sc, kills, fault_report, ("detector_00",))
        supervisord = (sc.stack.log_dir / "supervisord.log").read_text()
        assert supervisord.count("exited: firer_00 (terminated by SIGKILL; not expected)") == 2
        assert supervisord.count("exited: firer_01 (terminated by SIGKILL; not expected)") == 1


def test_firer_whose_claims_delete_sigkilled_while_holding_rows(tmp_path, fault_report):
    """Its rows are back as soon as PostgreSQL sees its connections close: a peer fires them, no detector
    hands anything back."""
    with Scenario("2d firer SIGKILL x2 (delete)", tmp_path, "--firers", "2", "--firer-claim", "delete",
                  hold_s=HOLD_S) as sc:
        time.sleep(4)
        kills = []
        for name in ("firer_00", "firer_01"):
            kills.append(sc.kill_firer(name, deletes=True))
            assert not sc.reader.wait_for(kills[-1].held, timeout=30), f"{name}'s rows not fired by its peer"
        report = sc.finish()
        fault_report(report)
        check_common(sc, report)
        held = set().union(*(f.held for f in kills))
        assert held, "no firer was killed while holding rows"
        assert held <= set(sc.reader.arrivals)
        assert set(report.duplicated_ids) <= held
        assert reset_counts(sc.stack.log("detector_00")) == {}


@pytest.mark.parametrize("claim", ["stamp", "delete"])
def test_firer_frozen_past_the_hold_time_publishes_nothing_once_thawed(tmp_path, fault_report, claim):
    """A firer SIGSTOPped while it holds rows, for longer than the hold time: a peer fires them (handed back by
    a detector, or, when its claims delete, by PostgreSQL ending its transactions), and once thawed the
    frozen firer publishes none of them: they were claimed too long ago. It claims a second ahead, so that
    most of what it holds was not yet due, hence not yet handed to Kafka, when it froze (what was may still
    leave once it is thawed: a duplicate the freeze explains)."""
    with Scenario(f"2f firer SIGSTOP ({claim})", tmp_path, "--firers", "2", "--firer-claim", claim,
                  "--lookahead-ms", "1000", hold_s=HOLD_S) as sc:
        time.sleep(4)
        # thawed once the peer has fired every row it held (past the hold time, or once PostgreSQL ended its
        # transactions)
        frozen = sc.freeze_firer("firer_00", lambda held: all(m in sc.reader.arrivals for m in held),
                                 timeout=HOLD_S + 20)
        wait_for(lambda: "claimed more than" in sc.stack.log("firer_00"), 30, "the thawed firer's batch given up")
        report = sc.finish()
        fault_report(report)
        check_common(sc, report)
        assert set(frozen.held) <= set(sc.reader.arrivals)
        assert set(report.duplicated_ids) <= set(frozen.held)
        sent, arrivals = sc.load.sent, sc.reader.arrivals
        unpublished = [m for m in frozen.held if sent[m].due > frozen.start + 0.2]   # past any timing advance
        assert len(unpublished) >= 50, f"the firer held {len(unpublished)} rows not yet due when it froze"
        # each once, by the peer while the firer was frozen: a copy of the thawed firer's would come later
        assert [m for m in unpublished if len(arrivals[m]) > 1 or arrivals[m][0] > frozen.ended()] == []
        assert "claimed more than" in sc.stack.log("firer_00")
