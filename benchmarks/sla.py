"""`python -m benchmarks.sla`: the SLA harness (throughput, jitter, losses) for Chronos, pgqueuer and graphile-worker.

    python -m benchmarks.sla --rate 1000 --duration 60                 # own `chronos up`, default delays 3:10 s
    python -m benchmarks.sla --ready-file .chronos/ready.json ...      # a stack that is already running
    python -m benchmarks.sla --find-max --max-rate 20000               # highest rate that holds the SLA
    python -m benchmarks.sla --target pgqueuer --rate 1000             # the same workload through pgqueuer
    python -m benchmarks.sla --target graphile --rate 1000             # ... through graphile-worker (Node)
    python -m benchmarks.sla --find-max --consumers 2 --firers 2 --detectors 2   # another layout
    python -m benchmarks.sla --rate 5000 -- --batch-size 5000          # after `--`: extra `chronos up` args

Processes: this one orchestrates and reports; a producer process offers the load; a reader
process stamps every output message on arrival (pgqueuer: worker processes stamp every job
run; graphile-worker: a Node worker reports every job run to a Python process that stamps
it); a probe process measures the broker's own produce→consume latency in the same run.
See benchmarks/report.py for the definition of every figure.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import shutil
import sys
import threading
import time
import uuid
import xmlrpc.client
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import orjson

from benchmarks import accounting, kafka_load, report
from benchmarks.procstat import CpuMeter
from benchmarks.records import ACKED, Records
from benchmarks.stack import External, OwnPostgres, Stack, StackFailed, database_url_for, layout_args, run_on, \
    supervisor

PGQ_DATABASE = "chronos_bench_pgqueuer"
GRAPHILE_DATABASE = "chronos_bench_graphile"
LAYOUT_OPTIONS = ("consumers", "firers", "detectors")


def parse_delay(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--delay wants MIN:MAX in seconds, got {text!r}") from None
    if not 0 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"--delay wants 0 <= MIN <= MAX, got {text!r}")
    return lo, hi


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sla", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Arguments after `--` are passed to `chronos up` unchanged, except --consumers, --firers "
                                       "and --detectors, which are taken as the harness's own.")
    p.add_argument("--target", choices=("chronos", "pgqueuer", "graphile"), default="chronos")
    p.add_argument("--ready-file", type=Path, help="drive this running stack instead of starting one")
    p.add_argument("--rate", type=float, default=1000.0, help="offered load, messages/s (default 1000)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    p.add_argument("--delay", type=parse_delay, default=(3.0, 10.0),
                   help="deadline = send time + uniform(MIN, MAX) s (default 3:10)")
    p.add_argument("--payload-bytes", type=int, default=100, help="value size (default 100)")
    p.add_argument("--out", type=Path, help="output directory (default benchmarks/out/<time>-<target>)")
    g = p.add_argument_group("layout of the stack the harness starts (every mode, --find-max included); "
                             "also taken from after `--`")
    add_layout(g)
    g = p.add_argument_group("measurement")
    g.add_argument("--timing-advance-ms", type=float, default=50.0,
                   help="the stack's timing advance: earlier than deadline - this counts as early (default 50)")
    g.add_argument("--fetch-wait-ms", type=int, default=5,
                   help="fetch.wait.max.ms of the output reader and the probe (default 5; see docs/operations/embedded-stack.md)")
    g.add_argument("--linger-ms", type=int, default=25,
                   help="linger.ms of the load producer (default 25: batched produces, as "
                        "docs/operations/embedded-stack.md explains; with 5 its many small batches made the embedded "
                        "broker's fetches slow for everyone)")
    g.add_argument("--probe-linger-ms", type=int, default=0,
                   help="linger.ms of the probe (default 0: the floor is the broker's own produce→readable time)")
    g.add_argument("--probe-interval-ms", type=float, default=25.0,
                   help="one probe message every N ms (default 25: at 5 the probe's own tiny batches loaded the broker)")
    g.add_argument("--drain-timeout", type=float, default=30.0,
                   help="after the last deadline, wait this long for stragglers; the rest count as lost")
    g.add_argument("--progress", type=float, default=5.0, help="seconds between progress lines")
    g.add_argument("--no-records", action="store_true", help="skip records.parquet")
    g.add_argument("--seed", type=int, default=None)
    g = p.add_argument_group("--find-max: doubling, then bisection, one short step each")
    g.add_argument("--find-max", action="store_true")
    g.add_argument("--start-rate", type=float, default=1000.0)
    g.add_argument("--max-rate", type=float, default=40000.0)
    g.add_argument("--step-duration", type=float, default=20.0)
    g.add_argument("--max-steps", type=int, default=8)
    g.add_argument("--tolerance", type=float, default=0.1, help="stop bisecting within this fraction")
    g.add_argument("--reuse-stack", action="store_true",
                   help="run every step on one stack (by default a stack the harness starts is renewed between "
                        "steps: the embedded broker slows down as its topics fill, so a step would inherit the "
                        "load of the ones before)")
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
    return p


def add_layout(parser) -> None:
    for name in LAYOUT_OPTIONS:
        parser.add_argument(f"--{name}", type=int, default=None, metavar="N",
                            help=f"`chronos up --{name}` (default 1)")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The harness's options; `--consumers/--firers/--detectors` after `--` count as the harness's own."""
    parser = build_parser()
    own, up_args = split_argv(argv)
    args = parser.parse_args(own)
    resolve_layout(parser, args, up_args)
    return args


