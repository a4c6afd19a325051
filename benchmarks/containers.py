"""`python -m benchmarks.containers`: what each Chronos process uses in a container of the image, for the
Kubernetes manifests' requests and limits (docs/operations/containers.md).

    python -m benchmarks.containers --out benchmarks/results/2026-11-28/containers/resources.json

The image of this checkout (`make image`, up to date or made first), one container of each role against a
PostgreSQL and a broker of the benchmark's own, and a steady load of `--rate` messages a second (delays of
0.5-5 s, a tenth already late) for `--duration` seconds after `--warmup`. Every second, each container's CPU
time and resident memory, all its processes together (tini and chronos), read from /proc. Written, per role:
the mean CPU in cores, the highest over `--window` seconds, and the highest resident memory; and how many
messages were sent and delivered.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from pathlib import Path

import orjson

from benchmarks.harness import report
from benchmarks.harness.database import migrated_postgres
from kits.traffic import Load, Reader
from kits.podman import Container, make_image, run
from benchmarks.harness.procstat import cpu_seconds, rss_mb
from chronos import __version__
from chronos.adapters.kafka.admin import create_topics
from chronos.adapters.kafka.clients import EMBEDDED_GROUP_TIMEOUTS
from chronos.embedded.broker import EmbeddedBroker
from chronos.embedded.procs import descendants, free_port

ROLES = ("consumer", "firer", "detector")


def usage(container: Container) -> tuple[float, float]:
    """(CPU seconds so far, resident MB) of every process of the container."""
    root = container.pid
    pids = [root, *descendants(root)]
    cpu = sum(c for p in pids if (c := cpu_seconds(p)) is not None)
    rss = sum(r for p in pids if (r := rss_mb(p)) is not None)
    return cpu, rss


def measure(rate: float, duration: float, warmup: float, window: float, workdir: Path) -> dict:
    made, _ = make_image()
    image = made[f"localhost/chronos:{__version__}"]
    broker = EmbeddedBroker(log_path=workdir / "broker.log")
    broker.start()
    containers: list[Container] = []
    try:
        with migrated_postgres("chronos-containers-") as pg:
            suffix = uuid.uuid4().hex[:8]
            topics = {"input": f"in-{suffix}", "output": f"out-{suffix}", "dlq": f"dlq-{suffix}"}
            create_topics(broker.bootstrap_servers, {name: 4 for name in topics.values()})
            env = {"CHRONOS_DATABASE_URL": pg.url, "CHRONOS_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
                   "CHRONOS_INPUT_TOPIC": topics["input"], "CHRONOS_OUTPUT_TOPIC": topics["output"],
                   "CHRONOS_DLQ_TOPIC": topics["dlq"],
                   "CHRONOS_KAFKA_PROPERTIES": ",".join(f"{k}={v}" for k, v in EMBEDDED_GROUP_TIMEOUTS.items())}
            by_role = {}
            for role in ROLES:
                port = free_port()
                container = run(image.id, role, env={**env, "CHRONOS_METRICS_PORT": str(port)})
                containers.append(container)
                container.wait_for_log(f"serving /metrics and /healthz on port {port}")
                by_role[role] = container
            reader = Reader(broker.bootstrap_servers, topics["output"])
            reader.start()
            reader.wait_assigned()
            load = Load(broker.bootstrap_servers, topics["input"], rate=rate)
            load.start()
            time.sleep(warmup)
            samples: dict[str, list[tuple[float, float, float]]] = {role: [] for role in ROLES}
            end = time.monotonic() + duration
            while time.monotonic() < end:
                now = time.monotonic()
                for role, container in by_role.items():
                    samples[role].append((now, *usage(container)))
                time.sleep(1.0)
            load.stop()
            missing = reader.missing(set(load.sent), timeout=60)
            reader.stop()
    finally:
        for container in containers:
            container.remove()
        broker.stop()
    roles = {}
    for role, rows in samples.items():
        span = rows[-1][0] - rows[0][0]
        steps = max(1, round(window))
        peaks = [(rows[i + steps][1] - rows[i][1]) / (rows[i + steps][0] - rows[i][0])
                 for i in range(len(rows) - steps)]
        roles[role] = {"cpu_cores_mean": round((rows[-1][1] - rows[0][1]) / span, 3),
                       f"cpu_cores_max_{steps}s": round(max(peaks), 3),
                       "rss_mb_max": round(max(r[2] for r in rows), 1)}
    return {"benchmark": "containers", "date": time.strftime("%Y-%m-%d"), "image": image.tag, "image_id": image.id,
            "rate": rate, "duration_s": duration, "warmup_s": warmup, "sent": len(load.sent),
            "delivered": len(load.sent) - len(missing), "roles": roles, "machine": report.machine_info(),
            "code": report.code_version()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.containers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="messages a second (default 1,000)")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds measured (default 120)")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds of load before measuring (default 20)")
    parser.add_argument("--window", type=float, default=5.0, help="seconds of the highest CPU's window (default 5)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="chronos-containers-") as workdir:
        result = measure(args.rate, args.duration, args.warmup, args.window, Path(workdir))
    args.out.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
