"""A role's process runs with the garbage collector tuned for batches."""

from __future__ import annotations

import gc

from chronos.runtime import process
from kafka_double import settings


class Services:
    def clients(self) -> str:
        return "no clients"


def test_a_role_runs_with_the_collector_tuned_for_batches(monkeypatch):
    seen = []
    monkeypatch.setattr(process.logs, "setup", lambda *args: None)
    monkeypatch.setattr(process.Lifecycle, "install_signals", lambda self: None)
    monkeypatch.setattr(process.RunRecord, "under_supervisord", classmethod(lambda cls: None))
    monkeypatch.setattr(process, "_run", lambda *args: seen.append(gc.get_threshold()) or 0)
    before = gc.get_threshold()
    try:
        assert process.run_process("consumer", settings(), lambda *args: None, services=Services()) == 0
    finally:
        gc.set_threshold(*before)
    assert seen == [process.GC_THRESHOLD] and process.GC_THRESHOLD[0] > 700 * 10
