"""The same workload through pgqueuer (`--target pgqueuer`), for a side-by-side comparison.

The producer process enqueues each message as a pgqueuer job with `execute_after` = its delay
(pgqueuer stores `NOW() + execute_after`), in one batched `enqueue` per tick, the way an
application with this rate would. Worker processes run a `QueueManager` whose entrypoint only
records when each job runs; jitter = that time − the job's stored `execute_after`.

Tuning, per pgqueuer's performance guide: asyncpg driver, one direct connection per
QueueManager, `durability=balanced` (the queue table stays logged, like Chronos's table; only
pgqueuer's log and statistics tables are unlogged), its recommended autovacuum settings, and a
batch size fit for short jobs. pgqueuer is imported only inside these processes.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass
from datetime import timedelta

from benchmarks.harness.kafka_load import LoadPlan, quiet_interrupts, take_due
from benchmarks.harness.records import ACKED, FAILED, Records

ENTRYPOINT = "chronos_bench"
TABLE = "pgqueuer"


@dataclass(frozen=True)
class WorkerSettings:
    batch_size: int = 100
    dequeue_timeout: float = 1.0


def _run(coro) -> None:
    try:
        import uvloop
        uvloop.run(coro)
    except ImportError:
        asyncio.run(coro)


async def _connect(url: str):
    import asyncpg
    return await asyncpg.connect(url)


def install(url: str) -> str:
    """A fresh pgqueuer schema (balanced durability, pgqueuer's autovacuum settings); returns its version."""
    import pgqueuer
    from pgqueuer.adapters.persistence import qb
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    async def main() -> None:
        conn = await _connect(url)
        try:
            settings = qb.DBSettings(durability=qb.Durability.balanced)
            queries = Queries(AsyncpgDriver(conn), qbe=qb.QueryBuilderEnvironment(settings))
            if await queries.schema_is_installed():
                await queries.uninstall()
            await queries.install()
            await queries.optimize_autovacuum()
        finally:
            await conn.close()

    _run(main())
    return pgqueuer.__version__


def run_producer(url: str, plan: LoadPlan, rec: Records, tick: float = 0.005) -> None:
    """Enqueue the load: every tick, one batched enqueue of the messages due by then."""
    quiet_interrupts()

    async def main() -> None:
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries

        conn = await _connect(url)
        queries = Queries(AsyncpgDriver(conn))
        rng = random.Random(plan.seed)
        pad = random.Random(plan.seed + 1).randbytes(plan.payload_bytes)
        tag = plan.tag.encode()
        state = rec.raw["state"]
        n, rate, t0 = plan.count, plan.rate, plan.t0
        acked = failed = i = 0
        while time.time() < t0:
            await asyncio.sleep(min(0.01, max(0.0, t0 - time.time())))
        rec.set("t_first", time.time())
        while i < n:
            idx, targets = take_due(plan, rec, rng, i)
            if idx:
                payloads = [b"%s|%d|%s" % (tag, k, pad) for k in idx]
                i = idx.stop
                now = time.time()
                try:
                    await queries.enqueue([ENTRYPOINT] * len(payloads), payloads, [0] * len(payloads),
                                          [timedelta(seconds=target - now) for target in targets])
                    for k in idx:
                        state[k] = ACKED
                    acked += len(payloads)
                except Exception as exc:  # noqa: BLE001 - a failed enqueue is counted, not fatal to the run
                    print(f"pgqueuer enqueue of {len(payloads)} jobs failed: {exc}", flush=True)
                    for k in idx:
                        state[k] = FAILED
                    failed += len(payloads)
                rec.set("acked", acked)
                rec.set("failed", failed)
            wait = t0 + i / rate - time.time()
            if wait > 0:
                await asyncio.sleep(max(wait, tick))
        rec.set("t_last", time.time())
        await conn.close()
        rec.set("producer_done", 1.0)

    _run(main())


def run_worker(url: str, tag: str, rec: Records, settings: WorkerSettings, ready, stop) -> None:
    """A pgqueuer QueueManager whose only job is to note when each job runs."""
    quiet_interrupts()

    async def main() -> None:
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.qm import QueueManager
        from pgqueuer.queries import Queries

        conn = await _connect(url)
        qm = QueueManager(Queries(AsyncpgDriver(conn)))
        tag_b = tag.encode()
        delivered, deadline, copies = rec.raw["delivered_at"], rec.raw["deadline"], rec.raw["copies"]
        isnan = math.isnan

        # Counts are derived from the arrays by the orchestrator: several workers may run.
        @qm.entrypoint(ENTRYPOINT)
        async def record(job) -> None:
            now = time.time()
            run, sid, _ = job.payload.split(b"|", 2)
            if run != tag_b:
                return
            i = int(sid)
            copies[i] += 1.0
            if isnan(delivered[i]):
                delivered[i] = now
                # the target pgqueuer really stored: NOW() of the enqueue + execute_after
                deadline[i] = job.execute_after.timestamp()

        async def watch() -> None:
            while not stop.is_set():
                await asyncio.sleep(0.1)
            qm.shutdown.set()

        watcher = asyncio.create_task(watch())
        ready.set()
        await qm.run(batch_size=settings.batch_size, dequeue_timeout=timedelta(seconds=settings.dequeue_timeout),
                     log_aggregation_interval=timedelta(0))
        await watcher
        await conn.close()

    _run(main())
