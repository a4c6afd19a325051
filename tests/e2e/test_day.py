"""The day-in-the-life benchmark stays working: its whole sequence at a small scale, on its own `chronos up`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[2]
PHASES = ["steady 1k", "burst 1", "burst 2", "burst 3", "spike", "far-future 5k", "VACUUM 5k", "autovacuum 5k"]


@pytest.mark.timeout(180)
def test_day_benchmark_whole_sequence_at_small_scale(tmp_path):
    out = tmp_path / "day.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHRONOS_")}
    run = subprocess.run([sys.executable, "-m", "benchmarks.day", "--scale", "0.03", "--delay", "0.5:2",
                          "--progress", "5", "--drain-timeout", "30", "--out", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=170)
    assert run.returncode in (0, 1), run.stdout + run.stderr  # 1: ran, but a target was missed
    result = orjson.loads(out.read_bytes())
    assert result["layout"] == "1/1/1" and result["scale"] == 0.03
    phases = result["phases"]
    assert [p["name"] for p in phases] == PHASES
    for p in phases:
        assert p["sent"] > 0 and p["send_failed"] == 0, p
        assert p["lost"] == 0 and p["delivered"] == p["sent"], run.stdout
        assert p["early"] == 0 and p["early_published"] == 0, run.stdout
        assert p["late_over_60s"] == 0 and p["duplicates"] >= 0
        for key in ("p50", "p99", "p999"):
            assert p["jitter_ms"][key] is not None
        assert p["broker_floor_ms"]["count"] > 10, p["name"]  # the probe ran through every phase
        for statement in ("claim", "scan", "insert"):  # firers claim and detectors scan on every poll
            assert p["statements"][statement]["count"] > 0, (p["name"], statement, p.get("spike"), run.stdout)
            assert p["statements"][statement]["slowest_s"] > 0
        # a phase may end before the deletes of its last acknowledgements (they come in the next one)
        assert p["statements"]["delete"]["count"] >= 0 and "slowest_s" in p["statements"]["delete"]
        assert set(p["statements"]["counters"]) == {"reset", "vanished", "released"}
        assert set(p["targets"]) >= {"statements_under_1s", "none_over_60s_late", "no_duplicates"}
        assert p["store"]["live_rows_max"] >= 0
        # the embedded broker: its memory read every second, its CPU, what it holds as chronos up samples it
        assert p["broker"]["rss_mb"] > 1 and p["broker"]["rss_mb_max"] >= p["broker"]["rss_mb"], p["broker"]
        assert p["broker"]["cpu_cores"] is not None and p["broker"]["intake_lag_max"] is not None, p["broker"]
    assert sum(p["statements"]["delete"]["count"] for p in phases) > 0
    # everything sent went through the broker twice (input, output), the probe's messages besides
    assert phases[-1]["broker"]["messages_held"] >= 2 * sum(p["sent"] for p in phases[:-1]), run.stdout
    assert sum(p["broker"]["messages_through"] for p in phases) > 0
    # every message of a fixed load was sent: 10,000/s x 0.5 s per burst
    assert [p["sent"] for p in phases[1:4]] == [5000] * 3
    spike, far, vacuum, auto = phases[4:]
    assert spike["sent"] == 6000 and spike["spike"]["drain_s"] > 0 and spike["spike"]["fire_rate"] > 0
    assert far["far_rows"] == 30000 and far["far_fill_s"] > 0
    assert vacuum["event"]["vacuum_s"] >= 0
    assert auto["event"]["autovacuum_seen"] is True and auto["store"]["autovacuums"] >= 1, run.stdout
    assert auto["event"]["settings_restored"] is True  # the table's autovacuum settings are the migration's again
    assert "| phase | msg/s |" in run.stdout and "| autovacuum 5k |" in run.stdout
    again = subprocess.run([sys.executable, "-m", "benchmarks.day", "--table", str(out)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=30)
    assert again.returncode == 0 and again.stdout.strip() in run.stdout, again.stdout + again.stderr
