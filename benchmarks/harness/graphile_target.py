"""The same workload through graphile-worker (`--target graphile`), a Node.js PostgreSQL job queue.

graphile-worker and its dependencies are installed from the npm registry into
benchmarks/harness/graphile/node_modules (`npm ci` from the committed package-lock.json) the first time the
target is used; nothing of it is part of Chronos.

The producer process enqueues each message as a job with `run_at` = its deadline, in one call of
graphile-worker's bulk SQL function `graphile_worker.add_jobs` per tick, the way the pgqueuer
producer batches. Each worker is a Node process (benchmarks/harness/graphile/worker.js) whose task only
notes when the job runs and writes `<id> <epoch ms>` to its stdout; a Python process per worker
reads those lines and stamps them into the Records. jitter = that time − run_at.

Tuning, per graphile-worker's performance page: 24 concurrent jobs per worker, a pool of 25
connections, a local queue of 500 jobs fetched at once, completions batched (delay 0),
prepared statements. Future jobs are found by polling (and by the `jobs:insert` notification
each add_jobs call sends); the poll interval is 100 ms by default, the same bound pgqueuer's
worker polls at in the pgqueuer target.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness.kafka_load import LoadPlan, quiet_interrupts, take_due
from benchmarks.harness.records import ACKED, FAILED, Records
from kits.stack import StackFailed

HERE = Path(__file__).resolve().parent / "graphile"
TASK = "chronos_bench"  # must match worker.js
SCHEMA = "graphile_worker"

_ADD_JOBS = f"""
SELECT count(*) FROM {SCHEMA}.add_jobs(ARRAY(
    SELECT ROW(%(task)s, json_build_object('r', %(tag)s::text, 'i', u.i, 'p', %(pad)s::text),
               NULL, to_timestamp(u.t), NULL, NULL, NULL, NULL)::{SCHEMA}.job_spec
    FROM unnest(%(ids)s::int[], %(at)s::float8[]) AS u(i, t)))
