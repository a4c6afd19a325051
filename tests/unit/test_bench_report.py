"""The benchmarks' arithmetic (benchmarks/harness/report.py, step.py) and the studies' options, on records made
up here: no I/O."""

from __future__ import annotations

import math
import multiprocessing as mp

import numpy as np
import pytest

from benchmarks import longevity, sla
from benchmarks.harness import graphile_target, report, step
from benchmarks.harness.records import ACKED, Records
from benchmarks.harness.samplers import TableStats
from benchmarks.harness.targets import format_layout


def records(deadlines, delivered, t_first=0.0, t_last=None) -> Records:
    rec = Records.create(mp.get_context("spawn"), len(deadlines))
    n = len(deadlines)
    rec.deadline[:] = deadlines
    rec.sent_at[:] = np.asarray(deadlines) - 1.0
    rec.state[:] = ACKED
    rec.delivered_at[:] = [math.nan if d is None else d for d in delivered]
    rec.copies[:] = [0.0 if d is None else 1.0 for d in delivered]
    rec.created_at[:] = rec.delivered_at[:] - 0.001
    rec.set("sent", n)
    rec.set("t_first", t_first)
    rec.set("t_last", t_last if t_last is not None else float(n) / 100.0)
    return rec


def summarize(rec, rate=100.0, duration=10.0, delay=(0.0, 0.0)):
    return report.summarize(rec, target="chronos", rate=rate, duration=duration, delay=delay,
                            timing_advance_ms=50.0, probe=None, store_samples=[], drain_timeout=30.0, t0=0.0)


def test_overdue_curve_counts_messages_past_grace_and_undelivered():
    deadline = np.array([1.0, 1.0, 2.0])
    delivered = np.array([1.2, 3.0, np.nan])
    times = np.array([1.4, 1.6, 2.9, 3.1, 10.0])
    # grace 0.5: message 0 never overdue; message 1 overdue in [1.5, 3.0); message 2 from 2.5 on
    assert report.overdue_curve(deadline, delivered, times, 0.5).tolist() == [0, 1, 2, 1, 1]


def test_on_time_load_passes_and_jitter_is_delivery_minus_deadline():
    deadlines = np.arange(1000) / 100.0
    s = summarize(records(deadlines, deadlines + 0.010, t_last=9.99))
    assert s["sla_pass"], s["sla"]
    assert s["lost"] == 0 and s["early"] == 0 and s["duplicates"] == 0
    assert s["jitter_ms"]["p50"] == pytest.approx(10.0, abs=1e-6)
    assert s["fire_rate"] == pytest.approx(100.0, rel=0.02)


def test_lost_early_and_slow_messages_fail_the_sla():
    deadlines = np.arange(1000) / 100.0
    delivered = list(deadlines + 0.010)
    delivered[10] = None                  # lost
    delivered[20] = deadlines[20] - 0.060  # 60 ms early: beyond the 50 ms timing advance
    for i in range(500, 510):             # 1% of messages a second late: p99.9 over 500 ms
        delivered[i] = deadlines[i] + 1.0
    s = summarize(records(deadlines, delivered, t_last=9.99))
    assert s["lost"] == 1 and s["lost_ids"] == [10]
    assert s["early"] == 1
    assert s["jitter_ms"]["p999"] > 500
    failed = {k for k, v in s["sla"]["checks"].items() if not v}
    assert {"nothing_lost", "nothing_early", "p999_within_500ms"} <= failed
    assert not s["sla_pass"]


def test_enqueue_rate_from_insert_counter_samples():
    samples = [(float(t), 1000 * t, 0) for t in range(0, 12)]
    assert report.enqueue_rate(samples, 0.0, 10.0) == pytest.approx(1000.0)


# -- the harness's layout and CPU split (benchmarks/harness/step.py), and the studies' arguments