def resolve_layout(parser: argparse.ArgumentParser, args: argparse.Namespace, up_args: list[str]) -> None:
    """Settle args.consumers/firers/detectors (default 1) from the harness's options and those after
    `--`; args.up_args becomes the `chronos up` arguments left over."""
    after = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_layout(after)
    from_up, args.up_args = after.parse_known_args(up_args)
    for name in LAYOUT_OPTIONS:
        mine, theirs = getattr(args, name), getattr(from_up, name)
        if mine is not None and theirs is not None and mine != theirs:
            parser.error(f"--{name} {mine} and, after `--`, --{name} {theirs}: give it once")
        value = mine if mine is not None else theirs if theirs is not None else 1
        if value < 1:
            parser.error(f"--{name} must be at least 1, got {value}")
        setattr(args, name, value)


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


# ---------------------------------------------------------------------------------------------
# the system under test


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
        if self.info.get("postgres_pid"):
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
        reader = ctx.Process(target=kafka_load.run_reader, name="bench-reader",
                             args=(self.reader_conf, self.info["output_topic"], tag, rec, ready_r, stop))
        cap = int((self.args.duration + self.args.delay[1] + self.args.drain_timeout + 60)
                  * 1000.0 / self.args.probe_interval_ms)
        self.probe_sent, self.probe_lat, self.probe_count = ctx.RawArray("d", cap), ctx.RawArray("d", cap), \
            ctx.RawValue("d", 0.0)
        probe = ctx.Process(target=kafka_load.run_probe, name="bench-probe",
                            args=({**self.producer_conf, "linger.ms": str(self.args.probe_linger_ms)},
                                  self.reader_conf, self.probe_topic,
                                  self.args.probe_interval_ms / 1000.0, self.probe_sent, self.probe_lat,
                                  self.probe_count, ready_p, stop))
        reader.start()
        probe.start()
        _wait_ready([(reader, ready_r), (probe, ready_p)])
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
        return ctx.Process(target=kafka_load.run_producer, name="bench-producer",
                           args=(self.producer_conf, self.info["input_topic"], plan, rec))

    def programs(self) -> list[dict] | None:
        """supervisord's process list of the stack, or None when it cannot be asked."""
        if not self.info.get("supervisor_socket"):
            return None
        try:
            return supervisor(self.info).supervisor.getAllProcessInfo()
        except (OSError, xmlrpc.client.Error) as exc:
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
        _ensure_database(info["database_url"], self.database)

    @property
    def database_url(self) -> str:
        return self._url

    def module(self):
        raise NotImplementedError

    def producer(self, ctx, plan, rec):
        return ctx.Process(target=self.module().run_producer, name=f"bench-{self.name}-producer",
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
        from benchmarks import pgq_target
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
            proc = ctx.Process(target=self.module().run_worker, name=f"bench-pgq-worker-{k}",
                               args=(self._url, tag, rec, self.settings, ready, stop))
            proc.start()
            procs.append((proc, ready))
        _wait_ready(procs)
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
        from benchmarks import graphile_target
        return graphile_target

    @staticmethod
    def prepare():
        from benchmarks import graphile_target
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
            proc = ctx.Process(target=self.module().run_worker, name=f"bench-graphile-reader-{k}",
                               args=(self._url, tag, rec, self.settings, pid, ready, stop))
            proc.start()
            procs.append((proc, ready))
            self.node_pids.append(pid)
        _wait_ready(procs)
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


def _ensure_database(url: str, name: str) -> None:
    import psycopg
    with psycopg.connect(url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')  # a constant of this module, not user input


def _wait_ready(procs: list, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    for proc, ready in procs:
        while not ready.wait(0.2):
            if not proc.is_alive():
                raise StackFailed(f"{proc.name} exited with code {proc.exitcode} before it was ready")
            if time.monotonic() > end:
                raise StackFailed(f"{proc.name} was not ready within {timeout:.0f}s")


# ---------------------------------------------------------------------------------------------
# store sampling


class StoreSampler(threading.Thread):
    """Samples pg_stat_user_tables for the queue table once a second: (time, n_tup_ins, n_live_tup)."""

    def __init__(self, url: str, table: str):
        super().__init__(name="store-sampler", daemon=True)
        self.url, self.table = url, table
        self.samples: list[tuple[float, int, int]] = []
        self.stopping = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        import psycopg
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while not self.stopping.is_set():
                    row = conn.execute("SELECT n_tup_ins, n_live_tup FROM pg_stat_user_tables WHERE relname = %s",
                                       (self.table.rpartition(".")[2],)).fetchone()  # without its schema
                    if row is not None:
                        self.samples.append((time.time(), int(row[0]), int(row[1])))
                    self.stopping.wait(1.0)
        except psycopg.Error as exc:
            self.error = str(exc).strip().splitlines()[0]
            print(f"store sampling stopped: {self.error}", flush=True)

    def live_rows(self) -> int | None:
        return self.samples[-1][2] if self.samples else None


def wait_drained(url: str, table: str, timeout: float = 180.0) -> bool:
    """Wait until the queue table is empty on two reads a second apart (between find-max steps)."""
    import psycopg
    end = time.monotonic() + timeout
    empty_reads = 0
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < end:
            n = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # table: a class constant
            empty_reads = empty_reads + 1 if n == 0 else 0
            if empty_reads >= 2:
                return True
            time.sleep(1.0)
    print(f"the {table} table still holds rows after {timeout:.0f}s; going on", flush=True)
    return False


# ---------------------------------------------------------------------------------------------
# one step


def run_step(target: Target, args: argparse.Namespace, rate: float, duration: float, out: Path | None,
             stack=None) -> dict:
    """Offer `rate` msg/s for `duration` s, wait for every due message, measure; returns the summary."""
    ctx = mp.get_context("spawn")
    count = max(1, int(round(rate * duration)))
    tag = uuid.uuid4().hex[:10]
    rec = Records.create(ctx, count)
    stop = ctx.Event()
    dmin, dmax = args.delay
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    layout = target.layout()
    sampler = StoreSampler(target.database_url, target.table)
    sampler.start()
    helpers = target.start_consumers(ctx, tag, rec, stop)
    t0 = time.time() + 1.0
    plan = kafka_load.LoadPlan(tag=tag, rate=rate, count=count, t0=t0, delay_min=dmin, delay_max=dmax,
                               payload_bytes=args.payload_bytes, seed=seed)
    producer = target.producer(ctx, plan, rec)
    meter = CpuMeter({**target.cpu_groups(), **{p.name: (p.pid, False) for p in helpers}})
    date = report.now_iso()
    load_before = os.getloadavg()
    producer.start()
    meter.groups["bench-producer"] = (producer.pid, False)
    meter.start(time.time())
    print(f"step {tag}: {target.name} layout {layout} at {rate:g} msg/s for {duration:g} s, delay {dmin:g}:{dmax:g} s, "
          f"{count} messages", flush=True)
    try:
        drained = _watch(target, args, rec, producer, helpers, sampler, stack, t0, meter)
    except BaseException:
        producer.terminate()  # interrupted or failed: stop offering load at once
        raise
    finally:
        cpu = meter.stop(time.time())
        stop.set()
        for proc in [producer, *helpers]:
            proc.join(15)
            if proc.is_alive():
                print(f"{proc.name} did not stop; terminating it", flush=True)
                proc.terminate()
                proc.join(5)
        sampler.stopping.set()
        sampler.join(5)
    probe = target.probe()
    target.drop_probe_topic()
    summary = report.summarize(rec, target=target.name, rate=rate, duration=duration, delay=args.delay,
                               timing_advance_ms=args.timing_advance_ms, probe=probe,
                               store_samples=sampler.samples, drain_timeout=args.drain_timeout, t0=t0)
    summary["drained"] = drained
    if summary["lost"] and isinstance(target, ChronosTarget):  # where each undelivered message is
        summary["undelivered"] = accounting.account_stack(accounting.undelivered_ids(rec, tag), target.info)
        print(accounting.render(summary["undelivered"]), flush=True)
    summary["layout"] = layout
    summary["cpu"] = cpu
    summary["config"] = {"delay": f"{dmin:g}:{dmax:g}", "payload_bytes": args.payload_bytes, "seed": seed,
                         "tag": tag, "fetch_wait_ms": args.fetch_wait_ms, "linger_ms": args.linger_ms,
                         "probe_linger_ms": args.probe_linger_ms,
                         "probe_interval_ms": args.probe_interval_ms,
                         "counts": {"consumers": args.consumers, "firers": args.firers, "detectors": args.detectors},
                         "chronos_up_args": args.up_args, "target": target.config(), "argv": sys.argv[1:]}
    machine = report.machine_info()
    machine["loadavg_before"] = list(load_before)
    summary["machine"] = machine
    summary["code"] = report.code_version()
    summary["date"] = date
    summary = report.finite(summary)
    print_summary(summary)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
        if not args.no_records:
            report.write_records(rec, out / "records.parquet")
        if not report.write_plot(rec, summary, probe, t0, out / "jitter.png"):
            print("matplotlib is not installed (pip install -e '.[bench]'): no jitter.png", flush=True)
        print(f"wrote {out}", flush=True)
    return summary


def _watch(target, args, rec: Records, producer, helpers, sampler, stack, t0: float, meter: CpuMeter) -> bool:
    """Show progress until every acknowledged message arrived, or the drain timeout; True if all arrived."""
    next_line = time.time() + args.progress
    next_cpu = time.time() + 1.0
    last_delivered, last_t = 0, time.time()
    while True:
        time.sleep(0.25)
        now = time.time()
        for proc in helpers:
            if not proc.is_alive():
                raise StackFailed(f"{proc.name} died (exit code {proc.exitcode})")
        if stack is not None:
            stack.check_alive()
        n, acked_n = int(rec.get("sent")), int(rec.get("acked"))
        delivered = int(np.count_nonzero(~np.isnan(rec.delivered_at[:n])))
        done = rec.get("producer_done") == 1.0
        if not producer.is_alive() and not done:
            raise StackFailed(f"the load producer died (exit code {producer.exitcode})")
        if now >= next_cpu:
            meter.sample()
            next_cpu = now + 1.0
        if now >= next_line:
            rate = (delivered - last_delivered) / max(now - last_t, 1e-9)
            last_delivered, last_t = delivered, now
            live = sampler.live_rows()
            print(f"[{now - t0:6.1f}s] sent {n:>8} acked {acked_n:>8}  delivered {delivered:>8} "
                  f"({rate:7.0f}/s)  overdue>0.5s {rec.overdue(now, 0.5):>6}  "
                  f"store ~{live if live is not None else '?':>7} rows", flush=True)
            next_line = now + args.progress
        if done:
            acked = rec.state[:n] == ACKED
            if int(np.count_nonzero(acked & np.isnan(rec.delivered_at[:n]))) == 0:
                return True
            last_deadline = float(np.nanmax(rec.deadline[:n])) if n else now
            if now > last_deadline + args.drain_timeout:
                return False


def format_layout(counts: dict[str, int]) -> str:
    """consumers/firers/detectors, e.g. "2/2/2"."""
    return "/".join(str(counts[name]) for name in LAYOUT_OPTIONS)


def format_cpu(cpu: dict) -> str:
    """Cores per process, busiest first, and their total: "postgres 0.42, firer_00 0.26 (total 0.68)"."""
    if not cpu:
        return "(not measured)"
    cores = sorted(((v["cores"], name) for name, v in cpu.items()), key=lambda c: (-c[0], c[1]))
    return ", ".join(f"{name} {c:.2f}" for c, name in cores) + f" (total {sum(c for c, _ in cores):.2f})"


def summary_lines(s: dict) -> list[str]:
    """The summary as printed: the verdict line, then the CPU split."""
    j, f = s.get("jitter_ms") or {}, s.get("broker_floor_ms") or {}
    floor = f"  broker floor p50/p99/p99.9 {f['p50']:.1f}/{f['p99']:.1f}/{f['p999']:.1f} ms" if f else ""
    pub = s.get("publish_lateness_ms")
    if pub:
        floor += f"  publish lateness p99/p99.9 {pub['p99']:.0f}/{pub['p999']:.0f} ms"
    return [f"{s['target']} layout {s.get('layout', '?')} {s['offered_rate']:g} msg/s: sent {s['sent']} "
            f"delivered {s['delivered']} lost {s['lost']} "
            f"dup {s['duplicates']} early {s['early']} (published early {s['early_published']})  enqueue {s['enqueue_rate']}/s "
            f"fire {s['fire_rate']}/s (due {s['due_rate']}/s)  jitter p50/p99/p99.9/max "
            f"{j.get('p50', math.nan):.1f}/{j.get('p99', math.nan):.1f}/{j.get('p999', math.nan):.1f}/"
            f"{j.get('max', math.nan):.1f} ms{floor}  backlog max {s['backlog']['max']}  "
            f"SLA {'PASS' if s['sla_pass'] else 'FAIL ' + ','.join(k for k, v in s['sla']['checks'].items() if not v)}",
            f"  cpu (cores): {format_cpu(s.get('cpu'))}"]


def print_summary(s: dict) -> None:
    print("\n".join(summary_lines(s)), flush=True)


# ---------------------------------------------------------------------------------------------
# find-max


def find_max(target: Target, args: argparse.Namespace, out: Path, stack) -> dict:
    """Double the rate while the SLA holds, then bisect between the last pass and the first failure."""
    lo = hi = None
    best: dict | None = None
    rate = args.start_rate
    # The embedded broker's fetches slow down as its topics fill (docs/operations/embedded-stack.md), so on one stack
    # each step would inherit the previous steps' load; a stack the harness owns is renewed.
    fresh = not args.reuse_stack and hasattr(stack, "restart")
    steps = []
    while len(steps) < args.max_steps:
        step_out = out / "steps" / f"{len(steps) + 1:02d}-{int(rate)}"
        s = run_step(target, args, rate, args.step_duration, step_out, stack)
        failed = [k for k, v in s["sla"]["checks"].items() if not v]
        steps.append({"rate": rate, "layout": s["layout"], "sla_pass": s["sla_pass"], "failed": failed,
                      "jitter_p999_ms": (s["jitter_ms"] or {}).get("p999"), "lost": s["lost"],
                      "fire_rate": s["fire_rate"], "backlog_max": s["backlog"]["max"], "cpu": s["cpu"],
                      "dir": str(step_out)})
        if s["sla_pass"]:
            lo, best = rate, s
            best["_dir"] = step_out
        else:
            hi = rate
        if lo is not None and hi is not None and (hi - lo) / lo <= args.tolerance:
            break
        if hi is None:
            if rate >= args.max_rate:
                break
            nxt = min(rate * 2, args.max_rate)
        elif lo is None:
            nxt = rate / 2
            if nxt < 50:
                break
        else:
            nxt = (lo + hi) / 2
        rate = max(50.0, round(nxt / 50.0) * 50.0)
        if fresh:
            print("a fresh stack for the next step ...", flush=True)
            target = type(target)(args, stack.restart())
        else:
            wait_drained(target.database_url, target.table)
    result = {"target": target.name, "layout": steps[-1]["layout"], "max_sustained_rate": lo, "first_failing_rate": hi,
              "steps": steps,
              "step_duration_s": args.step_duration, "bounded_by_max_rate": hi is None and lo == args.max_rate}
    top = dict(best) if best is not None else {"target": target.name, "layout": result["layout"], "sla_pass": False}
    top.pop("_dir", None)
    top["find_max"] = result
    out.mkdir(parents=True, exist_ok=True)
    if best is not None:
        for name in ("records.parquet", "jitter.png"):
            if (best["_dir"] / name).exists():
                shutil.copy(best["_dir"] / name, out / name)
    (out / "summary.json").write_bytes(orjson.dumps(report.finite(top), option=orjson.OPT_INDENT_2))
    print("\n".join(find_max_lines(result)), flush=True)
    return top


def find_max_lines(result: dict) -> list[str]:
    """find-max's summary as printed: the verdict, then each step with its layout and CPU split."""
    lines = [f"find-max {result['target']} layout {result['layout']}: highest rate holding the SLA: "
             f"{result['max_sustained_rate']} msg/s (first failing: {result['first_failing_rate']}); steps:"]
    for st in result["steps"]:
        lines.append(f"  {st['rate']:>8g} msg/s  layout {st['layout']}  {'pass' if st['sla_pass'] else 'FAIL'}  "
                     f"p99.9 {st['jitter_p999_ms']} ms  lost {st['lost']}  {','.join(st['failed'])}")
        lines.append(f"           cpu (cores): {format_cpu(st['cpu'])}")
    return lines


# ---------------------------------------------------------------------------------------------
# main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.rate <= 0 or args.duration <= 0:
        print("--rate and --duration must be positive", file=sys.stderr)
        return 2
    out = args.out or Path("benchmarks/out") / (datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
                                                + f"-{args.target}")
    try:
        TARGETS[args.target].prepare()
    except StackFailed as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr, flush=True)
        return 3
    if args.ready_file:
        stack: Stack | OwnPostgres | External = External(args.ready_file)
    elif args.target == "chronos":
        stack = Stack(*layout_args(args.consumers, args.firers, args.detectors), *args.up_args)
    else:
        stack = OwnPostgres()

    def run(info: dict) -> dict:
        target = TARGETS[args.target](args, info)
        if args.find_max:
            return find_max(target, args, out, stack)
        return run_step(target, args, args.rate, args.duration, out, stack)
    code, summary = run_on(stack, run)
    if summary is None:
        return code
    return 0 if summary.get("sla_pass") else 1


if __name__ == "__main__":
    sys.exit(main())
