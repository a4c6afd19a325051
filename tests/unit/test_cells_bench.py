"""benchmarks.cells's arithmetic: the cells' wait events and checkpoints by 10 s of the move."""

from __future__ import annotations

from benchmarks.cells import Waits


def test_waits_are_averaged_per_sample_by_10s_and_cell_with_the_checkpoints_and_wal_in_between():
    w = Waits({})
    w.samples = [
        (100.0, "cell1", {"firer IO:WalSync": 2, "other CPU": 1}, (3, 1_000_000)),
        (105.0, "cell1", {"firer IO:WalSync": 1}, (4, 6_000_000)),
        (101.0, "cell2", {}, (0, 0)),
        (112.0, "cell1", {"consumer CPU": 1}, (4, 7_000_000)),
    ]
    rows = w.by_10s(zero=100.0)
    assert rows == [
        {"from_s": 0, "cell": "cell1", "samples": 2, "waits": {"firer IO:WalSync": 1.5, "other CPU": 0.5},
         "checkpoints": 1, "wal_mb": 5.0},
        {"from_s": 0, "cell": "cell2", "samples": 1, "waits": {}, "checkpoints": 0, "wal_mb": 0.0},
        {"from_s": 10, "cell": "cell1", "samples": 1, "waits": {"consumer CPU": 1.0}, "checkpoints": 0, "wal_mb": 0.0},
    ]