def test_wal_per_message_is_the_steady_window_s_wal_rate_over_the_offered_rate():
    samples = [TableStats(at=float(t), inserted=0, live=0, dead=0, vacuums=0, autovacuums=0, autoanalyzes=0,
                          vacuuming=False, wal_bytes=1_000_000 + t * 2_000_000) for t in range(20)]
    assert report.wal_per_message(samples, 5.0, 15.0, 1000.0) == pytest.approx(2000.0)
    assert report.wal_per_message(samples[:1], 0.0, 15.0, 1000.0) is None  # one sample: no rate
    no_wal = [s._replace(wal_bytes=0) for s in samples]  # a sampler of another table's counters only
    assert report.wal_per_message(no_wal, 5.0, 15.0, 1000.0) is None


def test_layout_options_are_the_harness_own_also_after_the_separator():
    args = sla.parse_args(["--find-max", "--consumers", "2", "--", "--firers", "2", "--batch-size", "5000",
                           "--detectors=3"])
    assert (args.consumers, args.firers, args.detectors) == (2, 2, 3)
    assert args.up_args == ["--batch-size", "5000"]  # the rest still goes to `chronos up`
    assert format_layout(vars(args)) == "2/2/3"
    defaults = sla.parse_args([])
    assert (defaults.consumers, defaults.firers, defaults.detectors) == (1, 1, 1)


@pytest.mark.parametrize("argv", [["--firers", "2", "--", "--firers", "3"], ["--consumers", "0"]])
def test_contradicting_or_empty_layouts_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        sla.parse_args(argv)
    assert exited.value.code == 2
    assert "--" in capsys.readouterr().err


CPU = {"postgres": {"cpu_s": 8.4, "cores": 0.42}, "firer_00": {"cpu_s": 2.6, "cores": 0.13},
       "firer_01": {"cpu_s": 2.8, "cores": 0.14}, "broker": {"cpu_s": 10.4, "cores": 0.52}}


def test_cpu_split_lists_every_process_busiest_first_with_the_total():
    assert step.format_cpu(CPU) == "broker 0.52, postgres 0.42, firer_01 0.14, firer_00 0.13 (total 1.21)"
    assert step.format_cpu({}) == "(not measured)"


def test_summary_lines_show_the_layout_and_the_cpu_split():
    deadlines = np.arange(1000) / 100.0
    s = summarize(records(deadlines, deadlines + 0.010, t_last=9.99))
    s.update(layout="2/2/2", cpu=CPU)
    verdict, cpu = step.summary_lines(s)
    assert verdict.startswith("chronos layout 2/2/2 100 msg/s: sent 1000 delivered 1000 lost 0")
    assert verdict.endswith("SLA PASS")
    assert cpu == "  cpu (cores): " + step.format_cpu(CPU)


def test_find_max_lines_show_the_layout_and_each_step_cpu_split():
    one = {"layout": "2/2/2", "jitter_p999_ms": 40.0, "lost": 0, "cpu": CPU}
    result = {"target": "chronos", "layout": "2/2/2", "max_sustained_rate": 4000.0, "first_failing_rate": 8000.0,
              "steps": [{**one, "rate": 4000.0, "sla_pass": True, "failed": []},
                        {**one, "rate": 8000.0, "sla_pass": False, "failed": ["p999_within_500ms"]}]}
    lines = sla.find_max_lines(result)
    assert lines[0].startswith("find-max chronos layout 2/2/2: highest rate holding the SLA: 4000.0 msg/s")
    assert "first failing: 8000.0" in lines[0]
    assert lines[1].split() == ["4000", "msg/s", "layout", "2/2/2", "pass", "p99.9", "40.0", "ms", "lost", "0"]
    assert lines[3].split()[:5] == ["8000", "msg/s", "layout", "2/2/2", "FAIL"]
    assert lines[2].strip() == lines[4].strip() == "cpu (cores): " + step.format_cpu(CPU)


def test_graphile_target_without_node_says_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # neither node nor npm
    with pytest.raises(graphile_target.SetupFailed, match="node is not on PATH: --target graphile needs Node.js"):
        graphile_target.ensure_installed()


