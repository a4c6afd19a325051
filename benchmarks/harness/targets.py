"""The system under test, as a step of load sees it: Chronos (a `chronos up` stack), or a PostgreSQL queue
it is compared with (pgqueuer, graphile-worker: pgq_target.py, graphile_target.py), on the stack's server.
A target says where its queue table is, starts what reads its output, makes the load producer, and names
the processes whose CPU counts."""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks.harness import kafka_load
from benchmarks.harness.database import database_url_for, ensure_database
from benchmarks.harness.records import Records
from kits.stack import StackFailed, supervisor
from chronos.up.supervisor import SupervisorError

PGQ_DATABASE = "chronos_bench_pgqueuer"
GRAPHILE_DATABASE = "chronos_bench_graphile"
LAYOUT_OPTIONS = ("consumers", "firers", "detectors")


def format_layout(counts: dict[str, int]) -> str:
    """consumers/firers/detectors, e.g. "2/2/2"."""
    return "/".join(str(counts[name]) for name in LAYOUT_OPTIONS)


def add_peer_arguments(p: argparse.ArgumentParser) -> None:
    """The options of the peers' workers."""
    g = p.add_argument_group("--target pgqueuer")
    g.add_argument("--pgq-workers", type=int, default=1, help="QueueManager processes (default 1)")
    g.add_argument("--pgq-batch-size", type=int, default=100, help="QueueManager batch_size (default 100)")
    g.add_argument("--pgq-dequeue-timeout", type=float, default=1.0,
                   help="QueueManager dequeue_timeout, s (default 1; deferred jobs shorten it)")
    g = p.add_argument_group("--target graphile (graphile-worker's throughput settings by default)")
    g.add_argument("--gw-workers", type=int, default=1, help="graphile-worker Node processes (default 1)")
    g.add_argument("--gw-concurrency", type=int, default=24, help="concurrentJobs per worker (default 24)")
    g.add_argument("--gw-poll-interval-ms", type=int, default=100,
                   help="pollInterval, ms: how soon a job that fell due is found (default 100, pgqueuer's bound)")
    g.add_argument("--gw-local-queue-size", type=int, default=500,
                   help="localQueue.size: jobs each fetch locks and pulls (default 500)")


class Target:
    """What a step needs to know about the system under test, and how to start its processes."""

    name = ""
    table = ""

    def __init__(self, args: argparse.Namespace, info: dict):
        self.args, self.info = args, info

    @property
    def database_url(self) -> str:
        raise NotImplementedError

    def config(self) -> dict:
        raise NotImplementedError

    def start_consumers(self, ctx, tag: str, rec: Records, stop) -> list:
        raise NotImplementedError

    def producer(self, ctx, plan: kafka_load.LoadPlan, rec: Records):
        raise NotImplementedError

    def cpu_groups(self) -> dict[str, tuple[int, bool]]:
        groups = {}
        cells = self.info.get("cell_postgres_pids") or {}
        if cells:  # a stack of several cells: each cell's PostgreSQL on its own (the ready file's postgres_pid is the first's)
            groups.update({f"postgres-{cell}": (pid, True) for cell, pid in cells.items()})
        elif self.info.get("postgres_pid"):
            groups["postgres"] = (self.info["postgres_pid"], True)
        return groups

    def layout(self) -> str:
        """The processes doing the work, as the summary shows them (e.g. 1/1/1, or "2 workers")."""
        raise NotImplementedError

    @staticmethod
    def prepare() -> None:
        """What the target needs installed, checked before any stack or database starts."""


