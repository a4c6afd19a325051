"""benchmarks.cells's arithmetic: the cells' wait events and checkpoints, and the machine's CPU by kind of
process, by 10 s of the move."""

from __future__ import annotations

from benchmarks.cells import GcPauses, Waits
from benchmarks.harness.procstat import MachineCpu, kind_of


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


def test_processes_are_told_apart_by_their_command_line():
    pg = "/venv/pginstall/bin/postgres -D /tmp/s/.chronos/pgdata-cell2 -c port=5"
    assert kind_of("postgres: autovacuum worker chronos", pg) == "postgres pgdata-cell2 autovacuum"
    assert kind_of("postgres: walwriter", pg) == "postgres pgdata-cell2 server"
    assert kind_of("postgres: postgres chronos 127.0.0.1(5) idle", pg) == "postgres pgdata-cell2 backend"
    assert kind_of(pg) == "postgres pgdata-cell2 server"
    assert kind_of("/venv/bin/python -m chronos firer") == "chronos firer"
    assert kind_of("/venv/bin/python -m chronos cells move --partition 3 --to cell2") == "chronos cells"
    assert kind_of("/root/.calfkit/bin/tansu-v0.6.0 broker --listener-url tcp://x") == "broker"
    assert kind_of("/venv/bin/python -m benchmarks.cells --out x") == "benchmarks.cells"
    assert kind_of("") == "?"


def test_the_machines_cpu_is_given_in_cores_per_10s_by_kind_the_busiest_first():
    m = MachineCpu(every=1.0)
    m.samples = [(100.5, {"broker": 0.5, "chronos firer": 0.25}), (101.5, {"broker": 0.5}),
                 (111.0, {"postgres pgdata-cell1 autovacuum": 0.9, "chronos firer": 0.1})]
    assert m.by_10s(zero=100.0, top=1) == [
        {"from_s": 0, "cores": 0.62, "by_kind": {"broker": 0.5}},
        {"from_s": 10, "cores": 1.0, "by_kind": {"postgres pgdata-cell1 autovacuum": 0.9}},
    ]


def test_the_harness_s_collections_of_5_ms_or_more_are_kept_with_when_they_began():
    times = iter([100.0, 100.002, 101.0, 101.25, 103.0, 103.004])
    pauses = GcPauses(clock=lambda: next(times))
    for generation in (0, 2, 1):
        pauses("start", {"generation": generation})
        pauses("stop", {"generation": generation, "collected": 0, "uncollectable": 0})
    assert pauses.since(zero=100.5) == [{"at_s": 0.5, "generation": 2, "ms": 250.0}]
