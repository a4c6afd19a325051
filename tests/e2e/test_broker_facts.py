"""The embedded broker's documented behaviours (docs/operations/embedded-stack.md) still hold.

Runs `benchmarks.broker_facts --quick` against its own broker. The facts checked here are the
ones the embedded profile and the docs rely on and that do not depend on the machine's speed; a
broker upgrade that changes one of them fails this test, and the page must be measured again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_documented_broker_behaviours_hold(tmp_path):
    out = tmp_path / "facts.json"
    run = subprocess.run([sys.executable, "-m", "benchmarks.broker_facts", "--quick", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert run.returncode == 0, run.stdout + run.stderr
    facts = orjson.loads(out.read_bytes())
    assert facts["auto_created_partitions"] == 4                          # behaviour 5
    latest = facts["latest_offsets"]
    assert latest["high_watermark"] < latest["produced"]                  # behaviour 2: "latest" is short
    assert latest["read_after_offset_end"] > 0
    deleted = facts["deleted_topic"]
    assert deleted["acknowledged"] == deleted["produced_after_delete"]    # behaviour 6: acknowledged...
    assert deleted["readable_afterwards"] == 0                            # ...and stored nowhere
    assert facts["group_join_s"]["profile (session 2 s)"] < 10            # behaviour 1, with the profile
    assert facts["many_tiny_batches"][0]["read"] == facts["many_tiny_batches"][0]["batches"]
