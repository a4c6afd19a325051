"""From the per-message records of one step to its figures: summary.json, records.parquet, jitter.png.

Definitions (also in docs/benchmarks/index.md):
- jitter = time the message was readable by the output reader (its local clock, stamped when the
  client handed it over) − its deadline. For pgqueuer: when the job's handler ran − the
  `execute_after` the queue stored.
- early: delivered before deadline − timing advance. `early_published` checks the stricter
  publish time (the output message's CreateTime, set by the firer's producer) the same way.
- publish_lateness = CreateTime − deadline (the scheduler's share); transit = receive time −
  CreateTime (producer batching, broker, fetch: compare with broker_floor_ms).
- lost: acknowledged on the input side, not delivered by the end of the drain wait.
- steady window: deadlines between t0 + max delay and t_last + min delay, where messages come due
  at the offered rate; due_rate counts the deadlines in it, fire_rate the deliveries in it shifted
  by the median jitter (deliveries lag deadlines by that much when the scheduler keeps up).
- backlog: at each instant, messages more than the SLA bound (500 ms) past their deadline and
  not delivered yet; `growing` when its trend over the steady window is upward by more than 1% of
  the offered rate per second.
"""

from __future__ import annotations

import hashlib
import math
import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

import numpy as np

from benchmarks.harness.records import ACKED, FAILED, Records
from kits.figures import percentiles

SLA_P999_MS = 500.0
BACKLOG_GRACE = SLA_P999_MS / 1000.0


def overdue_curve(deadline: np.ndarray, delivered_at: np.ndarray, times: np.ndarray, grace: float) -> np.ndarray:
    """How many messages are more than `grace` s past their deadline and undelivered, at each of `times`."""
    start = deadline + grace
    end = np.where(np.isnan(delivered_at), np.inf, delivered_at)
    overdue = end > start
    starts, ends = np.sort(start[overdue]), np.sort(end[overdue])
    return np.searchsorted(starts, times, side="right") - np.searchsorted(ends, times, side="right")


def enqueue_rate(samples: Sequence[tuple], t_first: float, t_last: float) -> float | None:
    """Rows inserted per second while the load was offered, from samples of pg_stat_user_tables that start
    with (time, n_tup_ins), as harness.samplers.TableStats do.

    PostgreSQL publishes these counters with up to about a second of delay, the same at both
    ends of the window, so the rate over a window of several seconds is right.
    """
    inside = [s for s in samples if t_first + 1.0 <= s[0] <= t_last + 1.0]
    if len(inside) < 2:
        inside = [s for s in samples if t_first <= s[0] <= t_last + 2.0]
    if len(inside) < 2 or inside[-1][0] - inside[0][0] <= 0:
        return None
    return round((inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0]), 1)


def wal_per_message(samples: Sequence, start: float, end: float, rate: float) -> float | None:
    """WAL bytes the server wrote per message within [start, end], from samples with `at` and `wal_bytes`
    (harness.samplers.TableStats): in the steady window every message is written and fired at `rate`, so the
    WAL rate over the offered rate is what one message costs, the vacuums of the window included."""
    inside = [s for s in samples if start <= s.at <= end and getattr(s, "wal_bytes", 0)]
    if len(inside) < 2 or rate <= 0 or inside[-1].at - inside[0].at <= 0:
        return None
    return round((inside[-1].wal_bytes - inside[0].wal_bytes) / (inside[-1].at - inside[0].at) / rate, 1)