class ChronosTarget(Target):
    name = "chronos"
    table = "chronos_messages"

    def __init__(self, args, info):
        super().__init__(args, info)
        self.producer_conf, self.reader_conf = kafka_load.client_configs(
            info["bootstrap_servers"], info.get("kafka_properties") or {}, args.fetch_wait_ms, args.linger_ms)
        self.probe_topic: str | None = None

    @property
    def database_url(self) -> str:
        return self.info["database_url"]

    def config(self) -> dict:
        return {"producer": self.producer_conf, "reader": self.reader_conf,
                "stack": {k: v for k, v in self.info.items() if not k.endswith("_pid") and k != "pid"}}

    def start_consumers(self, ctx, tag, rec, stop):
        from chronos.adapters.kafka.admin import create_topics
        self.probe_topic = f"chronos-bench-probe-{tag}"
        # as many partitions as the output topic, so the broker's per-partition work is alike
        create_topics(self.info["bootstrap_servers"], {self.probe_topic: self.output_partitions()},
                      client_config=self.info.get("kafka_properties"))
        ready_r, ready_p = ctx.Event(), ctx.Event()
        reader = ctx.Process(target=kafka_load.run_reader, name="bench-reader", daemon=True,
                             args=(self.reader_conf, self.info["output_topic"], tag, rec, ready_r, stop))
        cap = int((self.args.duration + self.args.delay[1] + self.args.drain_timeout + 60)
                  * 1000.0 / self.args.probe_interval_ms)
        self.probe_sent, self.probe_lat, self.probe_count = ctx.RawArray("d", cap), ctx.RawArray("d", cap), \
            ctx.RawValue("d", 0.0)
        probe = ctx.Process(target=kafka_load.run_probe, name="bench-probe", daemon=True,
                            args=({**self.producer_conf, "linger.ms": str(self.args.probe_linger_ms)},
                                  self.reader_conf, self.probe_topic,
                                  self.args.probe_interval_ms / 1000.0, self.probe_sent, self.probe_lat,
                                  self.probe_count, ready_p, stop))
        reader.start()
        probe.start()
        wait_ready([(reader, ready_r), (probe, ready_p)])
        return [reader, probe]

    def output_partitions(self) -> int:
        from chronos.adapters.kafka.admin import admin_client
        admin = admin_client(self.info["bootstrap_servers"], self.info.get("kafka_properties"))
        md = admin.list_topics(self.info["output_topic"], timeout=10)
        return max(1, len(md.topics[self.info["output_topic"]].partitions))

    def probe(self) -> tuple[np.ndarray, np.ndarray]:
        k = int(self.probe_count.value)
        return (np.frombuffer(self.probe_sent, dtype=np.float64)[:k].copy(),
                np.frombuffer(self.probe_lat, dtype=np.float64)[:k].copy())

    def drop_probe_topic(self) -> None:
        if not self.probe_topic:
            return
        from chronos.adapters.kafka.admin import admin_client
        try:
            admin = admin_client(self.info["bootstrap_servers"], self.info.get("kafka_properties"))
            for fut in admin.delete_topics([self.probe_topic], operation_timeout=10).values():
                fut.result(10)
        except Exception as exc:  # noqa: BLE001 - the probe topic is small; leaving it behind is harmless
            print(f"could not delete the probe topic {self.probe_topic}: {exc}", flush=True)

    def producer(self, ctx, plan, rec):
        return ctx.Process(target=kafka_load.run_producer, name="bench-producer", daemon=True,
                           args=(self.producer_conf, self.info["input_topic"], plan, rec))

    def programs(self) -> list[dict] | None:
        """supervisord's process list of the stack, or None when it cannot be asked."""
        if not self.info.get("supervisor_socket"):
            return None
        try:
            return supervisor(self.info).programs()
        except SupervisorError as exc:
            print(f"cannot list the stack's programs: {exc}", flush=True)
            return None

    def cpu_groups(self):
        groups = super().cpu_groups()
        if self.info.get("broker_pid"):
            groups["broker"] = (self.info["broker_pid"], False)
        for proc in self.programs() or []:
            if proc["pid"]:
                groups[proc["name"]] = (proc["pid"], False)
        return groups

    def counts(self) -> dict[str, int]:
        """Processes per role: what supervisord runs (a --ready-file stack's own), else what was asked."""
        running = self.programs()
        if running is None:
            return {name: getattr(self.args, name) for name in LAYOUT_OPTIONS}
        return {f"{role}s": sum(1 for p in running if p["group"] == role) for role in ("consumer", "firer", "detector")}

    def layout(self):
        return format_layout(self.counts())


class PeerTarget(Target):
    """A PostgreSQL queue compared with Chronos: its own database on the stack's server, its producer
    and workers from its module (`run_producer`, `run_worker`), no broker and so no probe."""

    database = ""

    def __init__(self, args, info):
        super().__init__(args, info)
        self._url = database_url_for(info["database_url"], self.database)
        ensure_database(info["database_url"], self.database)

    @property
    def database_url(self) -> str:
        return self._url

    def module(self):
        raise NotImplementedError

    def producer(self, ctx, plan, rec):
        return ctx.Process(target=self.module().run_producer, name=f"bench-{self.name}-producer", daemon=True,
                           args=(self._url, plan, rec))

    def probe(self):
        return None

    def drop_probe_topic(self):
        pass


