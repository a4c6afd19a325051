"""Adding a cell to a running stack as docs/operations/scaling.md writes it: `chronos up --cells 2` with messages
waiting, started again with one cell more, then `chronos cells add cell3` while messages flow; the new cell owns
its share of the partitions with their messages, nothing is lost or early."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import psycopg

from chronos.adapters.postgres.store import Store
from helpers import wait_for
from kits.fleet import ROOT, page_blocks
from kits.stack import ChronosUp, clean_env
from kits.traffic import Load, Reader

SCALING = ROOT / "docs" / "operations" / "scaling.md"


def waiting(url: str) -> dict[str, int | None]:
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT id, input_partition FROM chronos_messages").fetchall())


def test_a_cell_is_added_to_a_running_stack_as_the_scaling_page_says(tmp_path):
    (restart,) = page_blocks(SCALING, "add cell up")
    (add,) = page_blocks(SCALING, "add cell")
    words = shlex.split(restart)
    assert words[:2] == ["chronos", "up"]
    first = ChronosUp("--cells", "2", workdir=tmp_path)
    up = ChronosUp(*words[2:], workdir=tmp_path)
    load = reader = None
    try:
        info = first.start()
        # messages waiting for days, in every partition, written through Kafka as any producer's
        load = Load(info["bootstrap_servers"], info["input_topic"], rate=400, delays=(86_400.0, 86_401.0), late=0.0)
        load.start()
        wait_for(lambda: len(load.sent) >= 800, 30, "far messages sent")
        load.stop()
        far = set(load.sent)
        wait_for(lambda: sum(len(waiting(url)) for url in info["cells"].values()) == len(far), 60, "far messages stored")
        assert first.halt()

        info = up.start()
        assert list(info["cells"]) == ["cell1", "cell2", "cell3"]
        new = Store(info["cells"]["cell3"])
        wait_for(lambda: new.live_firers(5000) > 0, 60, "cell3's firer taking its lease")
        reader = Reader(info["bootstrap_servers"], info["output_topic"])
        reader.start()
        reader.wait_assigned()
        load = Load(info["bootstrap_servers"], info["input_topic"], rate=150, delays=(0.5, 3.0), seed=3)
        load.start()
        wait_for(lambda: len(load.sent) >= 300, 30, "the load running")
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", add], cwd=tmp_path, capture_output=True, text=True,
                              env=clean_env(CHRONOS_READY_FILE=str(up.ready_file),
                                            PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"),
                              timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "cell cell3 takes partitions 3, 7" in done.stdout
        assert "cell cell3 owns its share: 2 partition(s) moved to it" in done.stdout
        sent_until = len(load.sent) + 300
        wait_for(lambda: len(load.sent) >= sent_until, 30, "the load running on")
        load.stop()
        sent = dict(load.sent)
        assert reader.missing(sent, 60) == set()
        assert [(p.partition, p.epoch) for p in new.cell_partitions()] == [(3, 3), (7, 3)]
        held = {cell: waiting(url) for cell, url in info["cells"].items()}
        partition_of = {m: p for rows in held.values() for m, p in rows.items()}
        assert set(partition_of) == far and sum(len(rows) for rows in held.values()) == len(far)
        assert set(held["cell3"]) == {m for m, p in partition_of.items() if p in (3, 7)}
        new.close()
    finally:
        if load is not None and load.is_alive():
            load.stop()
        if reader is not None:
            reader.stop()
        up.stop()
        first.stop()
    early = [m for m, s in sent.items() if reader.created[m] < s.deadline - 0.051]
    assert early == []