def summarize(rec: Records, *, target: str, rate: float, duration: float, delay: tuple[float, float],
              timing_advance_ms: float, probe: tuple[np.ndarray, np.ndarray] | None,
              store_samples: Sequence[tuple], drain_timeout: float, t0: float) -> dict:
    n = int(rec.get("sent"))
    state = rec.state[:n]
    deadline = rec.deadline[:n]
    delivered_at, created_at, copies = rec.delivered_at[:n], rec.created_at[:n], rec.copies[:n]
    acked = state == ACKED
    got = ~np.isnan(delivered_at)
    t_first, t_last = rec.get("t_first"), rec.get("t_last")
    jitter_ms = (delivered_at[got] - deadline[got]) * 1000.0
    early = int(np.count_nonzero(jitter_ms < -timing_advance_ms))
    with np.errstate(invalid="ignore"):
        has_created = got & ~np.isnan(created_at)
        early_published = int(np.count_nonzero(
            created_at[has_created] * 1000.0 < np.round(deadline[has_created] * 1000.0) - timing_advance_ms))
    lost_mask = acked & ~got
    lost = int(np.count_nonzero(lost_mask))
    delivered = int(np.count_nonzero(got))
    duplicates = int(copies[got].sum()) - delivered
    dmin, dmax = delay
    steady = (t_first + dmax, t_last + dmin)
    if steady[1] - steady[0] < 2.0:  # load shorter than the delay spread: use every due message
        steady = (t_first + dmin, t_last + dmax)
    span = max(steady[1] - steady[0], 1e-9)
    # deliveries lag deadlines by the jitter: count them in the window shifted by the median jitter
    lag = float(np.median(jitter_ms)) / 1000.0 if jitter_ms.size else 0.0
    fired = got & (delivered_at >= steady[0] + lag) & (delivered_at < steady[1] + lag)
    fire_rate = float(np.count_nonzero(fired)) / span
    due_rate = float(np.count_nonzero(acked & (deadline >= steady[0]) & (deadline < steady[1]))) / span
    send_rate = float(np.count_nonzero(acked)) / max(t_last - t_first, 1e-9) if n > 1 else 0.0

    times = np.arange(t_first, max(t_last + dmax + 1.0, t_first + 1.0), 0.5)
    curve = overdue_curve(deadline[acked], delivered_at[acked], times, BACKLOG_GRACE)
    in_steady = (times >= steady[0]) & (times <= steady[1])
    slope = float(np.polyfit(times[in_steady] - times[0], curve[in_steady], 1)[0]) if in_steady.sum() >= 4 else 0.0
    growing = slope > max(1.0, 0.01 * rate) and curve[in_steady][-1:].sum() > 0.01 * rate

    floor = None
    if probe is not None:
        p_sent, p_lat = probe
        window = (p_sent >= t_first) & (p_sent <= t_last + dmax)
        samples = p_lat[window] if window.sum() >= 100 else p_lat
        floor = percentiles(samples * 1000.0)

    jitter = percentiles(jitter_ms)
    # Where the jitter arises: before the publish (scheduler) or after it (producer, broker, reader).
    # The publish time is the output message's CreateTime, in whole milliseconds.
    publish_ms = (created_at[has_created] - deadline[has_created]) * 1000.0
    transit_ms = (delivered_at[has_created] - created_at[has_created]) * 1000.0
    failed_send = int(np.count_nonzero(state == FAILED))
    checks = {
        "p999_within_500ms": jitter is not None and jitter["p999"] <= SLA_P999_MS,
        "nothing_lost": lost == 0 and n > 0,
        "nothing_early": early == 0,
        "fire_rate_keeps_up": fire_rate >= 0.98 * due_rate,
        "load_offered_in_full": send_rate >= 0.98 * rate and failed_send == 0 and n >= 0.99 * rate * duration,
        "backlog_not_growing": not growing,
    }
    return {
        "target": target,
        "offered_rate": rate,
        "duration_s": duration,
        "sent": int(np.count_nonzero(acked)),
        "send_failed": failed_send,
        "send_rate": round(send_rate, 1),
        "delivered": delivered,
        "lost": lost,
        "lost_ids": [int(i) for i in np.flatnonzero(lost_mask)[:20]],
        "duplicates": duplicates,
        "early": early,
        "early_published": early_published,
        "enqueue_rate": enqueue_rate(store_samples, t_first, t_last),
        "wal_bytes_per_message": wal_per_message(store_samples, steady[0], steady[1], rate),
        "fire_rate": round(fire_rate, 1),
        "due_rate": round(due_rate, 1),
        "steady_window_s": [round(steady[0] - t0, 2), round(steady[1] - t0, 2)],
        "jitter_ms": jitter,
        "broker_floor_ms": floor,
        "publish_lateness_ms": percentiles(publish_ms),
        "transit_ms": percentiles(transit_ms),
        "scheduler_share_p999_ms": (round(jitter["p999"] - floor["p999"], 3) if jitter and floor else None),
        "backlog": {"grace_ms": BACKLOG_GRACE * 1000, "max": int(curve.max()) if curve.size else 0,
                    "at_end_of_load": int(curve[times <= t_last][-1]) if (times <= t_last).any() else 0,
                    "trend_per_s": round(slope, 2), "growing": bool(growing)},
        "sla": {"bound_p999_ms": SLA_P999_MS, "timing_advance_ms": timing_advance_ms, "drain_timeout_s": drain_timeout,
                "checks": checks},
        "sla_pass": all(checks.values()),
        # the design's guarantee, stricter than `early`: the publish time (CreateTime) itself
        "never_published_early": early_published == 0,
    }


