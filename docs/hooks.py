"""MkDocs hooks: the reference pages, generated from the code at every build so they cannot drift.

Each page under docs/reference/ holds its introduction and a `<!-- generated -->` marker that the
matching function below replaces: the settings from `chronos.config.OPTIONS`, the commands and
flags from `chronos.cli.build_parser()`, the metrics from each role's telemetry registry, the
dead-letter reason codes from `chronos.domain.reasons`, the exit codes from `chronos.errors`.
The tests call the same functions (tests/unit/test_docs_reference.py).

It also adds to the site the benchmark figures the pages show, from benchmarks/results/, so they
are not copied into docs/.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any, Callable, Iterable

MARKER = "<!-- generated -->"
ROOT = Path(__file__).resolve().parent.parent
#: Figures of benchmarks/results/ shown by the benchmark pages, published under benchmarks/results/.
RESULT_FIGURES = ("2026-11-21/s2-chronos-1000/jitter.png",)


def _cell(text: Any) -> str:
    """Text for one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(head: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    head = list(head)
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _anchor(env: str) -> str:
    return env.lower().replace("_", "-")


# -- settings -----------------------------------------------------------------------------------

def settings_page(options: Iterable[Any] | None = None) -> str:
    """One row per setting of the settings table: name, variable, flag, default, meaning."""
    from chronos import config
    options = config.OPTIONS if options is None else options
    rows = []
    for opt in options:
        default = f"`{opt.default}`" if opt.default else "unset"
        rows.append((f'<a id="{_anchor(opt.env)}"></a>`{opt.attr}`', f"`{opt.env}`", f"`{opt.flag}`", default,
                     opt.help))
    return _table(("setting", "variable", "flag", "default", "meaning"), rows)


# -- commands and flags -------------------------------------------------------------------------

def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of each sub-command of `parser`, in the order they were added."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            out += [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return out


def arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions
            if a.help != argparse.SUPPRESS and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def _setting_env(action: argparse.Action, envs: set[str]) -> str | None:
    return action.metavar if isinstance(action.metavar, str) and action.metavar in envs else None


def commands_page(parser: argparse.ArgumentParser | None = None) -> str:
    """Each command: what it does, its usage, its own flags, and the settings it takes."""
    from chronos import cli, config
    parser = parser or cli.build_parser()
    envs = {opt.env for opt in config.OPTIONS}
    parts = [_table(("command", "what it does"),
                    ((f"[`{name}`](#{name.replace(' ', '-')})", text) for name, text, _ in commands(parser))),
             "Options of `chronos` itself: " + "; ".join(f"`{a.option_strings[0]}`: {a.help}" for a in arguments(parser))
             + "."]
    for name, text, sub in commands(parser):
        parts.append(f'<a id="{name.replace(" ", "-")}"></a>\n## `{name}`\n\n{_cell(sub.description or text)}')
        own, settings = [], []
        for action in arguments(sub):
            env = _setting_env(action, envs)
            if env is not None:
                settings.append(f"[`{action.option_strings[0]}`](settings.md#{_anchor(env)})")
                continue
            flags = ", ".join(f"`{f}`" for f in action.option_strings) or f"`{action.metavar or action.dest}`"
            default = action.default
            shown = "" if default in (None, False, argparse.SUPPRESS) or isinstance(action, argparse._StoreTrueAction) \
                else f"`{default}`"
            own.append((flags, shown, action.help or ""))
        if own:
            parts.append(_table(("argument", "default", "meaning"), own))
        if settings:
            parts.append("Settings (each also its `CHRONOS_*` variable): " + ", ".join(settings) + ".")
    return "\n\n".join(parts)


def commands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """Every runnable command, depth first: `chronos up`, ..., `chronos pipeline schedule`, ..."""
    out = []

    def walk(prefix: str, p: argparse.ArgumentParser) -> None:
        for name, text, sub in _subcommands(p):
            if _subcommands(sub):
                walk(f"{prefix} {name}", sub)
            else:
                out.append((f"{prefix} {name}", text, sub))
    walk("chronos", parser)
    return out


def exit_codes() -> list[tuple[int, str, str]]:
    """(code, constant, meaning) from chronos/errors.py, whose constants carry their meaning as a comment."""
    import chronos.errors
    text = Path(chronos.errors.__file__).read_text()
    return [(int(m["code"]), m["name"], m["doc"] or "")
            for m in re.finditer(r"^(?P<name>EXIT_\w+) = (?P<code>\d+)[ \t]*(?:#[ \t]*(?P<doc>.*))?$", text, re.M)]


def exit_codes_page() -> str:
    return _table(("exit code", "name", "meaning"), ((code, f"`{name}`", doc) for code, name, doc in exit_codes()))


# -- metrics ------------------------------------------------------------------------------------

def metric_families() -> dict[str, dict[str, Any]]:
    """Every Chronos metric of the three roles' registries: name -> type, help, labels, roles."""
    import os
    import tempfile
    from dataclasses import asdict
    from types import SimpleNamespace

    import orjson

    from chronos.adapters.kafka.watch import ProducerWatch
    from chronos.config import Settings
    from chronos.embedded.watch import STATS_ENV, BrokerStats
    from chronos.ops import telemetry
    found: dict[str, dict[str, Any]] = {}
    # the detector exports the embedded broker's figures from the stats file `chronos up` writes
    stats = tempfile.NamedTemporaryFile(suffix=".json", delete=False)
    stats.write(orjson.dumps(asdict(BrokerStats(rss_bytes=0, messages=0, input_unread=0, sampled_at=0.0))))
    stats.close()
    try:
        for cls in (telemetry.ConsumerTelemetry, telemetry.FirerTelemetry, telemetry.DetectorTelemetry):
            t = cls("00000000-0000-0000-0000-000000000000", Settings(), environ={STATS_ENV: stats.name})
            # what each role's run() attaches to its telemetry (chronos/roles/*.py); a process's real scrape is
            # checked against this list by tests/e2e/test_ops_files.py
            t.follow(dict)
            t.follow_postgres(lambda: [SimpleNamespace(server="db:5432", connects=1, server_changes=0, unanswered=0,
                                                       read_only=0)])
            if isinstance(t, (telemetry.ConsumerTelemetry, telemetry.FirerTelemetry)):
                t.follow_producer(ProducerWatch(t.role, stall_s=10.0, now=0.0))
            if isinstance(t, telemetry.FirerTelemetry):
                t.follow_timing(lambda: 0, SimpleNamespace(latency=0.0, offset_us=0))
            if isinstance(t, telemetry.DetectorTelemetry):  # per-topic gauges have no series until a topic is limited
                t.throttled_gauges([SimpleNamespace(topic="t", rows=0, lateness_s=0.0)])
            for family in t.registry.collect():
                name = {"counter": family.name + "_total", "info": family.name + "_info"}.get(family.type, family.name)
                if not name.startswith("chronos_"):
                    continue  # the client library's process_* and python_* metrics
                labels = sorted({k for s in family.samples for k in s.labels} - {"role", "node", "le"})
                entry = found.setdefault(name, {"type": family.type, "help": family.documentation, "labels": labels,
                                                "roles": []})
                entry["roles"].append(t.role)
    finally:
        os.unlink(stats.name)
    return found


def metrics_page() -> str:
    rows = []
    for name, m in sorted(metric_families().items()):
        labels = ", ".join(f"`{x}`" for x in m["labels"])
        rows.append((f"`{name}`", m["type"], ", ".join(m["roles"]), labels, m["help"]))
    return _table(("metric", "type", "roles", "labels (besides role, node)", "meaning"), rows)


# -- dead-letter reason codes -------------------------------------------------------------------

def reason_codes() -> list[tuple[str, str, str]]:
    """(code, which process gives it, meaning) of every dead-letter reason code."""
    from chronos.domain import reasons
    codes = list(dict.fromkeys((*reasons.CONSUMER_REASONS, *reasons.FIRER_REASONS)))
    out = []
    for code in codes:
        who = " and ".join(r for r, given in (("consumer", reasons.CONSUMER_REASONS), ("firer", reasons.FIRER_REASONS))
                           if code in given)
        out.append((code, who, reasons.DESCRIPTIONS.get(code, "")))
    return out


def reason_codes_page() -> str:
    return _table(("code", "given by", "meaning"), ((f"`{c}`", who, doc) for c, who, doc in reason_codes()))


# -- PostgreSQL failures under load (benchmarks/ha.py) ------------------------------------------

#: The run of `python -m benchmarks.ha` that docs/operations/postgresql-ha.md shows.
HA_RESULT = "2026-11-26/ha.json"

_HA_FAULTS = {
    "kill": "a) the primary's node dies (Patroni and PostgreSQL, SIGKILL)",
    "switchover": "b) planned switchover (`patronictl switchover`)",
    "standby": "c) the synchronous standby dies",
    "freeze": "d) the primary hangs (SIGSTOP) past Patroni's TTL, then thaws",
    "outage": "e) the whole cluster down, then back",
    "firer": "f) a firer frozen (SIGSTOP) past the hold time, then thawed",
}


def _seconds(value: Any) -> str:
    return "-" if value is None else f"{value:g} s" if value >= 0 else "at once"


def ha_page(result: str = HA_RESULT) -> str:
    """The figures of one run of benchmarks/ha.py: one row per scenario, from its result file."""
    import orjson
    data = orjson.loads((ROOT / "benchmarks" / "results" / result).read_bytes())
    rows, carried = [], 0
    for r in data["rows"]:
        name = r["scenario"].removeprefix("ha ")
        logs = r.get("logs") or {}
        first = min(logs.items(), key=lambda kv: kv[1]) if logs else None
        health = ("-" if r.get("health_failed_after_s") is None else
                  f"failed after {r['health_failed_after_s']:g} s, healthy again after "
                  f"{_seconds(r.get('healthy_again_after_s'))}")
        # without a new primary (the standby or a firer lost) firing goes on: its longest pause says how much
        resumed = r.get("resumed_after_fault_s") if r.get("promoted_after_s") is not None else None
        rows.append((_HA_FAULTS.get(name, name), f"{carried:,}", f"{r['lost']} of {r['sent']:,}", r["early"],
                     r["duplicates"], _seconds(r.get("promoted_after_s")), _seconds(resumed),
                     _seconds(r.get("resumed_after_promotion_s")), _seconds(r.get("longest_pause_s")),
                     _seconds(r.get("max_lateness_s")),
                     "-" if r.get("p999_jitter_after_recovery_ms") is None else f"{r['p999_jitter_after_recovery_ms']:g} ms",
                     "-" if first is None else f"`{first[0]}` after {first[1]:g} s", health))
        carried += r["sent"]
    head = (f"Run of {data['date']}: {data['rate']:g} msg/s for each scenario (delays 0.5-5 s, 10% already late), "
            f"layout {data['layout']} (consumers/firers/detectors, a fresh `chronos up` per scenario, hold time 5 s), "
            f"{data['members']} PostgreSQL members on one cluster that carried every scenario's messages in turn "
            f"(`{data['command']}`; result file `benchmarks/results/{result}`).\n\n")
    return head + _table(("fault", "messages the cluster carried before", "acknowledged lost", "early", "duplicates",
                          "new primary after", "firing resumed after the fault", "after the promotion",
                          "longest pause in deliveries", "latest delivery after its due time",
                          "p99.9 jitter after recovery", "first log line", "health"), rows)


# -- MkDocs -------------------------------------------------------------------------------------

GENERATED: dict[str, Callable[[], str]] = {
    "reference/settings.md": settings_page,
    "reference/commands.md": lambda: commands_page() + "\n\n## Exit codes\n\n" + exit_codes_page(),
    "reference/metrics.md": metrics_page,
    "reference/reason-codes.md": reason_codes_page,
    "operations/postgresql-ha.md": ha_page,
}


def on_files(files: Any, config: Any) -> Any:
    """Publish the benchmark figures the pages show, from where the benchmarks wrote them."""
    from mkdocs.structure.files import File
    for figure in RESULT_FIGURES:
        files.append(File.generated(config, f"benchmarks/results/{figure}",
                                    abs_src_path=str(ROOT / "benchmarks" / "results" / figure)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Fill in a reference page's generated part."""
    make = GENERATED.get(page.file.src_uri)
    if make is None:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{page.file.src_uri} lost its {MARKER} marker")
    return markdown.replace(MARKER, make())
