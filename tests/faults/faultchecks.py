"""Assertions every fault scenario makes."""

from __future__ import annotations

from faultload import Report, Scenario


def check_common(sc: Scenario, report: Report, stopped: tuple[str, ...] = ()) -> None:
    """Nothing lost, nothing early, every duplicate explained, every program (but `stopped`) RUNNING."""
    # The reader at the head of the output topic has been seen to skip a few messages that are on
    # the topic (the embedded broker's fetches; BROKER.md): what counts is the topic itself.
    lost = [m for m in report.lost if m not in set(report.lost_found_on_reread)]
    assert not lost, (f"{len(lost)} messages not on the output topic even when read again from the start, "
                      f"e.g. {lost[:5]} (the live reader missed {len(report.lost)} in all)")
    assert not report.early, f"{len(report.early)} messages early (id, seconds early): {report.early[:5]}"
    assert not report.unexplained, (f"{len(report.unexplained)} duplicates not explained by a fault, e.g. "
                                    f"{[(m, sc.load.sent[m]) for m in report.unexplained[:5]]}")
    assert sc.stack.all_running(except_names=stopped) == {}
    assert sc.stack.proc.poll() is None, f"chronos up exited:\n{sc.stack.output()}"