def count_reread(summary: dict, accounted: dict) -> dict:
    """Take the messages the live reader passed over, yet found on the output topic when it was read again
    from its start (`accounted`: benchmarks.harness.accounting.account), out of `lost`: they were delivered.
    A reader at the head of the embedded broker's topic can pass over a few (docs/operations/embedded-stack.md).
    Their delivery times are unknown, so the jitter and the fire rate still count only what the reader saw."""
    found = int(accounted.get("by_state", {}).get("delivered_after_all", 0))
    summary["found_on_reread"] = found
    summary["lost"] -= found
    checks = summary["sla"]["checks"]
    checks["nothing_lost"] = summary["lost"] == 0 and summary["sent"] > 0
    summary["sla_pass"] = all(checks.values())
    return summary


def machine_info() -> dict:
    info = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "hostname": platform.node()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["mem_total_gb"] = round(int(line.split()[1]) / 1024 / 1024, 1)
                break
    except OSError:
        pass
    info["loadavg"] = list(os.getloadavg())
    return info


def _git(root: Path) -> tuple[str, bool] | None:
    """The commit checked out at `root` and whether tracked files differ from it; None without git."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=5).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                    capture_output=True, text=True, timeout=5).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None
    return commit, dirty


def service_root() -> Path:
    """The checkout whose `chronos` the stack's processes import. They run in directories of their own, so
    the first `PYTHONPATH` entry holding a `chronos` package wins (this process, run with `python -m` from
    the harness's checkout, imports that checkout's own first); else the package installed."""
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and (Path(entry) / "chronos" / "__init__.py").is_file():
            return Path(entry).resolve()
    import chronos
    return Path(chronos.__file__).resolve().parents[1]


def code_version(service: Path | None = None) -> dict:
    """The harness's commit, and a fingerprint of the service that ran (`service_root`): a `PYTHONPATH`
    naming another checkout runs that checkout's service under this harness, for an A/B of two versions;
    its commit is then given too."""
    harness = Path(__file__).resolve().parents[2]  # the checkout: benchmarks/harness/report.py
    service = service_root() if service is None else service
    head = _git(harness)
    if head is None:
        return {}
    # the working tree may hold uncommitted service changes: fingerprint what actually ran
    digest = hashlib.sha256()
    for path in sorted([*service.glob("chronos/**/*.py"), *service.glob("chronos/**/*.sql"),
                        *service.glob("native/*.pyx")]):
        digest.update(str(path.relative_to(service)).encode())
        digest.update(path.read_bytes())
    version = {"git_commit": head[0], "git_dirty": head[1], "service_tree_sha256": digest.hexdigest()[:16]}
    if service != harness:
        other = _git(service)
        version["service_dir"] = str(service)
        if other is not None:
            version["service_commit"], version["service_dirty"] = other
    return version


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_records(rec: Records, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    n = int(rec.get("sent"))
    got = ~np.isnan(rec.delivered_at[:n])
    ids = np.flatnonzero(got)
    table = pa.table({
        "id": pa.array(ids, type=pa.int64()),
        "deadline": rec.deadline[:n][got],
        "sent_at": rec.sent_at[:n][got],
        "delivered_at": rec.delivered_at[:n][got],
        "published_at": rec.created_at[:n][got],
        "copies": rec.copies[:n][got].astype(np.int32),
    })
    pq.write_table(table, path, compression="zstd")


def write_plot(rec: Records, summary: dict, probe: tuple[np.ndarray, np.ndarray] | None, t0: float,
               path: Path) -> bool:
    """Jitter distribution and jitter over time; False (and no file) when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    n = int(rec.get("sent"))
    got = ~np.isnan(rec.delivered_at[:n])
    deadline = rec.deadline[:n][got]
    jitter = (rec.delivered_at[:n][got] - deadline) * 1000.0
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 8))
    title = (f"{summary['target']} at {summary['offered_rate']:g} msg/s, delay {summary['config']['delay']}: "
             f"p50 {summary['jitter_ms']['p50']:.1f} / p99 {summary['jitter_ms']['p99']:.1f} / "
             f"p99.9 {summary['jitter_ms']['p999']:.1f} ms" if summary.get("jitter_ms") else summary["target"])
    fig.suptitle(title)
    if probe is not None:
        keep = probe[0] >= rec.get("t_first")  # leave out the probe's warm-up before the load
        probe = (probe[0][keep], probe[1][keep])
    if jitter.size:
        lo, hi = float(np.min(jitter)), float(np.max(jitter))
        if probe is not None and probe[1].size:
            lo, hi = min(lo, float(probe[1].min() * 1000.0)), max(hi, float(probe[1].max() * 1000.0))
        bins = np.linspace(lo, hi if hi > lo else lo + 1, 200)
        ax1.hist(jitter, bins=bins, color="tab:blue", alpha=0.8, label="jitter")
        if probe is not None and probe[1].size:
            ax1.hist(probe[1] * 1000.0, bins=bins, color="tab:orange", alpha=0.6, label="broker floor (probe)")
        for key, style in (("p50", ":"), ("p99", "--"), ("p999", "-")):
            ax1.axvline(summary["jitter_ms"][key], color="k", linestyle=style, linewidth=0.8, label=key)
        ax1.set_yscale("log")
        ax1.set_xlabel("ms after the deadline")
        ax1.set_ylabel("messages")
        ax1.legend(fontsize=8)
        rng = np.random.default_rng(0)
        pick = rng.choice(jitter.size, size=min(jitter.size, 60000), replace=False)
        ax2.scatter(deadline[pick] - t0, jitter[pick], s=1, alpha=0.3, color="tab:blue", label="jitter")
        seconds = np.floor(deadline - t0).astype(int)
        order = np.argsort(seconds, kind="stable")
        secs, starts = np.unique(seconds[order], return_index=True)
        groups = np.split(jitter[order], starts[1:])
        ax2.plot(secs + 0.5, [np.percentile(g, 99) for g in groups], color="tab:red", linewidth=1,
                 label="p99 per second")
        if probe is not None and probe[1].size:
            ax2.plot(probe[0] - t0, probe[1] * 1000.0, color="tab:orange", linewidth=0.5, alpha=0.7,
                     label="broker floor (probe)")
        ax2.set_xlabel("deadline, s after the load started")
        ax2.set_ylabel("jitter, ms")
        ax2.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def finite(obj):
    """JSON-safe: NaN/inf become None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj
