"""PNG charts of a report, drawn from report.json's contents alone (matplotlib, Agg backend)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from chronos.errors import ConfigError

FILES = ("jitter_histogram.png", "jitter_over_time.png", "throughput.png")


def require_matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("the report's charts need matplotlib: install chronos-scheduler[spark] "
                          "(or pass --no-charts)") from None
    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt
    return plt


def _times(points: list[dict[str, Any]]) -> list[datetime]:
    return [datetime.fromisoformat(p["t"].replace("Z", "+00:00")) for p in points]


def render(report: dict[str, Any], out_dir: Path) -> list[str]:
    """Write the three charts into out_dir; returns their file names."""
    plt = require_matplotlib()
    j, sla = report["jitter_ms"], report["sla"]["thresholds"]
    title = (f"{report['delivered']:,} delivered: p50 {_fmt(j['p50'])}, p99 {_fmt(j['p99'])}, "
             f"p99.9 {_fmt(j['p999'])}, max {_fmt(j['max'])} ms")

    fig, ax = plt.subplots(figsize=(10, 5))
    hist = j["histogram"]
    if hist["counts"]:
        edges = hist["edges"]
        ax.stairs(hist["counts"], edges, fill=True, alpha=0.8, label="messages")
        ax.set_yscale("log")
    for name, style in (("p50", ":"), ("p99", "--"), ("p999", "-")):
        if j[name] is not None:
            ax.axvline(j[name], color="black", linestyle=style, linewidth=1, label=f"{name} {j[name]:.1f} ms")
    ax.axvline(sla["early_ms"], color="tab:red", linewidth=1, label=f"earliest allowed {sla['early_ms']:g} ms")
    ax.set_xlabel("jitter (ms): delivered − deadline")
    ax.set_ylabel("messages (log)")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize="small")
    _save(plt, fig, out_dir / FILES[0])

    fig, ax = plt.subplots(figsize=(10, 5))
    series = j["series"]
    if series:
        times = _times(series)
        for name, style, color in (("p50", "-", "tab:blue"), ("p99", "-", "tab:orange"), ("p999", "-", "tab:green"),
                                   ("max", ":", "gray")):
            ax.plot(times, [p[name] for p in series], style, color=color, linewidth=1, label=name)
    ax.axhline(sla["p999_ms"], color="tab:red", linestyle="--", linewidth=1, label=f"SLA p99.9 {sla['p999_ms']:g} ms")
    ax.axhline(sla["early_ms"], color="tab:red", linestyle=":", linewidth=1)
    ax.set_ylabel("jitter (ms)")
    ax.set_xlabel(f"deadline (UTC), per {report['throughput']['bucket_seconds']} s")
    ax.set_title("jitter over time")
    ax.legend(loc="upper right", fontsize="small")
    fig.autofmt_xdate()
    _save(plt, fig, out_dir / FILES[1])

    fig, ax = plt.subplots(figsize=(10, 4))
    points = report["throughput"]["series"]
    if points:
        ax.plot(_times(points), [p["per_s"] for p in points], linewidth=1)
    ax.set_ylabel("delivered per second")
    ax.set_xlabel(f"delivered (UTC), per {report['throughput']['bucket_seconds']} s")
    ax.set_title(f"throughput: mean {_fmt(report['throughput']['mean_per_s'])}/s, "
                 f"peak {_fmt(report['throughput']['peak_per_s'])}/s")
    fig.autofmt_xdate()
    _save(plt, fig, out_dir / FILES[2])
    return list(FILES)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def _save(plt, fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
