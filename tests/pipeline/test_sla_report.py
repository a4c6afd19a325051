"""`chronos pipeline report`: exact percentiles (checked against numpy), counts, verdict, charts."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timezone

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chronos.errors import InputError
from chronos.pipeline import report
from helpers import SPARK_TEST_JVM

pytestmark = pytest.mark.spark

T0 = 1_800_000_000.0  # epoch seconds
PROBS = [0.5, 0.99, 0.999]


def records(n: int = 10_000, seed: int = 3, early: int = 3, late: int = 40) -> dict[str, np.ndarray]:
    """Deliveries over ~3 minutes: log-normal jitter, a few early and a few very late ones."""
    rng = np.random.default_rng(seed)
    deadline = T0 + np.sort(rng.uniform(0, 150, n))
    jitter_s = rng.lognormal(-4.5, 0.8, n) - 0.01
    jitter_s[rng.choice(n, early, replace=False)] = -0.2
    jitter_s[rng.choice(n, late, replace=False)] = rng.uniform(0.6, 2.0, late)
    jitter_s[:5] = jitter_s[5]  # ties
    return {"id": np.arange(n).astype(str), "deadline": deadline, "sent_at": deadline - 1.0,
            "delivered_at": deadline + jitter_s, "node": rng.choice(["n1", "n2", "n3"], n)}


def numpy_jitter_ms(deadline_s: np.ndarray, delivered_s: np.ndarray) -> np.ndarray:
    """The report's definition: from epoch microseconds, (delivered_us − deadline_us) / 1000."""
    return (delivered_s * 1e6 - deadline_s * 1e6) / 1000.0


@pytest.fixture(scope="module")
def float_records(tmp_path_factory):
    data = records()
    path = tmp_path_factory.mktemp("records") / "records.parquet"
    pq.write_table(pa.table(data), path)
    return str(path), data