def test_longevity_takes_a_steps_options_and_probes_less_often():
    args = step.parse_args(longevity.build_parser(), ["--rate", "4000", "--steps", "3", "--", "--firers", "2",
                                                      "--partitions", "4"])
    assert (args.rate, args.steps, args.firers, args.up_args) == (4000.0, 3, 2, ["--partitions", "4"])
    assert args.probe_interval_ms == longevity.PROBE_INTERVAL_MS and not args.renew_broker
    assert sla.parse_args([]).probe_interval_ms == 25.0


def test_longevity_counts_the_schedulers_cpu_not_the_brokers_or_the_harness():
    cpu = {"consumer_00": 0.05, "firer_00": 0.16, "firer_01": 0.1, "detector_00": 0.01, "postgres": 0.29,
           "broker": 0.4, "bench-reader": 0.2, "bench-load": 0.3}
    assert longevity.scheduler_cores(cpu) == 0.61


def test_a_result_s_code_fingerprint_covers_the_service_s_files():
    """The fingerprint of what ran hashes chronos/ and native/ (it once looked for them in benchmarks/ and
    hashed nothing: every result carried the digest of no input)."""
    import hashlib

    from benchmarks.harness.report import code_version
    code = code_version()
    assert code["git_commit"] and code["service_tree_sha256"] != hashlib.sha256(b"").hexdigest()[:16]


def test_a_result_names_the_service_that_ran_when_it_is_another_checkout_than_the_harness(tmp_path, monkeypatch):
    """An A/B of two versions runs the older service under this harness (PYTHONPATH): the result names
    the service's commit beside the harness's, and fingerprints the service's files, not the harness's."""
    import subprocess

    from benchmarks.harness.report import code_version
    here = code_version()
    assert "service_commit" not in here
    (tmp_path / "chronos").mkdir()
    (tmp_path / "chronos" / "__init__.py").write_text("VERSION = 'older'\n")
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "older"]):
        subprocess.run(["git", *args], cwd=tmp_path, check=True)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # as the A/B runs the older version's processes
    older = code_version()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert older["git_commit"] == here["git_commit"]
    assert older["service_commit"] == commit and older["service_dirty"] is False
    assert older["service_tree_sha256"] != here["service_tree_sha256"]


def test_each_cells_postgresql_is_measured_on_its_own_and_one_database_as_postgres():
    from benchmarks.harness.targets import Target
    cells = Target(None, {"postgres_pid": 11, "cell_postgres_pids": {"cell1": 11, "cell2": 12}})
    assert cells.cpu_groups() == {"postgres-cell1": (11, True), "postgres-cell2": (12, True)}
    assert longevity.scheduler_cores({"postgres-cell1": 0.25, "postgres-cell2": 0.5, "broker": 1.0}) == 0.75
    one = Target(None, {"postgres_pid": 11, "cell_postgres_pids": None})
    assert one.cpu_groups() == {"postgres": (11, True)}


def test_messages_the_reader_missed_but_the_topic_holds_are_not_lost():
    deadlines = np.arange(1000) / 100.0
    delivered = list(deadlines + 0.010)
    delivered[10] = delivered[11] = delivered[12] = None
    s = summarize(records(deadlines, delivered, t_last=9.99))
    assert s["lost"] == 3 and not s["sla"]["checks"]["nothing_lost"]
    # two on the output topic when read again from its start, one nowhere
    report.count_reread(s, {"undelivered": 3, "by_state": {"delivered_after_all": 2, "waiting": 1}})
    assert (s["lost"], s["found_on_reread"]) == (1, 2) and not s["sla"]["checks"]["nothing_lost"]
    assert "lost 1 (found on the topic read again: 2)" in step.summary_lines(s)[0]
    s = summarize(records(deadlines, delivered, t_last=9.99))
    report.count_reread(s, {"undelivered": 3, "by_state": {"delivered_after_all": 3}})
    assert s["lost"] == 0 and s["sla"]["checks"]["nothing_lost"] and s["sla_pass"] == all(s["sla"]["checks"].values())
