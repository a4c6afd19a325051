"""Fault scenarios: collect one summary row per scenario, print the table, write it as JSON."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

_ROWS: list[dict] = []
_REPORT: list[Path] = []


@pytest.fixture(scope="session")
def fault_report(tmp_path_factory: pytest.TempPathFactory):
    """Call with a faultload.Report: prints its table line and rewrites the session's JSON report."""
    path = tmp_path_factory.getbasetemp() / "faults-report.json"

    def record(report) -> None:
        _ROWS.append(report.row())
        path.write_bytes(orjson.dumps(_ROWS, option=orjson.OPT_INDENT_2))
        if not _REPORT:
            _REPORT.append(path)
        print(f"\n{report.line()}\nfault report: {path}")
    return record


def pytest_terminal_summary(terminalreporter) -> None:
    if not _ROWS:
        return
    tr = terminalreporter
    tr.section("fault scenarios")
    tr.write_line(f"{'scenario':<28} {'sent':>6} {'delivered':>9} {'lost':>4} {'early':>5} {'dups':>5} "
                  f"{'unexpl.':>7} {'recovery':>9} {'max late':>9} {'reread':>6}")
    for r in _ROWS:
        tr.write_line(f"{r['scenario']:<28} {r['sent']:>6} {r['delivered']:>9} {r['lost']:>4} {r['early']:>5} "
                      f"{r['duplicates']:>5} {r['unexplained_duplicates']:>7} {r['recovery_s']:>8.1f}s "
                      f"{r['max_lateness_s']:>8.1f}s {r['lost_found_on_reread']:>6}")
    tr.write_line("reread: delivered, but only seen when the output topic was read again from the start")
    tr.write_line(f"JSON: {_REPORT[0]}")