def test_percentiles_counts_and_charts_match_numpy(spark, float_records, tmp_path):
    path, data = float_records
    out = tmp_path / "report"
    result = report.run(spark, input_path=path, out_dir=out)
    jitter = numpy_jitter_ms(data["deadline"], data["delivered_at"])
    p50, p99, p999 = np.quantile(jitter, PROBS)
    j = result["jitter_ms"]
    assert j["p50"] == pytest.approx(p50, rel=1e-12, abs=1e-9)
    assert j["p99"] == pytest.approx(p99, rel=1e-12, abs=1e-9)
    assert j["p999"] == pytest.approx(p999, rel=1e-12, abs=1e-9)
    assert (j["min"], j["max"]) == (pytest.approx(jitter.min()), pytest.approx(jitter.max()))
    assert j["mean"] == pytest.approx(jitter.mean())

    # per minute of deadline: count, percentiles and max, each against numpy on that minute
    minutes = np.floor(data["deadline"] * 1e6 / 60e6) * 60
    assert [m["count"] for m in j["per_minute"]] == [int((minutes == m).sum()) for m in np.unique(minutes)]
    for m, key in zip(j["per_minute"], np.unique(minutes)):
        assert m["t"] == datetime.fromtimestamp(key, timezone.utc).strftime("%Y-%m-%dT%H:%M:00.000Z")
        part = jitter[minutes == key]
        expected = np.quantile(part, PROBS)
        assert [m["p50"], m["p99"], m["p999"]] == pytest.approx(list(expected), rel=1e-12, abs=1e-9)
        assert m["max"] == pytest.approx(part.max())

    n = len(jitter)
    assert (result["records"], result["delivered"], result["undelivered"], result["duplicates"]) == (n, n, 0, 0)
    assert result["early"] == int((jitter < -50).sum()) == 3
    assert result["late"] == int((jitter > 500).sum()) == 40
    assert result["sent_after_deadline"] == 0
    assert sum(p["count"] for p in result["throughput"]["series"]) == n
    assert result["throughput"]["bucket_seconds"] == 1
    assert sum(result["jitter_ms"]["histogram"]["counts"]) == n
    assert sorted(x["node"] for x in result["nodes"]) == ["n1", "n2", "n3"]
    assert sum(x["count"] for x in result["nodes"]) == n
    # three early messages break the SLA even though p99.9 is within 500 ms
    assert result["sla"]["checks"] == {"p999_within": p999 <= 500, "none_early": False, "none_lost": True}
    assert result["sla"]["verdict"] == "fail"

    assert orjson.loads((out / "report.json").read_bytes())["jitter_ms"]["p999"] == j["p999"]
    for name in ("jitter_histogram.png", "jitter_over_time.png", "throughput.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timestamps_and_epoch_milliseconds_are_read_exactly(spark, tmp_path):
    rng = np.random.default_rng(5)
    n = 500
    deadline_us = (T0 * 1e6 + np.sort(rng.integers(0, 120_000_000, n))).astype(np.int64)
    delivered_us = deadline_us + rng.integers(-30_000, 900_000, n)
    pq.write_table(pa.table({
        "id": pa.array(np.arange(n), pa.int64()),  # the harness writes integer ids
        "deadline": pa.array(deadline_us, pa.timestamp("us", tz="UTC")),
        "delivered_at": pa.array(delivered_us, pa.timestamp("us")),  # no time zone: UTC
        "copies": pa.array(np.where(np.arange(n) < 7, 2, 1), pa.int32()),
    }), tmp_path / "ts.parquet")
    result = report.run(spark, input_path=str(tmp_path / "ts.parquet"), out_dir=tmp_path / "ts", charts=False,
                        thresholds=report.Thresholds(p999_ms=1000, timing_advance_ms=50))
    jitter = (delivered_us - deadline_us) / 1000.0
    assert [result["jitter_ms"][k] for k in ("p50", "p99", "p999")] == \
        pytest.approx(list(np.quantile(jitter, PROBS)), rel=1e-12, abs=1e-9)
    assert result["duplicates"] == 7 and result["sla"]["verdict"] == "pass"
    assert "charts" not in result

    ms = (deadline_us // 1000).astype(np.int64)
    pq.write_table(pa.table({"id": np.arange(n).astype(str), "deadline": ms, "delivered_at": ms + 10}),
                   tmp_path / "ms.parquet")
    result = report.run(spark, input_path=str(tmp_path / "ms.parquet"), out_dir=tmp_path / "ms", charts=False)
    assert result["jitter_ms"]["p50"] == result["jitter_ms"]["max"] == 10.0

    pq.write_table(pa.table({"id": ["a", "b"], "deadline": [T0, T0], "delivered_at": [T0 + 0.25, float("nan")]}),
                   tmp_path / "nan.parquet")
    result = report.run(spark, input_path=str(tmp_path / "nan.parquet"), out_dir=tmp_path / "nan", charts=False)
    assert (result["delivered"], result["undelivered"]) == (1, 1) and result["jitter_ms"]["max"] == 250.0
    assert result["sla"]["checks"]["none_lost"] is False


def test_exact_percentiles_small_groups_and_ties(spark):
    values = [(g, float(v)) for g, vs in (("a", [5]), ("b", [1, 2]), ("c", [3, 3, 3, 1, 10, -4.5, 7]))
              for v in vs]
    df = spark.createDataFrame(values, "g string, v double")
    probs = [("p0", 0.0), ("p25", 0.25), ("p50", 0.5), ("p90", 0.9), ("p999", 0.999), ("max", 1.0)]
    rows = {r["g"]: r for r in report.exact_percentiles(df, "v", probs, by=["g"]).collect()}
    for g in ("a", "b", "c"):
        vs = np.array([v for gg, v in values if gg == g])
        assert rows[g]["n"] == len(vs)
        assert [rows[g][name] for name, _ in probs] == list(np.quantile(vs, [q for _, q in probs]))
    overall = report.exact_percentiles(df, "v", probs).first()
    assert [overall[name] for name, _ in probs] == list(np.quantile([v for _, v in values], [q for _, q in probs]))


def test_report_input_errors(spark, tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        report.run(spark, input_path=str(tmp_path / "none.parquet"), out_dir=tmp_path / "out")
    pq.write_table(pa.table({"id": ["a"], "deadline": [1.0]}), tmp_path / "short.parquet")
    with pytest.raises(InputError, match=r"missing column\(s\) delivered_at"):
        report.run(spark, input_path=str(tmp_path / "short.parquet"), out_dir=tmp_path / "out")
    pq.write_table(pa.table({"id": ["a"], "deadline": [True], "delivered_at": [1.0]}), tmp_path / "bool.parquet")
    with pytest.raises(InputError, match="column deadline has type boolean"):
        report.run(spark, input_path=str(tmp_path / "bool.parquet"), out_dir=tmp_path / "out")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    args += ("--conf", f"spark.driver.extraJavaOptions={SPARK_TEST_JVM}")
    return subprocess.run([sys.executable, "-m", "chronos", "pipeline", "report", *args], capture_output=True,
                          text=True, timeout=240, env=os.environ.copy())


def test_cli_report_prints_the_verdict_and_fails_on_breach(float_records, tmp_path):
    path, data = float_records
    done = run_cli("--input", path, "--out", str(tmp_path / "r"), "--master", "local[2]", "--fail-on-breach",
                   "--max-p999-ms", "100")
    assert done.returncode == 1, done.stderr
    assert "SLA FAIL (p999_within, none_early)" in done.stdout
    jitter = numpy_jitter_ms(data["deadline"], data["delivered_at"])
    assert f"p99.9 {np.quantile(jitter, 0.999):,.1f}" in done.stdout
    assert "the SLA verdict is fail" in done.stderr and "Traceback" not in done.stderr
    assert orjson.loads((tmp_path / "r" / "report.json").read_bytes())["sla"]["thresholds"]["p999_ms"] == 100

    missing = run_cli("--input", str(tmp_path / "nope.parquet"), "--out", str(tmp_path / "x"))
    assert missing.returncode == 2 and missing.stderr.strip().endswith("does not exist")
    assert len(missing.stderr.strip().splitlines()) == 1
