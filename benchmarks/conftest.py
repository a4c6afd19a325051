"""The micro benchmarks' summary of the codec's speed-up. Their PostgreSQL (`database_url`) is
the repository's conftest.py, shared with the tests."""

from __future__ import annotations

SPEEDUPS: dict[str, dict[str, float]] = {}


def pytest_terminal_summary(terminalreporter) -> None:
    """The native codec's speed-up over the pure-Python one, per operation (medians; measured, never asserted)."""
    lines = []
    for op, means in sorted(SPEEDUPS.items()):
        if "native" in means and "python" in means:
            lines.append(f"  {op:<16} native {means['native'] * 1e6:9.2f} us   python {means['python'] * 1e6:9.2f} us"
                         f"   speed-up {means['python'] / means['native']:5.1f}x")
    if lines:
        terminalreporter.write_sep("-", "header codec: native vs pure Python (target: at least 5x)")
        for line in lines:
            terminalreporter.write_line(line)