"""


class SetupFailed(StackFailed):
    """graphile-worker could not be installed or its schema set up."""


@dataclass(frozen=True)
class WorkerSettings:
    """A worker's graphile-worker options (worker.js reads them under graphile-worker's names)."""

    concurrency: int = 24
    max_pool_size: int = 25
    poll_interval_ms: int = 100
    local_queue_size: int = 500
    complete_job_batch_delay_ms: int = 0

    def for_node(self, **extra) -> str:
        return json.dumps({"concurrency": self.concurrency, "maxPoolSize": self.max_pool_size,
                           "pollInterval": self.poll_interval_ms, "localQueueSize": self.local_queue_size,
                           "completeJobBatchDelay": self.complete_job_batch_delay_ms, **extra})


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SetupFailed(f"{name} is not on PATH: --target graphile needs Node.js (>= 14) and npm "
                          f"to install graphile-worker into {HERE / 'node_modules'}")
    return path


def installed_version() -> str | None:
    """The graphile-worker version in benchmarks/harness/graphile/node_modules, or None if it is not installed."""
    try:
        return json.loads((HERE / "node_modules" / "graphile-worker" / "package.json").read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


def locked_version() -> str:
    lock = json.loads((HERE / "package-lock.json").read_text())
    return lock["packages"]["node_modules/graphile-worker"]["version"]


def node_version() -> str:
    return subprocess.run([_tool("node"), "--version"], capture_output=True, text=True, timeout=30).stdout.strip()


def ensure_installed(timeout: float = 600.0) -> str:
    """Install the locked graphile-worker with `npm ci` unless it already is; returns its version."""
    _tool("node")
    want = locked_version()
    if installed_version() == want:
        return want
    npm = _tool("npm")
    print(f"installing graphile-worker {want} into {HERE / 'node_modules'} (npm ci) ...", flush=True)
    try:
        run = subprocess.run([npm, "ci", "--prefix", str(HERE), "--no-audit", "--no-fund"],
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SetupFailed(f"npm ci did not finish within {timeout:.0f}s") from None
    if run.returncode != 0 or installed_version() != want:
        tail = " | ".join((run.stdout + run.stderr).strip().splitlines()[-5:])
        raise SetupFailed(f"npm ci --prefix {HERE} failed (exit {run.returncode}): {tail}")
    return want


def _node_env(url: str) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": url}


def install_schema(url: str, settings: WorkerSettings) -> str:
    """A fresh graphile-worker schema in the database at `url`; returns graphile-worker's version."""
    import psycopg
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")  # a constant of this module
    run = subprocess.run([_tool("node"), str(HERE / "worker.js"), "migrate", settings.for_node()],
                         cwd=HERE, env=_node_env(url), capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        tail = " | ".join(run.stderr.strip().splitlines()[-5:])
        raise SetupFailed(f"graphile-worker's migrations failed (exit {run.returncode}): {tail}")
    return run.stdout.strip()


def run_producer(url: str, plan: LoadPlan, rec: Records, tick: float = 0.005) -> None:
    """Enqueue the load: every tick, one add_jobs call with the messages due by then (run_at = deadline)."""
    import psycopg
    quiet_interrupts()
    conn = psycopg.connect(url, autocommit=True)
    rng = random.Random(plan.seed)
    pad = random.Random(plan.seed + 1).randbytes(plan.payload_bytes).hex()[:plan.payload_bytes]
    state = rec.raw["state"]
    n, rate, t0 = plan.count, plan.rate, plan.t0
    acked = failed = i = 0
    while time.time() < t0:
        time.sleep(min(0.01, max(0.0, t0 - time.time())))
    rec.set("t_first", time.time())
    while i < n:
        ids, targets = take_due(plan, rec, rng, i)
        if ids:
            i = ids.stop
            try:
                conn.execute(_ADD_JOBS, {"task": TASK, "tag": plan.tag, "pad": pad, "ids": list(ids), "at": targets})
                for k in ids:
                    state[k] = ACKED
                acked += len(ids)
            except psycopg.Error as exc:  # a failed enqueue is counted, not fatal to the run
                print(f"graphile-worker add_jobs of {len(ids)} jobs failed: {exc}", flush=True)
                for k in ids:
                    state[k] = FAILED
                failed += len(ids)
                if conn.broken:
                    conn = psycopg.connect(url, autocommit=True)
            rec.set("acked", acked)
            rec.set("failed", failed)
        wait = t0 + i / rate - time.time()
        if wait > 0:
            time.sleep(max(wait, tick))
    rec.set("t_last", time.time())
    conn.close()
    rec.set("producer_done", 1.0)


def run_worker(url: str, tag: str, rec: Records, settings: WorkerSettings, node_pid, ready, stop) -> None:
    """Run one graphile-worker Node process and stamp every job run it reports into the Records."""
    quiet_interrupts()
    node = subprocess.Popen([_tool("node"), str(HERE / "worker.js"), "run",
                             settings.for_node(tag=tag)],
                            cwd=HERE, env=_node_env(url), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    node_pid.value = node.pid

    def stop_node() -> None:
        stop.wait()
        node.terminate()  # worker.js stops its runner on SIGTERM, writes what is pending, exits

    threading.Thread(target=stop_node, name="stop-node", daemon=True).start()
    delivered, copies = rec.raw["delivered_at"], rec.raw["copies"]
    for line in node.stdout:
        if line == b"ready\n":
            ready.set()
            continue
        sid, _, ms = line.partition(b" ")
        i = int(sid)
        copies[i] += 1.0
        if math.isnan(delivered[i]):  # the first delivery of this message
            delivered[i] = float(ms) / 1000.0
    code = node.wait()
    if code != 0 and not stop.is_set():
        raise SystemExit(f"the graphile-worker process exited with code {code}")
