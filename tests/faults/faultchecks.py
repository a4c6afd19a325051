"""Assertions every fault scenario makes."""

from __future__ import annotations

from kits.faults import Scenario
from kits.verdicts import Report


def check_common(sc: Scenario, report: Report, stopped: tuple[str, ...] = ()) -> None:
    """Nothing lost, nothing early, every duplicate explained, every program (but `stopped`) RUNNING."""
    assert not report.lost, (f"{len(report.lost)} messages not on the output topic even when read again from the "
                             f"start, e.g. {report.lost[:5]}")
    assert not report.early, f"{len(report.early)} messages early (id, seconds early): {report.early[:5]}"
    assert not report.unexplained, (f"{len(report.unexplained)} duplicates not explained by a fault, e.g. "
                                    f"{[(m, sc.load.sent[m]) for m in report.unexplained[:5]]}")
    assert sc.stack.all_running(except_names=stopped) == {}
    assert sc.stack.proc.poll() is None, f"chronos up exited:\n{sc.stack.output()}"