class PgqueuerTarget(PeerTarget):
    name = "pgqueuer"
    table = "pgqueuer"
    database = PGQ_DATABASE

    def __init__(self, args, info):
        super().__init__(args, info)
        self.settings = self.module().WorkerSettings(batch_size=args.pgq_batch_size,
                                                     dequeue_timeout=args.pgq_dequeue_timeout)
        self.version = self.module().install(self._url)

    def module(self):
        from benchmarks.harness import pgq_target
        return pgq_target

    def config(self) -> dict:
        return {"pgqueuer_version": self.version, "driver": "asyncpg", "durability": "balanced",
                "autovacuum": "pgqueuer recommended (optimize_autovacuum)", "workers": self.args.pgq_workers,
                "batch_size": self.settings.batch_size, "dequeue_timeout_s": self.settings.dequeue_timeout,
                "enqueue": "one batched Queries.enqueue per 5 ms tick, execute_after = deadline - now"}

    def start_consumers(self, ctx, tag, rec, stop):
        procs = []
        for k in range(self.args.pgq_workers):
            ready = ctx.Event()
            proc = ctx.Process(target=self.module().run_worker, name=f"bench-pgq-worker-{k}", daemon=True,
                               args=(self._url, tag, rec, self.settings, ready, stop))
            proc.start()
            procs.append((proc, ready))
        wait_ready(procs)
        self.workers = [p for p, _ in procs]
        return self.workers

    def layout(self):
        return f"{self.args.pgq_workers} worker{'s' if self.args.pgq_workers > 1 else ''}"


class GraphileTarget(PeerTarget):
    name = "graphile"
    table = "graphile_worker._private_jobs"
    database = GRAPHILE_DATABASE

    def __init__(self, args, info):
        super().__init__(args, info)
        self.settings = self.module().WorkerSettings(concurrency=args.gw_concurrency,
                                                     max_pool_size=args.gw_concurrency + 1,
                                                     poll_interval_ms=args.gw_poll_interval_ms,
                                                     local_queue_size=args.gw_local_queue_size)
        self.version = self.module().install_schema(self._url, self.settings)
        self.node_pids: list = []

    def module(self):
        from benchmarks.harness import graphile_target
        return graphile_target

    @staticmethod
    def prepare():
        from benchmarks.harness import graphile_target
        graphile_target.ensure_installed()

    def config(self) -> dict:
        s = self.settings
        return {"graphile_worker_version": self.version, "node_version": self.module().node_version(),
                "workers": self.args.gw_workers, "concurrent_jobs": s.concurrency, "max_pool_size": s.max_pool_size,
                "poll_interval_ms": s.poll_interval_ms, "local_queue_size": s.local_queue_size,
                "complete_job_batch_delay_ms": s.complete_job_batch_delay_ms, "prepared_statements": True,
                "enqueue": "one graphile_worker.add_jobs call per 5 ms tick, run_at = deadline"}

    def start_consumers(self, ctx, tag, rec, stop):
        procs = []
        self.node_pids = []
        for k in range(self.args.gw_workers):
            ready, pid = ctx.Event(), ctx.RawValue("i", 0)
            proc = ctx.Process(target=self.module().run_worker, name=f"bench-graphile-reader-{k}", daemon=True,
                               args=(self._url, tag, rec, self.settings, pid, ready, stop))
            proc.start()
            procs.append((proc, ready))
            self.node_pids.append(pid)
        wait_ready(procs)
        return [p for p, _ in procs]

    def cpu_groups(self):
        groups = super().cpu_groups()
        for k, pid in enumerate(self.node_pids):
            groups[f"graphile-worker-{k} (node)"] = (pid.value, False)
        return groups

    def layout(self):
        n = self.args.gw_workers
        return f"{n} worker{'s' if n > 1 else ''} x {self.settings.concurrency} jobs"


TARGETS = {t.name: t for t in (ChronosTarget, PgqueuerTarget, GraphileTarget)}


def wait_ready(procs: list, timeout: float = 60.0) -> None:
    """Wait until each (process, ready event) of `procs` is ready; StackFailed when one exits or `timeout` passes."""
    end = time.monotonic() + timeout
    for proc, ready in procs:
        while not ready.wait(0.2):
            if not proc.is_alive():
                raise StackFailed(f"{proc.name} exited with code {proc.exitcode} before it was ready")
            if time.monotonic() > end:
                raise StackFailed(f"{proc.name} was not ready within {timeout:.0f}s")
