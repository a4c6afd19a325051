"""MkDocs hooks: the reference pages, generated from the code at every build so they cannot drift.

Each page under docs/reference/ holds its introduction and a `<!-- generated -->` marker that the
matching function below replaces: the settings from `chronos.config.OPTIONS`, the commands and
flags from `chronos.cli.build_parser()`, the metrics from each role's telemetry registry, the
dead-letter reason codes from `chronos.domain.reasons`, the exit codes from `chronos.errors`.
The tests call the same functions (tests/unit/test_docs_reference.py).

It also adds to the site the benchmark figures the pages show, from benchmarks/results/, so they
are not copied into docs/, and writes every table of figures that comes from a result file: the latest
performance figures (`glance_page`, also the README's table, `readme_table`: a test compares the two),
capacity planning (`capacity_page`), the PostgreSQL failures (`ha_page`), and the runs a page names by a
marker (`day_table`, `compare_table`). Each figure is shown once, with the date and the code of its run.
"""

from __future__ import annotations

import argparse
import functools
import re
import statistics
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

    from chronos.runtime.producer import ProducerWatch
    from chronos.config import Settings
    from chronos.adapters.kafka.brokerstats import STATS_ENV
    from chronos.embedded.watch import BrokerStats
    from chronos.telemetry import metrics as telemetry
    found: dict[str, dict[str, Any]] = {}
    # the detector exports the embedded broker's figures from the stats file `chronos up` writes
    stats = tempfile.NamedTemporaryFile(suffix=".json", delete=False)
    stats.write(orjson.dumps(asdict(BrokerStats(rss_bytes=0, messages=0, input_unread=0, sampled_at=0.0))))
    stats.close()
    try:
        for cls in (telemetry.ConsumerTelemetry, telemetry.FirerTelemetry, telemetry.DetectorTelemetry):
            t = cls("00000000-0000-0000-0000-000000000000", Settings(), environ={STATS_ENV: stats.name})
            # what each role's run() attaches to its telemetry (chronos/roles/*.py); a process's real scrape is
            # checked against this list by tests/e2e/test_monitoring_files.py
            t.follow(dict)
            t.follow_postgres(lambda: [SimpleNamespace(server="db:5432", connects=1, server_changes=0, unanswered=0,
                                                       read_only=0)])
            if isinstance(t, (telemetry.ConsumerTelemetry, telemetry.FirerTelemetry)):
                t.follow_producer(ProducerWatch(t.role, stall_s=10.0, now=0.0))
            if isinstance(t, telemetry.FirerTelemetry):
                t.follow_timing(lambda: 0, SimpleNamespace(latency=0.0, offset_us=0))
            if isinstance(t, telemetry.ConsumerTelemetry):  # with cells only
                t.follow_cells(["cell1"], lambda cell: False)
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


# -- network partitions on a fleet of hosts (benchmarks/fleet.py) ----------------------------------

#: The run of `python -m benchmarks.fleet` that failure-behaviour.md and postgresql-ha.md show.
FLEET_RESULT = "2026-11-27/fleet.json"


def _health_summary(health: dict[str, list[list[Any]]], host: str) -> str:
    """What a host's programs' /healthz said during a scenario: as a monitoring host scraped them, and
    (a cut-off host) as the host itself saw them; each program's first change and when it was ok again."""
    parts = []
    for prefix, who in (("", "scraped"), ("own:", "on the host")):
        words = []
        for key, changes in sorted(health.items()):
            if not key.startswith(f"{prefix}{host}/"):
                continue
            program = key.split("/", 1)[1]
            bad = [(t, w) for t, w in changes if w != "ok"]
            if not bad:
                continue
            ok_again = next((t for t, w in changes if w == "ok" and t > bad[0][0]), None)
            words.append(f"{program} {bad[0][1]} at {bad[0][0]:g} s" +
                         (f", ok at {ok_again:g} s" if ok_again is not None else ""))
        if words:
            parts.append(f"{who}: " + "; ".join(words))
    return " / ".join(parts) or "ok throughout"


def fleet_rows(result: str = FLEET_RESULT, keys: Iterable[str] | None = None) -> list[tuple[Any, ...]]:
    import orjson
    data = orjson.loads((ROOT / "benchmarks" / "results" / result).read_bytes())
    rows = []
    for r in data["rows"]:
        if keys is not None and r["scenario_key"] not in keys:
            continue
        cut_host = "chronos-1" if r["scenario_key"].startswith("host") else None
        pause = ("-" if r.get("longest_pause_s") is None else
                 f"{r['longest_pause_s']:g} s, ended {r['pause_ended_after_fault_s']:g} s after the cut "
                 f"({r['pause_ended_after_heal_s']:+g} s from the heal"
                 + (f", {r['pause_ended_after_promotion_s']:+g} s from the promotion" if
                    r.get("pause_ended_after_promotion_s") is not None else "") + ")")
        signs = "; ".join(f"`{sign}` {at:g} s ({where})" for sign, (at, where) in list(r["first_log_lines"].items())[:4])
        alerts = r.get("alerts")

        def carried(states: dict[str, Any]) -> bool:
            """Active at the window's first step, 5 s before the cut: left by the scenario before."""
            return bool(states.get("before")) or min(v for k, v in states.items() if k != "before") <= -4.0
        fired = "-" if alerts is None else "; ".join(
            f"{name} " + ", ".join(f"{state} at {at:g} s" for state, at in sorted(
                ((k, v) for k, v in states.items() if k != "before"), key=lambda kv: kv[1]))
            for name, states in alerts.items() if not carried(states)) or "none"
        if alerts:
            earlier = sorted(name for name, states in alerts.items() if carried(states))
            if earlier:
                fired += " (still active from the scenario before: " + ", ".join(earlier) + ")"
        rows.append((r["scenario"], r["layout"], f"{r['carried_before']:,}", f"{r['lost']} of {r['sent']:,}", r["early"],
                     f"{r['duplicates']} ({r['duplicates_explained']} explained; "
                     f"{r['published_while_held_landed_after_heal']} published while held, landed after the heal; "
                     + (f"{r['unacknowledged_at_cut_fired_after_heal']} unacknowledged at the cut, fired again after "
                        "the heal; " if "unacknowledged_at_cut_fired_after_heal" in r else "")
                     + (f"{r['sent_during_cut_fired_again_after_heal']} sent during the cut, read again after "
                        "the heal; " if "sent_during_cut_fired_again_after_heal" in r else "")
                     + f"{r['republished_after_heal']} republished after it)",
                     "-" if r.get("promoted_after_fault_s") is None else f"{r['promoted_after_fault_s']:g} s",
                     pause, f"{r['max_lateness_during_fault_s']:g} s",
                     _health_summary(r["health"], cut_host) if cut_host else
                     _health_summary(r["health"], "chronos-1") + " (chronos-2 alike)", signs or "-", fired))
    return rows


def fleet_page(result: str = FLEET_RESULT, keys: Iterable[str] | None = None) -> str:
    """The figures of one run of benchmarks/fleet.py: one row per scenario and layout, from its result file."""
    import orjson
    data = orjson.loads((ROOT / "benchmarks" / "results" / result).read_bytes())
    head = (f"Run of {data['date']}: {data['hosts']}, each a network namespace on this 2-core machine; "
            f"{data['rate']:g} msg/s (delays 0.5-5 s, 10% already late), each cut {data['cut_s']:g} s, hold time 5 s, "
            f"the consumer group's session timeout 2 s; one fleet per layout carried every scenario's messages in "
            f"turn (`{data['command']}`; result file `benchmarks/results/{result}`). Times are from the cut.\n\n")
    return head + _table(("scenario", "layout", "messages the fleet carried before", "acknowledged lost", "early",
                          "duplicates", "new primary after", "longest pause in deliveries",
                          "latest delivery during the cut", "/healthz of the cut-off host", "first log lines",
                          "alerts (the shipped rules, evaluated every 2 s)"),
                         fleet_rows(result, keys))


#: The run of `python -m benchmarks.fleet --scenarios upgrade` that upgrading.md shows.
UPGRADE_RESULT = "2026-11-27/fleet-upgrade.json"


def upgrade_page(result: str = UPGRADE_RESULT) -> str:
    """The rolling upgrades of one run of benchmarks/fleet.py: one row per layout, from its result file."""
    import orjson
    data = orjson.loads((ROOT / "benchmarks" / "results" / result).read_bytes())
    rows = []
    for r in data["rows"]:
        if r["scenario_key"] != "upgrade":
            continue
        steps = "; ".join(f"{s['step']} at {s['at_s']:g} s ({s['took_s']:g} s)" for s in r["steps"])
        alerts = "-" if r.get("alerts") is None else ", ".join(
            f"{name} ({', '.join(sorted(k for k in states if k != 'before'))})"
            for name, states in r["alerts"].items()) or "none"
        rows.append((r["layout"], f"{r['lost']} of {r['sent']:,}", r["early"],
                     f"{r['duplicates']} ({r['duplicates_explained']} explained)",
                     f"{r['longest_pause_s']:g} s", f"{r['max_lateness_s']:g} s", steps, alerts))
    settle = next((r.get("settle_s") for r in data["rows"] if r["scenario_key"] == "upgrade"), None)
    upgrade = next(r for r in data["rows"] if r["scenario_key"] == "upgrade")
    old = sorted({v for host in upgrade["running_before"].values() for v in host.values()})
    new = sorted({v for host in upgrade["steps"][-1]["running"].values() for v in host.values()})
    head = (f"Run of {data['date']}, from {', '.join(old)} to {', '.join(new)}: {data['hosts']}, each a network "
            "namespace on this 2-core machine; "
            f"{data['rate']:g} msg/s (delays 0.5-5 s, 10% already late), hold time 5 s, {settle:g} s of load between "
            f"steps (`{data['command']}`; result file `benchmarks/results/{result}`). A killed firer's claimed rows "
            f"wait out the hold time, which is the latest delivery; times are from the first step.\n\n")
    return head + _table(("layout", "acknowledged lost", "early", "duplicates", "longest pause in deliveries",
                          "latest delivery after its due time", "steps (how long each took)",
                          "alerts (the shipped rules, evaluated every 2 s)"), rows)


# -- the alert rules (monitoring/prometheus-rules.yml) ------------------------------------------------------

RULES = ROOT / "monitoring" / "prometheus-rules.yml"


def alerts_page(path: Path = RULES) -> str:
    """One section per alert rule of the shipped file, the target of its runbook_url: what it watches
    (severity, how long it must hold, its expression), what it says (summary and description, as the
    alert carries them), how to confirm it, and what to do."""
    import yaml
    rules = [r for group in yaml.safe_load(path.read_text())["groups"] for r in group["rules"] if "alert" in r]
    sections = []
    for r in rules:
        notes = r["annotations"]
        sections.append(f"### {r['alert']}\n\n**{r['labels'].get('severity', '')}**, "
                        f"{'after ' + r['for'] if 'for' in r else 'at once'}: `{r['expr']}`\n\n"
                        f"{notes['summary']}. {notes['description']}\n\n**Confirm:** {notes['confirm']}")
    return "\n\n".join(sections)


# -- performance figures (benchmarks/sla.py, day.py, longevity.py, fire_rate.py, bulk_schedule.py) -----

RESULTS = ROOT / "benchmarks" / "results"
#: The firer's publish lateness at 20,000 msg/s, the held transactions read before the pick against 6fa1315, in turn.
HELD_FIRST = "2026-11-29/held-first"
CURSOR = "2026-11-30/claim-cursor"  # a firer alone's claims starting where the last one ended, against 2af0c87
STEADY = "2026-11-30/steady-cursor"  # every claim of a firer alone past its last row, against 8d987f4
KEY_SEARCH = "2026-11-30/key-search-10k"  # no key-search index unless an operator builds it, against f37cd58 and ca7e5a1
ONE_DUE = "2026-11-30/one-due-index-10k"  # one index for the due rows, and the cursor of slices, against ab19cc6 and ca7e5a1
TWENTY_K = "2026-11-30/twenty-k-222"  # two of every role at 20,000 msg/s: 358f7f1 against 693dfc3
FULL_2S = "2026-11-30/full-claim-2s-10k"  # the full claim every 2 s: 68e9007 against ca7e5a1
FULL_2S_AB = "2026-11-30/full-claim-2s-ab"  # the same against 92ba7dc, the code before
FIND_MAX_HEAD = "2026-11-30/find-max-one-reader"  # one process per role: db7c86b and ca7e5a1, three pairs
FIND_MAX_FULL_2S = "2026-11-30/find-max-full-claim-2s"  # two of every role: 68e9007 and ca7e5a1, three pairs
TWENTY_K_HEAD = "2026-11-30/twenty-k-222-head"  # two of every role at 20,000 msg/s: c8e600a against 693dfc3
LATENESS_25K = "2026-11-30/lateness-25k"  # the firer's own share at ca7e5a1's highest rate, both layouts (37f26c0)
# the processes' sessions without parallel workers (49970d0's change, measured on 8d69fde) against 37f26c0
NO_PARALLEL = "2026-11-30/no-parallel"
FIND_MAX_NO_PARALLEL = "2026-11-30/find-max-no-parallel"  # one process per role: 61c151b and ca7e5a1, two pairs
# a firer's full claims on a sweeper thread of their own (5d0b65b, measured before its commit at 40,000 msg/s)
FIND_MAX_SWEEPER = "2026-12-01/find-max-sweeper"  # the highest rates within the SLA: 5d0b65b, 15958cf and ca7e5a1
SWEEPER_40K = "2026-12-01/sweeper-40k"  # the firer's publish lateness at 40,000 msg/s, against 15958cf
LATENESS_25K_SWEEPER = "2026-12-01/lateness-25k"  # the firer's own share at 25,000 msg/s, both layouts (acbede5)
LATENESS_30K = "2026-12-01/lateness-30k"  # the same at 30,000 msg/s (ca7e5a1's highest rate of 2026-12-01), against it
AGED_HEAD = "2026-11-30/aged-one-reader"  # longevity, both layouts, on c8e600a
FIND_MAX_PARTITIONS = "2026-12-01/find-max-two-partitions"  # two of every role, two input partitions: 0a01f59 and ca7e5a1
FIND_MAX_BINARY = "2026-12-01/find-max-binary"  # the highest rates within the SLA: 0a01f59 and d906d66, one process per role
LATENESS_30K_BINARY = "2026-12-01/lateness-30k-binary"  # 0a01f59 at 30,000 msg/s, in turn with a trial not adopted
BINARY_TAKE = "2026-12-01/binary-take"  # the take's rows read in binary (0a01f59) against d906d66, at 10,000 and 30,000 msg/s
AGED_SWEEPER = "2026-12-01/aged-sweeper"  # the same on 1c3ee73 (a firer's full claims on a sweeper thread)
ONE_READER = "2026-11-30/one-gauge-reader"  # one detector reads the store gauges: bc1cddf, 7a72a93 and ca7e5a1
FIND_MAX_ONE_DUE = "2026-11-30/find-max-pairs"  # the highest rates within the SLA of 92ba7dc and ca7e5a1, three pairs
#: The highest rates within the SLA of the code and of ca7e5a1, in turn.
FIND_MAX_AB = "2026-11-29/find-max"
#: The design's limit with the statements Chronos runs.
DESIGN_LIMIT_NOW = "2026-11-29/design-limit/delete-claim-shares.json"
DESIGN_LIMIT_ONE_DUE = "2026-11-30/design-limit/delete-claim-shares.json"  # the same on migration 20's schema
DESIGN_LIMIT_SWEEPER = "2026-12-01/design-limit/delete-claim-shares.json"  # the same, measured beside FIND_MAX_SWEEPER


def _result(path: str) -> Any:
    import orjson
    return orjson.loads((RESULTS / path).read_bytes())


def _ms(value: float) -> str:
    return f"{value:,.0f} ms" if value >= 100 else f"{value:.1f} ms"


def _day(iso: str) -> str:
    return iso[:16].replace("T", " ")


def _scheduler_cores(cpu: dict[str, Any]) -> float:
    """Cores of Chronos's processes and PostgreSQL, out of a run's per-process CPU (cores, or {cores: ...})."""
    cores = {name: (v["cores"] if isinstance(v, dict) else v) for name, v in cpu.items()}
    return sum(c for name, c in cores.items()
               if name.startswith(("consumer", "firer", "detector", "postgres", "graphile-worker")))


def _jitter(path: str) -> str:
    r = _result(path)
    return f"{_ms(r['jitter_ms']['p999'])} (the broker's own floor {_ms(r['broker_floor_ms']['p999'])})"


def _find_max(path: str) -> str:
    fm = _result(path)["find_max"]
    return f"{fm['max_sustained_rate']:,.0f} msg/s (fails at {fm['first_failing_rate']:,.0f})"


def _lateness(path: str) -> str:
    """The firer's publish lateness, with what the consumers wrote: a message written after its deadline
    (the consumers behind the offered rate) is published late however soon the firer claims it."""
    r = _result(path)
    return (f"{_ms(r['publish_lateness_ms']['p999'])} (jitter p99.9 {_ms(r['jitter_ms']['p999'])}, "
            f"written {r['enqueue_rate']:,.0f} msg/s, fired {r['fire_rate']:,.0f} msg/s)")


def _lateness_arm(path: str) -> str:
    """The firer's publish lateness p99.9 of each run of one arm of an interleaved A/B, their median, and the
    runs' jitter, losses and early messages."""
    runs = _arm(path)
    late = [r["publish_lateness_ms"]["p999"] for r in runs]
    jitter = statistics.median(r["jitter_ms"]["p999"] for r in runs)
    return (f"{_ms(statistics.median(late))}, the median of {len(runs)} runs ({', '.join(_ms(v) for v in late)}); "
            f"jitter p99.9 {_ms(jitter)} (median); lost {sum(r['lost'] for r in runs)}, early "
            f"{sum(r['early'] for r in runs)}; the SLA held in {sum(1 for r in runs if r['sla_pass'])} of {len(runs)}")


def _written_fired(path: str) -> str:
    r = _result(path)
    return f"{r['enqueue_rate']:,.0f} / {r['fire_rate']:,.0f} msg/s, {_ms(r['jitter_ms']['p999'])}"


def _design_rate(path: str, layout: str) -> str:
    (row,) = [r for r in _result(path)["rows"] if r["layout"] == layout]
    return f"{row['rate_per_s']:,} msg/s ({row['postgres_us_per_message']:.1f} µs of PostgreSQL per message)"


def _fetched(path: str, firers: int) -> str:
    (row,) = [r for r in _result(path)["rows"] if r["firers"] == firers]
    return f"{row['fetched_per_claimed']:.3f} ({row['claimed']:,} rows claimed in {row['duration_s']:.0f} s)"


def _of_design_limit(path: str, layout: str, limit: str | None = None, arm: bool = False) -> str:
    """Chronos's highest rate within the SLA (with `arm`, the median of the arm's runs: `_arm`) over the rate of
    the design's statements in `limit` (`benchmarks.design_limit`; by default DESIGN_LIMIT's), in the same layout."""
    best = statistics.median(_best_rates(path)) if arm else _result(path)["find_max"]["max_sustained_rate"]
    (design,) = [r for r in _result(limit or f"{DESIGN_LIMIT}/max.json")["rows"] if r["layout"] == layout]
    return f"{best / design['rate_per_s']:.2f} ({best:,.0f} of {design['rate_per_s']:,} msg/s)"


def _aged_cpu(path: str) -> str:
    """Chronos's and PostgreSQL's cores in the steps of a longevity run after the first (`benchmarks.longevity`:
    one stack, the same load step after step), the messages the stack had carried by then, and the table's size."""
    rows = _result(path)["rows"][1:]
    cores = [_scheduler_cores(r["cpu_cores"]) for r in rows]
    pg = [r["cpu_cores"].get("postgres", 0.0) for r in rows]
    size = [r["table_mb"] for r in rows if r.get("table_mb") is not None]
    return (f"{min(cores):.2f}-{max(cores):.2f} cores (PostgreSQL {min(pg):.2f}-{max(pg):.2f}), "
            f"{rows[0]['messages_carried'] / 1e6:.1f} to {rows[-1]['messages_carried'] / 1e6:.1f} M messages carried, "
            f"the table {min(size):,.0f}-{max(size):,.0f} MB")


def _arm(path: str) -> list[Any]:
    """The results of one arm of an interleaved A/B: `path` and its siblings of the same name but the run's number
    (delete-1.json, delete-2.json, ...)."""
    folder, name = (RESULTS / path).parent, (RESULTS / path).name.rsplit("-", 1)[0]
    return [_result(str(p.relative_to(RESULTS))) for p in sorted(folder.glob(f"{name}-*.json"))]


def _pg_cores(run: dict[str, Any]) -> float:
    return sum(v["cores"] for k, v in run["cpu"].items() if k.startswith("postgres"))


def _cell_costs(path: str) -> str:
    """The median of the runs of one arm of an interleaved A/B: Chronos's and PostgreSQL's cores, and the firers'
    publish lateness p99.9."""
    runs = _arm(path)
    cores = [_scheduler_cores(r["cpu"]) for r in runs]
    pg = [_pg_cores(r) for r in runs]
    late = [r["publish_lateness_ms"]["p999"] for r in runs]
    figures = (f"{statistics.median(cores):.3f} cores (PostgreSQL {statistics.median(pg):.3f}), publish lateness "
               f"p99.9 {_ms(statistics.median(late))}")
    if len(runs) == 1:
        return f"{figures}: one run"
    return f"{figures}: medians of {len(runs)} runs (cores {min(cores):.3f}-{max(cores):.3f})"


def _claim_costs(path: str) -> str:
    """The medians of one arm of an interleaved A/B: PostgreSQL's cores and CPU and WAL per message, Chronos's and
    PostgreSQL's cores, the firer's publish lateness p99.9, and the runs that held the SLA."""
    runs = _arm(path)
    pg = statistics.median(_pg_cores(r) for r in runs)
    rate = runs[0]["offered_rate"]
    wal = statistics.median(r["wal_bytes_per_message"] for r in runs)
    cores = statistics.median(_scheduler_cores(r["cpu"]) for r in runs)
    late = statistics.median(r["publish_lateness_ms"]["p999"] for r in runs)
    held = sum(1 for r in runs if r["sla_pass"])
    return (f"PostgreSQL {pg:.3f} cores ({pg / rate * 1e6:.0f} µs a message), WAL {wal:,.0f} bytes a message; "
            f"with Chronos {cores:.3f} cores; publish lateness p99.9 {_ms(late)}; the SLA held in {held} of "
            f"{len(runs)} runs (medians)")


def _firer_costs(path: str) -> str:
    """The medians of one arm of an interleaved A/B: the firer's cores and CPU per message, PostgreSQL's cores,
    Chronos's and PostgreSQL's cores, and the firer's publish lateness p99.9."""
    runs = _arm(path)
    rate = runs[0]["offered_rate"]
    firer = statistics.median(sum(v["cores"] for k, v in r["cpu"].items() if k.startswith("firer")) for r in runs)
    pg = statistics.median(_pg_cores(r) for r in runs)
    cores = statistics.median(_scheduler_cores(r["cpu"]) for r in runs)
    late = [r["publish_lateness_ms"]["p999"] for r in runs]
    return (f"the firer {firer:.3f} cores ({firer / rate * 1e6:.1f} µs a message), PostgreSQL {pg:.3f}, with Chronos "
            f"{cores:.3f}; publish lateness p99.9 {_ms(statistics.median(late))} ({', '.join(_ms(v) for v in late)}); "
            f"lost {sum(r['lost'] for r in runs)} (medians of {len(runs)} runs)")


def _best_rates(path: str) -> list[float]:
    """The highest rate within the SLA of each run of one arm (`benchmarks.sla --find-max`); 0 for a run that
    found none."""
    return [r["find_max"]["max_sustained_rate"] or 0.0 for r in _arm(path)]


def _find_maxes(path: str, against: str | None = None) -> str:
    """The highest rate within the SLA of each run of one arm of an interleaved A/B, their median, and its ratio
    to the median of the arm `against` (its first file) where given."""
    rates = _best_rates(path)
    median = statistics.median(rates)
    text = (f"{median:,.0f} msg/s, one run" if len(rates) == 1 else
            f"{median:,.0f} msg/s, the median of {len(rates)} runs ({', '.join(f'{r:,.0f}' for r in rates)})")
    if against is None:
        return text
    theirs = statistics.median(_best_rates(against))
    return f"{text}: {median / theirs:.2f} times the {theirs:,.0f} of {_code(against)}, run in turn"


#: A run that keeps up: the firers' publish lateness p99.9 within this (a run that falls behind is late by seconds).
KEPT_UP_MS = 1500.0


def _kept_up(path: str) -> str:
    """How often one arm's runs of an interleaved A/B kept up with the offered rate, and its medians."""
    runs = _arm(path)
    late = [r["publish_lateness_ms"]["p999"] for r in runs]
    kept = sum(1 for v in late if v <= KEPT_UP_MS)
    written = statistics.median(r["enqueue_rate"] for r in runs)
    return (f"kept up in {kept} of {len(runs)} runs (publish lateness p99.9 ≤ {_ms(KEPT_UP_MS)}); medians: publish "
            f"lateness p99.9 {_ms(statistics.median(late))}, written {written:,.0f} msg/s, PostgreSQL "
            f"{statistics.median(_pg_cores(r) for r in runs):.2f} cores; the SLA held in "
            f"{sum(1 for r in runs if r['sla_pass'])}")


def _aged_against_fresh(path: str) -> str:
    """The first step of a longevity run (a fresh database) against its last (the most messages carried): Chronos's
    and PostgreSQL's cores, and PostgreSQL's alone."""
    rows = _result(path)["rows"]
    first, last = rows[0]["cpu_cores"], rows[-1]["cpu_cores"]
    fresh, aged = _scheduler_cores(first), _scheduler_cores(last)
    pg_fresh, pg_aged = first.get("postgres", 0.0), last.get("postgres", 0.0)
    return (f"{aged:.2f} cores after {rows[-1]['messages_carried'] / 1e6:.1f} M messages, {fresh:.2f} fresh "
            f"({aged / fresh:.2f} times; PostgreSQL {pg_aged:.2f} and {pg_fresh:.2f}, {pg_aged / pg_fresh:.2f} times)")


def _freeze(path: str) -> str:
    """One cell's PostgreSQL frozen under load (`benchmarks.cells_freeze`): the other cell's jitter."""
    r = _result(path)["row"]
    calm, during = r["cell1_fault_free_ms"]["p999"], r["cell1_during_freeze_ms"]["p999"]
    return (f"the other cell's p99.9 {_ms(during)} while frozen, {_ms(calm)} before ({during / calm:.2f} times); "
            f"the frozen cell's messages at most {r['cell2_during_freeze_ms']['max'] / 1000:.1f} s late; "
            f"{r['lost']} lost, {r['early']} early of {r['sent']:,}")


def _move(path: str) -> str:
    """A partition moved between cells under load (`benchmarks.cells`)."""
    r = _result(path)
    move, messages = r["move"], r["messages"]
    twice = f", {messages['duplicated']:,} delivered twice" if messages.get("duplicated") else ""
    if move is None:  # a control: no move, the same seconds of the same run's age
        what, during = f"no move (a control), {r['far']:,} far-future rows left in place; the other partitions'", \
            f"over the {r['control_s']:.0f} s where a move would begin"
    else:
        what = (f"{r['far']:,} far-future rows moved in {move['took_s']:.0f} s (cut-over {move['cut_over_s']:.2f} s);"
                f" its messages at most {r['moved_partition_during_move']['max_s']:.1f} s late; the other partitions'")
        during = "during the move"
    if r.get("aged"):
        sizes = " and ".join(f"{mb:,.0f} MB" for mb in r["table_mb"].values())
        what = f"each cell's table through {r['aged']:,} messages first ({sizes} then); {what}"
    return (f"{what} p99.9 {_ms(r['others_during_move']['jitter']['p99_9_s'] * 1000)} {during}, "
            f"{_ms(r['others_before_move']['jitter']['p99_9_s'] * 1000)} before it (their publishes' "
            f"{_ms(r['others_during_move']['publish_lateness']['p99_9_s'] * 1000)} and "
            f"{_ms(r['others_before_move']['publish_lateness']['p99_9_s'] * 1000)}); {messages['lost']} lost, "
            f"{messages['early']} early{twice} of {messages['sent']:,}")


def _move_start(path: str) -> str:
    """A move's first 10 s, where it makes its triggers: the other partitions' publish lateness, and how many of
    its requests for the table's lock waited; then the whole move (`_move`)."""
    from chronos.ops.moves import MoveSettings
    r = _result(path)
    first = next(row for row in r["others_by_10s"] if row["from_s"] == 0)
    tries = [line for _, line in r["move_said"] if "] the watch: the table is busy" in line]
    queued = max(0, len(tries) + 1 - MoveSettings().queue_after)  # the tries after those only if free at once
    return (f"in its first 10 s the other partitions' publishes {_ms(first['publish_p99_9_s'] * 1000)} at p99.9, "
            f"{_ms(first['publish_max_s'] * 1000)} at most, and {queued} request{'' if queued == 1 else 's'} of the move "
            f"for the table's lock that waited; {_move(path)}")


def _gc_pauses(path: str) -> str:
    """The harness's own garbage collections in a `benchmarks.cells` run, from the move's start to its end."""
    r = _result(path)
    end = r["move"]["took_s"] if r["move"] else r["control_s"]
    during = [g["ms"] for g in r.get("harness_gc_pauses", []) if 0 <= g["at_s"] <= end]
    collector = "collecting its garbage" if r.get("collect_garbage") else "with its collector off"
    if not during:
        return f"the harness {collector}: no collection of 5 ms or more in the move's {end:.0f} s"
    return (f"the harness {collector}: {len(during)} collections of 5 ms or more in the move's {end:.0f} s, the "
            f"longest {max(during):.0f} ms; {_move(path)}")


def _machine(path: str) -> str:
    """What the machine and the broker used over the last minute a `benchmarks.cells` run sampled, and the
    messages its reader had not read 120 s after the load stopped."""
    r = _result(path)
    last = r["cpu_by_10s"][-6:]
    cores = sum(row["cores"] for row in last) / len(last)
    broker = sum(row["by_kind"].get("broker", 0.0) for row in last) / len(last)
    firers = sum(row["by_kind"].get("chronos firer", 0.0) for row in last) / len(last)
    unread = r["messages"]["lost"]
    return (f"the load's batches of {r['load_linger_ms']} ms, the reader's fetches of {r['reader_fetch_wait_ms']} ms: "
            f"{last[0]['from_s']}-{last[-1]['from_s'] + 10} s after the move began, the machine used {cores:.2f} "
            f"cores, the broker {broker:.2f}, the firers {firers:.2f}; {unread:,} of {r['messages']['sent']:,} "
            f"messages not read within 120 s")


def _fresh_cpu(path: str) -> str:
    return f"{_scheduler_cores(_result(path)['cpu']):.2f} cores"


def _spike(path: str) -> str:
    r = _result(path)
    (phase,) = [p for p in r["phases"] if p.get("spike")]
    lost = "nothing lost" if phase["lost"] == 0 else f"{phase['lost']} not received"
    dup = "nothing duplicated" if phase["duplicates"] == 0 else f"{phase['duplicates']} duplicates"
    return f"drained in {phase['spike']['drain_s']:.1f} s ({phase['spike']['fire_rate']:,.0f} msg/s), {lost}, {dup}"


def _slowest_statement(path: str) -> str:
    phases = _result(path)["phases"]
    slowest = max(v["slowest_s"] for p in phases for k, v in p["statements"].items() if k in ("claim", "delete", "scan"))
    return f"{slowest:.2f} s"


def _fire_rate(path: str) -> str:
    return f"{_result(path)['fire_rate']:,} msg/s"


def _bulk(path: str) -> str:
    r = _result(path)["fsync_on"]
    return (f"{r['single_process']['rows_per_s']:,.0f} rows/s in one process, "
            f"{r['spark']['rows_per_s']:,.0f} rows/s on Spark `local[*]`")


def _memory(path: str) -> str:
    rss = _result(path)["rss_mb"]
    return ", ".join(f"{name.split('_')[0]} {mb:g} MB" for name, mb in sorted(rss.items()))


#: (figure, target, [(what, the function that reads it, result file), ...]), in the order shown. Each result
#: file under benchmarks/results/.
FIGURES: list[tuple[str, str, list[tuple[str, Callable[[str], str], str]]]] = [
    ("p99.9 jitter at 1,000 msg/s", "broker floor + 5 ms", [
        ("one process per role", _jitter, "2026-11-25/linger-ab/l100-1.json"),
        ("the same, producers lingering 25 ms instead of the embedded profile's 100", _jitter,
         "2026-11-23/compare/chronos-1-1-1-1000.json"),
        ("two of every role, 25 ms", _jitter, "2026-11-23/compare/chronos-2-2-2-1000.json")]),
    ("p99.9 jitter at 10,000 msg/s", "≤ 500 ms", [
        ("one process per role", _jitter, "2026-11-28/cpu-ab/now-111-1.json"),
        ("two of every role", _jitter, "2026-11-28/cpu-ab/now-222-1.json")]),
    ("highest rate holding p99.9 ≤ 500 ms", "35,000 msg/s (one per role), 30,000 (two)", [
        ("one process per role: 5d0b65b (a firer's full claims on a sweeper thread), three runs in turn with "
         "ca7e5a1's and 15958cf's, 2026-12-01 00:55-01:47 UTC (the search: 20,000 msg/s doubled up to 80,000, then "
         "bisected to within 5 %; seven steps of 20 s)", functools.partial(
             _find_maxes, against=f"{FIND_MAX_SWEEPER}/ca-111-1.json"), f"{FIND_MAX_SWEEPER}/sw-111-1.json"),
        ("two of every role: 5d0b65b (its second and third runs on 1c3ee73, the same code), three runs in turn with "
         "ca7e5a1's, the same day (00:55-01:47 and 03:12-03:30 UTC) and search", functools.partial(
             _find_maxes, against=f"{FIND_MAX_SWEEPER}/ca-222-1.json"), f"{FIND_MAX_SWEEPER}/sw-222-1.json"),
        ("15958cf (the full claims on the claimer's thread), one process per role, in turn with the above",
         functools.partial(_find_maxes, against=f"{FIND_MAX_SWEEPER}/ca-111-1.json"), f"{FIND_MAX_SWEEPER}/head-111-1.json"),
        ("ca7e5a1, one process per role, in turn with the above", _find_maxes, f"{FIND_MAX_SWEEPER}/ca-111-1.json"),
        ("ca7e5a1, two of every role, in turn with the above", _find_maxes, f"{FIND_MAX_SWEEPER}/ca-222-1.json"),
        ("one process per role: 0a01f59 (a take's rows read in binary), three runs in turn with d906d66's (the code "
         "before), 2026-12-01 06:40-07:09 UTC, the same search", functools.partial(
             _find_maxes, against=f"{FIND_MAX_BINARY}/hd-111-1.json"), f"{FIND_MAX_BINARY}/bin-111-1.json"),
        ("d906d66, one process per role, in turn with the above", _find_maxes, f"{FIND_MAX_BINARY}/hd-111-1.json"),
        ("two of every role on an input topic of two partitions (`-- --partitions 2`: both consumers write, as the "
         "design's two writers do): 0a01f59, three runs in turn with ca7e5a1's, 2026-12-01 07:09-07:36 UTC, the same "
         "search", functools.partial(_find_maxes, against=f"{FIND_MAX_PARTITIONS}/ca-222-1.json"),
         f"{FIND_MAX_PARTITIONS}/bin-222-1.json"),
        ("ca7e5a1, two of every role on two input partitions, in turn with the above", _find_maxes,
         f"{FIND_MAX_PARTITIONS}/ca-222-1.json"),
        ("one process per role", functools.partial(_find_maxes, against=f"{FIND_MAX_AB}/ca7e5a1-111-1.json"),
         f"{FIND_MAX_AB}/head-111-1.json"),
        ("two of every role", functools.partial(_find_maxes, against=f"{FIND_MAX_AB}/ca7e5a1-222-1.json"),
         f"{FIND_MAX_AB}/head-222-1.json"),
        ("ca7e5a1 (before the claim that deletes), one process per role, in turn with the above", _find_maxes,
         f"{FIND_MAX_AB}/ca7e5a1-111-1.json"),
        ("ca7e5a1, two of every role", _find_maxes, f"{FIND_MAX_AB}/ca7e5a1-222-1.json"),
        ("92ba7dc (one index for the due rows), one process per role, three runs in turn with ca7e5a1's, 2026-11-30 "
         "14:31-15:13 UTC (the search: 20,000 msg/s doubled up to 80,000, then bisected; five steps of 20 s)",
         functools.partial(
             _find_maxes, against=f"{FIND_MAX_ONE_DUE}/ca-111-1.json"), f"{FIND_MAX_ONE_DUE}/cur-111-1.json"),
        ("92ba7dc, two of every role, the same", functools.partial(
             _find_maxes, against=f"{FIND_MAX_ONE_DUE}/ca-222-1.json"), f"{FIND_MAX_ONE_DUE}/cur-222-1.json"),
        ("68e9007 (a firer's full claim every 2 s), two of every role, three runs in turn with ca7e5a1's, 2026-11-30 "
         "16:28-16:49 UTC, the same search", functools.partial(
             _find_maxes, against=f"{FIND_MAX_FULL_2S}/ca-222-1.json"), f"{FIND_MAX_FULL_2S}/new-222-1.json"),
        ("db7c86b (the full claim every 2 s, one detector reading the store gauges), one process per role, three runs "
         "in turn with ca7e5a1's, 2026-11-30 19:41-20:03 UTC, the same search", functools.partial(
             _find_maxes, against=f"{FIND_MAX_HEAD}/ca-111-1.json"), f"{FIND_MAX_HEAD}/head-111-1.json"),
        ("61c151b (no parallel workers in the processes' sessions), one process per role, two runs in turn with "
         "ca7e5a1's, 2026-11-30 23:03-23:18 UTC, the same search", functools.partial(
             _find_maxes, against=f"{FIND_MAX_NO_PARALLEL}/ca-111-1.json"), f"{FIND_MAX_NO_PARALLEL}/head-111-1.json")]),
    ("the highest rate within the SLA, of the design's limit", "≥ 0.70", [
        ("5d0b65b, one process of each role: the median of its highest rates of 2026-12-01, of the rate of the "
         "design's statements as it runs them, measured the same hour (numbered ids, a batch held 100 ms)",
         functools.partial(_of_design_limit, layout="1/1/1", limit=DESIGN_LIMIT_SWEEPER, arm=True),
         f"{FIND_MAX_SWEEPER}/sw-111-1.json"),
        ("5d0b65b, two of every role, the same", functools.partial(
             _of_design_limit, layout="2/2/2", limit=DESIGN_LIMIT_SWEEPER, arm=True), f"{FIND_MAX_SWEEPER}/sw-222-1.json"),
        ("0a01f59 (a take's rows read in binary), one process of each role: the median of its highest rates of "
         "2026-12-01 06:40-07:09 UTC, of the same rate of the design's statements", functools.partial(
             _of_design_limit, layout="1/1/1", limit=DESIGN_LIMIT_SWEEPER, arm=True), f"{FIND_MAX_BINARY}/bin-111-1.json"),
        ("0a01f59, two of every role on two input partitions (both consumers write), 07:09-07:36 UTC, the same",
         functools.partial(_of_design_limit, layout="2/2/2", limit=DESIGN_LIMIT_SWEEPER, arm=True),
         f"{FIND_MAX_PARTITIONS}/bin-222-1.json"),
        ("one process per role, the claim that stamps (firers racing in the design's run), 2026-11-28",
         functools.partial(_of_design_limit, layout="1/1/1"), "2026-11-28/find-max/chronos-1x1x1.json"),
        ("two of every role, the same", functools.partial(_of_design_limit, layout="2/2/2"),
         "2026-11-28/find-max/chronos-2x2x2.json"),
        ("one process per role, the design's statements as Chronos runs them (the claim that deletes, by slices), "
         "the highest rates above", functools.partial(_of_design_limit, layout="1/1/1", limit=DESIGN_LIMIT_NOW, arm=True),
         f"{FIND_MAX_AB}/head-111-1.json"),
        ("two of every role, the same", functools.partial(_of_design_limit, layout="2/2/2", limit=DESIGN_LIMIT_NOW,
                                                          arm=True), f"{FIND_MAX_AB}/head-222-1.json"),
        ("92ba7dc, one process of each role: the medians of its three highest rates above, of the rate of the "
         "design's statements as it runs them on its schema (one due index), numbered ids as the SLA load's, a "
         "batch held 100 ms, 2026-11-30 15:39 UTC", functools.partial(
             _of_design_limit, layout="1/1/1", limit=DESIGN_LIMIT_ONE_DUE, arm=True), f"{FIND_MAX_ONE_DUE}/cur-111-1.json"),
        ("92ba7dc, two of every role, the same", functools.partial(
             _of_design_limit, layout="2/2/2", limit=DESIGN_LIMIT_ONE_DUE, arm=True), f"{FIND_MAX_ONE_DUE}/cur-222-1.json"),
        ("68e9007 (a firer's full claim every 2 s), two of every role, the same", functools.partial(
             _of_design_limit, layout="2/2/2", limit=DESIGN_LIMIT_ONE_DUE, arm=True), f"{FIND_MAX_FULL_2S}/new-222-1.json"),
        ("db7c86b, one process of each role, the same", functools.partial(
             _of_design_limit, layout="1/1/1", limit=DESIGN_LIMIT_ONE_DUE, arm=True), f"{FIND_MAX_HEAD}/head-111-1.json"),
        ("61c151b, one process of each role, the same", functools.partial(
             _of_design_limit, layout="1/1/1", limit=DESIGN_LIMIT_ONE_DUE, arm=True),
         f"{FIND_MAX_NO_PARALLEL}/head-111-1.json")]),
    ("publish lateness p99.9, the firer's own share", "≤ 10 ms", [
        ("one process per role, 25,000 msg/s (ca7e5a1's highest rate in its find-max runs of 2026-12-01 with two of "
         "every role, and of 2026-11-30 with both layouts), 40 s, fresh stacks, the two layouts in turn: acbede5 (a "
         "firer's full claims on a sweeper thread), 2026-12-01 04:30-04:37 UTC", _lateness_arm,
         f"{LATENESS_25K_SWEEPER}/hd-111-1.json"),
        ("two of every role, 25,000 msg/s, 40 s, the same", _lateness_arm, f"{LATENESS_25K_SWEEPER}/hd-222-1.json"),
        ("one process per role, 30,000 msg/s (ca7e5a1's highest rate in its find-max runs of 2026-12-01 with one "
         "process per role), 45 s, fresh stacks: 1c3ee73 (a firer's full claims on a sweeper thread), three runs in "
         "turn with ca7e5a1's, 2026-12-01 03:05-03:12 UTC", _lateness_arm, f"{LATENESS_30K}/sw-111-1.json"),
        ("ca7e5a1, the same (it writes 14,000 msg/s of the 30,000 offered over 45 s: its highest rate held for 20 s "
         "steps only)", _lateness_arm, f"{LATENESS_30K}/ca-111-1.json"),
        ("one process per role, 30,000 msg/s, 45 s, fresh stacks: 0a01f59 (a take's rows read in binary), three runs "
         "in turn with d906d66's, 2026-12-01 06:13-06:21 UTC", _lateness_arm, f"{BINARY_TAKE}-30k/bin-111-1.json"),
        ("d906d66, the same", _lateness_arm, f"{BINARY_TAKE}-30k/hd-111-1.json"),
        ("0a01f59 again, three runs in turn with a trial of the same code not adopted (the firer's other threads at "
         "nice +10), 06:30-06:37 UTC", _lateness_arm, f"{LATENESS_30K_BINARY}/bin-111-1.json"),
        ("one process per role, 25,000 msg/s (ca7e5a1's highest rate: the median of its find-max runs of 2026-11-30 in "
         "both layouts), 40 s, fresh stacks, the two layouts in turn: 37f26c0, 2026-11-30 21:06-21:14 UTC",
         _lateness_arm, f"{LATENESS_25K}/new-111-1.json"),
        ("two of every role, 25,000 msg/s, 30 s, the same", _lateness_arm, f"{LATENESS_25K}/new-222-1.json"),
        ("one process per role, 40,000 msg/s, 45 s, fresh stacks: a firer's full claims on a sweeper thread (5d0b65b's "
         "change, run on 15958cf before it was committed), three runs in turn with 15958cf's, 2026-12-01 00:12-00:20 UTC",
         _lateness_arm, f"{SWEEPER_40K}/sw-111-1.json"),
        ("15958cf (the full claims on the claimer's thread), the same", _lateness_arm, f"{SWEEPER_40K}/head-111-1.json"),
        ("one process per role, 40,000 msg/s, 45 s, fresh stacks: no parallel workers in the processes' sessions "
         "(49970d0's change, run on 8d69fde before it was committed), six runs in turn with 37f26c0's, 2026-11-30 "
         "22:13-22:28 UTC", _lateness_arm, f"{NO_PARALLEL}-40k/nopar-111-1.json"),
        ("37f26c0 (parallel workers where PostgreSQL plans them), the same", _lateness_arm,
         f"{NO_PARALLEL}-40k/new-111-1.json"),
        ("one process per role, 20,000 msg/s, 40 s, fresh stacks: c8e600a, 2026-11-30 19:07-19:16 UTC, in turn with a "
         "trial of the same code not adopted", _lateness_arm, "2026-11-30/lateness-20k-111/head-111-1.json"),
        ("two of every role, 20,000 msg/s, 30 s, fresh stacks: c8e600a, 2026-11-30 18:48-19:06 UTC, in turn with "
         "693dfc3", _lateness_arm, f"{TWENTY_K_HEAD}/head-222-1.json"),
        ("693dfc3, the same", _lateness_arm, f"{TWENTY_K_HEAD}/693-222-1.json"),
        ("one process per role, 20,000 msg/s (the highest rate of ca7e5a1), 40 s, fresh stacks, 2026-11-29 "
         "23:22-23:57 UTC, in turn with 6fa1315", _lateness_arm, f"{HELD_FIRST}/fix-111-1.json"),
        ("6fa1315 (before the held transactions were read ahead of the pick), the same", _lateness_arm,
         f"{HELD_FIRST}/base-111-1.json"),
        ("two of every role, 20,000 msg/s, the same", _lateness_arm, f"{HELD_FIRST}/fix-222-1.json"),
        ("6fa1315, two of every role, the same", _lateness_arm, f"{HELD_FIRST}/base-222-1.json"),
        ("one process per role, 20,000 msg/s, 40 s: a full claim that comes back full with recent rows only followed by "
         "a recent claim (147b206), 2026-11-30 00:30-00:37 UTC, in turn with the code before it", _lateness_arm,
         "2026-11-30/full-claims/nfb-1.json"),
        ("7a038d8 (every full claim that comes back full followed by another), the same", _lateness_arm,
         "2026-11-30/full-claims/fix-1.json"),
        ("one process per role, 20,000 msg/s, 40 s: a firer alone's claim after one that came back full starting "
         "past its last row (1073667), 2026-11-30 02:26-02:37 UTC, in turn with the code before it", _lateness_arm,
         f"{CURSOR}/cur-111-1.json"),
        ("2af0c87 (every claim between full ones from 2 s back), the same", _lateness_arm, f"{CURSOR}/base-111-1.json"),
        ("one process per role, 30,000 msg/s, 40 s: 1073667, 2026-11-30 02:38-03:35 UTC, in turn with 2af0c87",
         _lateness_arm, f"{CURSOR}-30k/cur-111-1.json"),
        ("2af0c87, the same", _lateness_arm, f"{CURSOR}-30k/base-111-1.json"),
        ("one process per role, 25,000 msg/s, 2026-11-28", _lateness, "2026-11-28/lateness/chronos-1x1x1-25000.json")]),
    ("two of every role at 20,000 msg/s, 30 s on a fresh stack, the runs of two codes in turn", "kept up at least "
     "as often as 693dfc3", [
        ("c8e600a (a full claim every 2 s, one detector reading the store gauges), 2026-11-30 18:48-19:06 UTC, "
         "10 runs of each", _kept_up, f"{TWENTY_K_HEAD}/head-222-1.json"),
        ("693dfc3, the same", _kept_up, f"{TWENTY_K_HEAD}/693-222-1.json"),
        ("the claim that deletes (the default)", _kept_up, "2026-11-29/keep-up-20k/head-1.json"),
        ("693dfc3 (before the firers' shares)", _kept_up, "2026-11-29/keep-up-20k/693dfc3-1.json")]),
    ("claiming connections per firer, 20,000 msg/s, one of each role: written / fired, p99.9 jitter "
     "(before the claim of slices had an index predicate of its own)", "", [
        ("one claimer (the default)", _written_fired, "2026-11-27/shares/claimers-ab/one-claimer.json"),
        ("two claimers", _written_fired, "2026-11-27/shares/claimers-ab/two-claimers.json"),
        ("before the firers' shares, the same hour", _written_fired, "2026-11-27/shares/claimers-ab/before-shares.json")]),
    ("the design's limit: its own statements, no Kafka, the same hour", "", [
        ("one of each role", functools.partial(_design_rate, layout="1/1/1"), "2026-11-28/design-limit/max.json"),
        ("one of each, the firer claiming its slices", functools.partial(_design_rate, layout="1/1/1"),
         "2026-11-28/design-limit/shares.json"),
        ("one of each, its slices off the share index alone (no due index)",
         functools.partial(_design_rate, layout="1/1/1"), "2026-11-28/design-limit/one-index.json"),
        ("two of each, the firers racing", functools.partial(_design_rate, layout="2/2/2"), "2026-11-28/design-limit/max.json"),
        ("two of each, each firer claiming its own slices", functools.partial(_design_rate, layout="2/2/2"),
         "2026-11-28/design-limit/shares.json"),
        ("two of each, their slices off the share index alone (no due index)",
         functools.partial(_design_rate, layout="2/2/2"), "2026-11-28/design-limit/one-index.json"),
        ("one of each, the statements and schema of 582b05a (60,986 msg/s on 2026-11-26), half an hour earlier",
         functools.partial(_design_rate, layout="1/1/1"), "2026-11-28/design-limit-ab/582b05a-1.json"),
        ("the same, again", functools.partial(_design_rate, layout="1/1/1"),
         "2026-11-28/design-limit-ab/582b05a-2.json")]),
    ("live rows fetched per claimed row, 5,000 msg/s", "≤ 1.1", [
        ("two firers", functools.partial(_fetched, firers=2), "2026-11-27/slices/claims.json"),
        ("four firers", functools.partial(_fetched, firers=4), "2026-11-27/slices/claims.json")]),
    ("CPU at 10,000 msg/s, Chronos and PostgreSQL, fresh stacks; runs interleaved within the hour with those of "
     "the code measured on [a long-lived stack](hot-path.md#under-load-what-a-claim-walks-over) two days before, "
     "so that the machine's drift since shows apart from the code's", "≤ 0.30 cores", [
        ("one process per role", _fresh_cpu, "2026-11-28/cpu-ab/now-111-1.json"),
        ("one process per role, again", _fresh_cpu, "2026-11-28/cpu-ab/now-111-2.json"),
        ("two of every role", _fresh_cpu, "2026-11-28/cpu-ab/now-222-1.json"),
        ("two of every role, again", _fresh_cpu, "2026-11-28/cpu-ab/now-222-2.json"),
        ("the earlier code, one process per role, the run before the first above", _fresh_cpu,
         "2026-11-28/cpu-ab/d4ed12f-111-1.json"),
        ("the same, between the two", _fresh_cpu, "2026-11-28/cpu-ab/d4ed12f-111-2.json"),
        ("the earlier code, two of every role, the run before the first above", _fresh_cpu,
         "2026-11-28/cpu-ab/d4ed12f-222-1.json"),
        ("the same, between the two", _fresh_cpu, "2026-11-28/cpu-ab/d4ed12f-222-2.json"),
        ("graphile-worker and its PostgreSQL, same load", _fresh_cpu, "2026-11-26/cpu-10000/gw.json")]),
    ("CPU at 10,000 msg/s, Chronos and PostgreSQL, on one PostgreSQL step after step (Chronos and the broker "
     "restarted between steps)", "≤ 0.30 cores", [
        ("one process per role, 2026-12-01 03:30-03:37 UTC", _aged_cpu, f"{AGED_SWEEPER}/longevity-1x1x1-10000.json"),
        ("two of every role, 03:37-03:45 UTC", _aged_cpu, f"{AGED_SWEEPER}/longevity-2x2x2-10000.json"),
        ("one process per role, c8e600a (the full claims on the claimer's thread)", _aged_cpu,
         f"{AGED_HEAD}/longevity-1x1x1-10000.json"),
        ("two of every role, c8e600a", _aged_cpu, f"{AGED_HEAD}/longevity-2x2x2-10000.json"),
        ("one process per role, 358f7f1 (a full claim every 0.5 s, each detector reading the store gauges)", _aged_cpu,
         "2026-11-30/aged/longevity-1x1x1-10000.json"),
        ("two of every role, 358f7f1", _aged_cpu, "2026-11-30/aged/longevity-2x2x2-10000.json"),
        ("one process per role, the schema before migration 20 (2026-11-29)", _aged_cpu,
         "2026-11-29/aged/longevity-1x1x1-10000.json"),
        ("two of every role, the schema before migration 20 (2026-11-29)", _aged_cpu,
         "2026-11-29/aged/longevity-2x2x2-10000.json")]),
    ("CPU at 10,000 msg/s, Chronos and PostgreSQL: the last step of the run above against its first (a fresh "
     "database)", "within 10 %", [
        ("one process per role", _aged_against_fresh, f"{AGED_SWEEPER}/longevity-1x1x1-10000.json"),
        ("two of every role", _aged_against_fresh, f"{AGED_SWEEPER}/longevity-2x2x2-10000.json"),
        ("one process per role, c8e600a", _aged_against_fresh, f"{AGED_HEAD}/longevity-1x1x1-10000.json"),
        ("two of every role, c8e600a", _aged_against_fresh, f"{AGED_HEAD}/longevity-2x2x2-10000.json"),
        ("one process per role, 358f7f1", _aged_against_fresh, "2026-11-30/aged/longevity-1x1x1-10000.json"),
        ("two of every role, 358f7f1", _aged_against_fresh, "2026-11-30/aged/longevity-2x2x2-10000.json"),
        ("one process per role, the schema before migration 20 (2026-11-29)", _aged_against_fresh,
         "2026-11-29/aged/longevity-1x1x1-10000.json"),
        ("two of every role, the schema before migration 20 (2026-11-29)", _aged_against_fresh,
         "2026-11-29/aged/longevity-2x2x2-10000.json")]),
    ("a firer's claim at 10,000 msg/s, one process of each role, fresh stacks: the claim that deletes (the "
     "default) against the stamp and ca7e5a1 (before both), the three in turn, 3 runs of each, 2026-11-29 "
     "07:05-07:19 UTC", "PostgreSQL's CPU and WAL per message ≤ 0.5 of ca7e5a1's; with Chronos ≤ 0.6", [
        ("`CHRONOS_FIRER_CLAIM=delete`", _claim_costs, "2026-11-29/claim-default/delete-1.json"),
        ("`CHRONOS_FIRER_CLAIM=stamp`", _claim_costs, "2026-11-29/claim-default/stamp-1.json"),
        ("ca7e5a1", _claim_costs, "2026-11-29/claim-default/ca7e5a1-1.json")]),
    ("a firer's claim at 10,000 msg/s, one process of each role, fresh stacks, 60 s: 147b206 (the held transactions "
     "read in a statement before the pick, one more statement a claim) against 6fa1315, in turn, 3 runs of each, "
     "2026-11-30 00:41-00:49 UTC", "no more than 6fa1315's", [
        ("147b206", _claim_costs, "2026-11-30/held-first-cost/nfb-1.json"),
        ("6fa1315", _claim_costs, "2026-11-30/held-first-cost/base-1.json")]),
    ("a firer's claim at 10,000, 20,000 and 30,000 msg/s, one process of each role, fresh stacks: 1073667 (a firer "
     "alone's claim after one that came back full starts past its last row) against 2af0c87, in turn, 2026-11-30 "
     "02:26-03:43 UTC", "", [
        ("1073667, 10,000 msg/s, 60 s, 3 runs", _claim_costs, f"{CURSOR}-10k/cur-111-1.json"),
        ("2af0c87, 10,000 msg/s, 60 s, 3 runs", _claim_costs, f"{CURSOR}-10k/base-111-1.json"),
        ("1073667, 20,000 msg/s, 40 s, 5 runs", _claim_costs, f"{CURSOR}/cur-111-1.json"),
        ("2af0c87, 20,000 msg/s, 40 s, 5 runs", _claim_costs, f"{CURSOR}/base-111-1.json"),
        ("1073667, 30,000 msg/s, 40 s, 8 runs", _claim_costs, f"{CURSOR}-30k/cur-111-1.json"),
        ("2af0c87, 30,000 msg/s, 40 s, 8 runs", _claim_costs, f"{CURSOR}-30k/base-111-1.json")]),
    ("a firer's claim at 10,000 and 20,000 msg/s, one process of each role, fresh stacks: f0a495f (every claim of a "
     "firer alone starts past its last row, and below it looks only at rows written since) against 8d987f4, in "
     "turn, 2026-11-30 06:00-06:29 UTC", "", [
        ("f0a495f, 10,000 msg/s, 60 s, 4 runs", _claim_costs, f"{STEADY}-10k/steady-111-1.json"),
        ("8d987f4, 10,000 msg/s, 60 s, 4 runs", _claim_costs, f"{STEADY}-10k/base-111-1.json"),
        ("f0a495f, 20,000 msg/s, 40 s, 8 runs", _claim_costs, f"{STEADY}-20k/steady-111-1.json"),
        ("8d987f4, 20,000 msg/s, 40 s, 8 runs", _claim_costs, f"{STEADY}-20k/base-111-1.json")]),
    ("a message's cost at 10,000 msg/s, one process of each role, fresh stacks, 60 s: 7e31272 (no key-search index "
     "unless an operator builds it, migration 19) against f37cd58 (the code before) and ca7e5a1, the three in turn, 3 "
     "runs of each, 2026-11-30 08:34-08:47 UTC", "PostgreSQL's CPU and WAL per message ≤ 0.5 of ca7e5a1's; with "
     "Chronos ≤ 0.6", [
        ("7e31272", _claim_costs, f"{KEY_SEARCH}/ks-111-1.json"),
        ("f37cd58", _claim_costs, f"{KEY_SEARCH}/base-111-1.json"),
        ("ca7e5a1", _claim_costs, f"{KEY_SEARCH}/ca-111-1.json")]),
    ("a message's cost at 10,000 msg/s, two processes of every role, fresh stacks, 60 s: 7e31272 against ca7e5a1, in "
     "turn, 3 runs of each, 2026-11-30 09:17-09:26 UTC", "PostgreSQL's CPU and WAL per message ≤ 0.5 of ca7e5a1's; "
     "with Chronos ≤ 0.6", [
        ("7e31272", _claim_costs, f"{KEY_SEARCH}/ks-222-1.json"),
        ("ca7e5a1", _claim_costs, f"{KEY_SEARCH}/ca-222-1.json")]),
    ("a message's cost at 10,000 msg/s, fresh stacks, 60 s: 358f7f1 (one index for the due rows, migration 20, "
     "and the claims of a firer's own slices starting where the last ended) against ab19cc6 (the code before) and "
     "ca7e5a1, the three in turn, both layouts interleaved, 3 runs of each, 2026-11-30 11:36-12:01 UTC",
     "PostgreSQL's CPU and WAL per message ≤ 0.5 of ca7e5a1's; with Chronos ≤ 0.6", [
        ("358f7f1, one process of each role", _claim_costs, f"{ONE_DUE}/cur-111-1.json"),
        ("ab19cc6, one process of each role", _claim_costs, f"{ONE_DUE}/ks-111-1.json"),
        ("ca7e5a1, one process of each role", _claim_costs, f"{ONE_DUE}/ca-111-1.json"),
        ("358f7f1, two of every role", _claim_costs, f"{ONE_DUE}/cur-222-1.json"),
        ("ab19cc6, two of every role", _claim_costs, f"{ONE_DUE}/ks-222-1.json"),
        ("ca7e5a1, two of every role", _claim_costs, f"{ONE_DUE}/ca-222-1.json")]),
    ("a message's cost at 10,000 msg/s, fresh stacks, 60 s: 68e9007 (a firer's full claim every 2 s rather than "
     "every 0.5 s) against ca7e5a1, in turn, both layouts interleaved, 3 runs of each, 2026-11-30 15:22-15:39 UTC",
     "PostgreSQL's CPU and WAL per message ≤ 0.5 of ca7e5a1's; with Chronos ≤ 0.6", [
        ("68e9007, one process of each role", _claim_costs, f"{FULL_2S}/new-111-1.json"),
        ("ca7e5a1, one process of each role", _claim_costs, f"{FULL_2S}/ca-111-1.json"),
        ("68e9007, two of every role", _claim_costs, f"{FULL_2S}/new-222-1.json"),
        ("ca7e5a1, two of every role", _claim_costs, f"{FULL_2S}/ca-222-1.json")]),
    ("a message's cost at 10,000 msg/s, fresh stacks, 60 s: 68e9007 against 92ba7dc (the code before: a full claim "
     "every 0.5 s), in turn, both layouts interleaved, 3 runs of each, 2026-11-30 15:45-16:02 UTC", "", [
        ("68e9007, one process of each role", _claim_costs, f"{FULL_2S_AB}/new-111-1.json"),
        ("92ba7dc, one process of each role", _claim_costs, f"{FULL_2S_AB}/cur-111-1.json"),
        ("68e9007, two of every role", _claim_costs, f"{FULL_2S_AB}/new-222-1.json"),
        ("92ba7dc, two of every role", _claim_costs, f"{FULL_2S_AB}/cur-222-1.json")]),
    ("a message's cost at 10,000 msg/s, two processes of every role, fresh stacks, 60 s: bc1cddf (one detector of "
     "a database reads the store gauges for all) against 7a72a93 (the code before: each detector read them) and "
     "ca7e5a1, the three in turn, 3 runs of each, 2026-11-30 18:07-18:20 UTC",
     "PostgreSQL's CPU and WAL per message ≤ 0.5 of ca7e5a1's; with Chronos ≤ 0.6", [
        ("bc1cddf", _claim_costs, f"{ONE_READER}/new-222-1.json"),
        ("7a72a93", _claim_costs, f"{ONE_READER}/old-222-1.json"),
        ("ca7e5a1", _claim_costs, f"{ONE_READER}/ca-222-1.json")]),
    ("a message's cost at 10,000 msg/s, one process of each role, fresh stacks, 60 s: no parallel workers in the "
     "processes' sessions (49970d0's change, run on 8d69fde before it was committed) against 37f26c0, in turn, 3 runs "
     "of each, 2026-11-30 22:29-22:37 UTC", "", [
        ("no parallel workers", _claim_costs, f"{NO_PARALLEL}-10k/nopar-111-1.json"),
        ("37f26c0", _claim_costs, f"{NO_PARALLEL}-10k/new-111-1.json")]),
    ("a firer's cost, one process of each role, fresh stacks, 45 s: 0a01f59 (a take's rows read in binary, each "
     "distinct time made once) against d906d66 (the code before), in turn, 3 runs of each, 2026-12-01 06:13-06:27 UTC",
     "", [
        ("0a01f59, 30,000 msg/s", _firer_costs, f"{BINARY_TAKE}-30k/bin-111-1.json"),
        ("d906d66, 30,000 msg/s", _firer_costs, f"{BINARY_TAKE}-30k/hd-111-1.json"),
        ("0a01f59, 10,000 msg/s", _firer_costs, f"{BINARY_TAKE}-10k/bin-111-1.json"),
        ("d906d66, 10,000 msg/s", _firer_costs, f"{BINARY_TAKE}-10k/hd-111-1.json")]),
    ("two of every role at 20,000 msg/s, fresh stacks, 30 s: 358f7f1 against 693dfc3 (before the firers' shares), "
     "in turn, 10 runs of each, 2026-11-30 12:17-12:34 UTC", "kept up at least as often as 693dfc3; publish "
     "lateness p99.9 ≤ 10 ms", [
        ("358f7f1", _claim_costs, f"{TWENTY_K}/cur-222-1.json"),
        ("693dfc3", _claim_costs, f"{TWENTY_K}/old-222-1.json")]),
    ("a firer's claim at 10,000 msg/s, two processes of every role, fresh stacks: the claim that deletes against "
     "ca7e5a1, in turn, 3 runs of each", "PostgreSQL's CPU and WAL per message ≤ 0.5 of ca7e5a1's; with Chronos ≤ 0.6", [
        ("the claim that deletes (the default)", _claim_costs, "2026-11-29/claim-222/head-1.json"),
        ("ca7e5a1", _claim_costs, "2026-11-29/claim-222/ca7e5a1-1.json")]),
    ("cells' cost at 10,000 msg/s, one process of each role: `--cells 1` against the same commit without cells "
     "and ca7e5a1 (before cells), fresh stacks, the three in turn, 3 runs of each, 2026-11-28 16:34-16:47 UTC",
     "within 5 %", [
        ("`chronos up --cells 1`", _cell_costs, "2026-11-28/cells-cost/cells-1-1.json"),
        ("`chronos up`, no cells", _cell_costs, "2026-11-28/cells-cost/without-cells-1.json"),
        ("ca7e5a1", _cell_costs, "2026-11-28/cells-cost/ca7e5a1-1.json"),
        ("`chronos up --cells 2` (one firer and detector per cell, one consumer for both), the same code, just "
         "before", _cell_costs, "2026-11-28/cells-cost/two-cells-1.json")]),
    ("one cell's PostgreSQL frozen 25 s under 1,000 msg/s (`chronos up --cells 2`, two processes of every role "
     "per cell)", "the other cell's p99.9 within 10 % of the same run's fault-free p99.9; nothing lost or early", [
        ("SIGSTOP of the postmaster and every backend", _freeze, "2026-11-28/cells/freeze-25s-2x2x2.json")]),
    ("a partition moved between cells under 1,000 msg/s (`chronos up --cells 2`, one process of each role per "
     "cell)", "nothing lost or early; the moved partition ≤ 5 s late; the others' p99.9 unchanged", [
        ("a million far-future rows in the partition, unpaced (the default)", _move,
         "2026-11-28/cells/move-1m-1x1x1.json"),
        ("the same, unpaced, with the cut-over that takes no lock of the table", _move,
         "2026-11-28/cells/move-1m-1x1x1-unpaced-2.json"),
        ("the same, paced at 10,000 rows a second (CHRONOS_MOVE_RATE), other tests beside it", _move,
         "2026-11-28/cells/move-1m-1x1x1-paced.json"),
        ("the same, again", _move, "2026-11-28/cells/move-1m-1x1x1-paced-2.json"),
        ("unpaced, each batch of the wake from where the last ended (`7962ce2`), other tests beside it (load 3-12); "
         "first of two pairs interleaved with the code before it", _move, "2026-11-28/cells/wake-ab/keyset-1.json"),
        ("the code before it (`b9e507d`), each batch of the wake from the first, the same hour", _move,
         "2026-11-28/cells/wake-ab/first-1.json"),
        ("`b9e507d` again", _move, "2026-11-28/cells/wake-ab/first-2.json"),
        ("`7962ce2` again", _move, "2026-11-28/cells/wake-ab/keyset-2.json"),
        ("unpaced, the move's forgets skipping the rows a write holds (`fea758e`), 2026-11-29; first of three runs "
         "interleaved with the same code lowering the move's server processes to nice 10", _move,
         "2026-11-29/cells/renice-ab/before-1.json"),
        ("the same, its server processes at nice 10 (tried and reverted: no effect measured)", _move,
         "2026-11-29/cells/renice-ab/after-1.json"),
        ("without them lowered, second run", _move, "2026-11-29/cells/renice-ab/before-2.json"),
        ("lowered, second run", _move, "2026-11-29/cells/renice-ab/after-2.json"),
        ("without them lowered, third run", _move, "2026-11-29/cells/renice-ab/before-3.json"),
        ("lowered, third run", _move, "2026-11-29/cells/renice-ab/after-3.json"),
        ("paced at 10,000 rows a second (CHRONOS_MOVE_RATE), nothing else running, 2026-11-29", _move,
         "2026-11-29/cells/move-1m-paced-10k.json"),
        ("unpaced (the default), the firers taking rows with the claim that deletes (the default), nothing else "
         "running", _move, "2026-11-29/cells/move-1m-delete-claim.json"),
        ("the runs above had the harness's load producer send in batches of 5 ms and its reader fetch every 10 ms: "
         "the embedded broker lists every stored batch at each fetch, and without a move of note (10,000 rows) it "
         "came to use most of the machine", _machine, "2026-11-29/cells/harness-batches/broker-5ms-10ms.json"),
        ("the same with batches and fetches of 50 ms, as `benchmarks.cells` now runs", _machine,
         "2026-11-29/cells/harness-batches/broker-50ms-50ms.json"),
        ("a million far-future rows, unpaced, batches and fetches of 50 ms", _move,
         "2026-11-29/cells/harness-batches/move-1m-unpaced-1.json"),
        ("the same, paced at 10,000 rows a second", _move, "2026-11-29/cells/harness-batches/move-1m-paced-10k.json"),
        ("unpaced again", _move, "2026-11-29/cells/harness-batches/move-1m-unpaced-2.json"),
        ("unpaced, two processes of every role per cell (`--consumers 2 --firers 2 --detectors 2`)", _move,
         "2026-11-29/cells/harness-batches/move-1m-unpaced-2x2x2.json"),
        ("unpaced, the first of three pairs interleaved with the move's server processes lowered to nice 10 "
         "(`7c326a7`, not adopted); the other partitions' lateness at the end of a move comes from its last step, "
         "the drop of its triggers, whose lock request every write to the old cell's table waits behind", _move,
         "2026-11-29/cells/harness-batches/move-1m-head-1.json"),
        ("lowered, first run", _move, "2026-11-29/cells/harness-batches/move-1m-nice-1.json"),
        ("lowered, second run", _move, "2026-11-29/cells/harness-batches/move-1m-nice-2.json"),
        ("not lowered, second run", _move, "2026-11-29/cells/harness-batches/move-1m-head-2.json"),
        ("not lowered, third run", _move, "2026-11-29/cells/harness-batches/move-1m-head-3.json"),
        ("lowered, third run", _move, "2026-11-29/cells/harness-batches/move-1m-nice-3.json"),
        ("unpaced, the triggers dropped only while the table's lock is free at once, else left noting nothing "
         "(`20741f5`): in each run the lock was never free and the move left them", _move,
         "2026-11-29/cells/harness-batches/move-1m-triggers-left-1.json"),
        ("the same, second run", _move, "2026-11-29/cells/harness-batches/move-1m-triggers-left-2.json"),
        ("the same, third run", _move, "2026-11-29/cells/harness-batches/move-1m-triggers-left-3.json"),
        ("unpaced, the first of three moves run in turn with a control each: the same run without the move, "
         "reporting the same seconds (the embedded broker slows as it fills, so the seconds before a move are no "
         "baseline for those during it)", _move, "2026-11-29/cells/control-ab/move-1.json"),
        ("control, first run", _move, "2026-11-29/cells/control-ab/control-1.json"),
        ("control, second run", _move, "2026-11-29/cells/control-ab/control-2.json"),
        ("move, second run", _move, "2026-11-29/cells/control-ab/move-2.json"),
        ("move, third run", _move, "2026-11-29/cells/control-ab/move-3.json"),
        ("control, third run", _move, "2026-11-29/cells/control-ab/control-3.json"),
        ("unpaced, two processes of every role per cell, with controls in turn", _move,
         "2026-11-29/cells/control-ab/move-2x2x2-1.json"),
        ("control, two of every role, first run", _move, "2026-11-29/cells/control-ab/control-2x2x2-1.json"),
        ("control, two of every role, second run", _move, "2026-11-29/cells/control-ab/control-2x2x2-2.json"),
        ("move, two of every role, second run", _move, "2026-11-29/cells/control-ab/move-2x2x2-2.json"),
        ("the runs above had the harness collect its garbage as Python does: its full collections walked every "
         "object it keeps per message, and every read time waited for them. The same move, the collector left on, "
         "its collections recorded", _gc_pauses, "2026-11-29/cells/control-ab/gc-on-move-1.json"),
        ("unpaced, the harness's collector off (as `benchmarks.cells` now runs), the first of three moves run in "
         "turn with a control each", _move, "2026-11-29/cells/control-ab/gc-move-1.json"),
        ("control, first run", _move, "2026-11-29/cells/control-ab/gc-control-1.json"),
        ("control, second run", _move, "2026-11-29/cells/control-ab/gc-control-2.json"),
        ("move, second run", _move, "2026-11-29/cells/control-ab/gc-move-2.json"),
        ("move, third run", _move, "2026-11-29/cells/control-ab/gc-move-3.json"),
        ("control, third run", _move, "2026-11-29/cells/control-ab/gc-control-3.json"),
        ("each cell's table aged first by 3,000,000 messages (`--aged 3000000`)", _move,
         "2026-11-29/cells/control-ab/gc-move-aged-3m-1.json"),
        ("control, the tables aged the same", _move, "2026-11-29/cells/control-ab/gc-control-aged-3m-1.json"),
        ("the first wait for the table's lock at the start of a move as long as a firer holds a batch (`107a806`: "
         "the lookahead and 100 ms, where the waits of 50, 100 and 200 ms before each failed), the first of three "
         "runs in turn with the code before it", _move_start, "2026-11-29/cells/control-ab/lock-move-1.json"),
        ("the code before it (`9a92905`)", _move_start, "2026-11-29/cells/control-ab/gc-move-4.json"),
        ("`107a806`, second run", _move_start, "2026-11-29/cells/control-ab/lock-move-2.json"),
        ("`9a92905`, second run", _move_start, "2026-11-29/cells/control-ab/gc-move-5.json"),
        ("`107a806`, third run", _move_start, "2026-11-29/cells/control-ab/lock-move-3.json"),
        ("`107a806`, two processes of every role per cell", _move,
         "2026-11-29/cells/control-ab/lock-move-2x2x2-1.json"),
        ("its control", _move, "2026-11-29/cells/control-ab/lock-control-2x2x2-1.json"),
        ("`107a806`, two of every role, second run", _move, "2026-11-29/cells/control-ab/lock-move-2x2x2-2.json"),
        ("control, two of every role, second run", _move, "2026-11-29/cells/control-ab/lock-control-2x2x2-2.json"),
        ("control, two of every role, third run", _move, "2026-11-29/cells/control-ab/lock-control-2x2x2-3.json"),
        ("`107a806`, two of every role, third run", _move, "2026-11-29/cells/control-ab/lock-move-2x2x2-3.json"),
        ("each cell's table aged first by 3,000,000 messages, with the first wait of `107a806`: the first of three "
         "moves run in turn with a control each", _move, "2026-11-29/cells/control-ab/aged-move-1.json"),
        ("control, the tables aged the same, first run", _move, "2026-11-29/cells/control-ab/aged-control-1.json"),
        ("control, second run", _move, "2026-11-29/cells/control-ab/aged-control-2.json"),
        ("move, second run", _move, "2026-11-29/cells/control-ab/aged-move-2.json"),
        ("move, third run", _move, "2026-11-29/cells/control-ab/aged-move-3.json"),
        ("control, third run", _move, "2026-11-29/cells/control-ab/aged-control-3.json")]),
    ("200,000 messages due at the same instant", "", [
        ("one process per role", _spike, "2026-11-23/day-1x1x1.json"),
        ("two of every role", _spike, "2026-11-23/day-2x2x2.json")]),
    ("slowest claim, delete or detector scan through bursts, drains and vacuums", "≤ 1 s", [
        ("one process per role", _slowest_statement, "2026-11-23/day-1x1x1.json"),
        ("two of every role", _slowest_statement, "2026-11-23/day-2x2x2.json")]),
    ("fire rate of one firer, 100,000 due rows", "within 10% of an empty table", [
        ("10 million rows due in two years waiting", _fire_rate, "2026-11-21/s2-fire_rate-far10m/fire_rate.json"),
        ("an earlier run the same day: an empty table", _fire_rate, "2026-11-21/fire_rate-empty/fire_rate.json"),
        ("that earlier run: 10 million rows waiting", _fire_rate, "2026-11-21/fire_rate-far10m/fire_rate.json")]),
    ("resident memory per process", "< 200 MB", [
        ("after draining 100,000 rows", _memory, "2026-11-21/s2-fire_rate-far10m/fire_rate.json")]),
    ("bulk scheduling of 10 million rows", "", [
        ("fsync on", _bulk, "2026-11-21/bulk_schedule-10m.json")]),
]

#: The README's rows: (figure, the FIGURES entry, which of its lines)
README_FIGURES = [
    ("p99.9 jitter at 1,000 msg/s, one process per role", "p99.9 jitter at 1,000 msg/s", (0, 1)),
    ("highest rate holding p99.9 ≤ 500 ms", "highest rate holding p99.9 ≤ 500 ms", (0, 1)),
    ("CPU at 10,000 msg/s, Chronos and PostgreSQL, on one PostgreSQL step after step",
     "CPU at 10,000 msg/s, Chronos and PostgreSQL, on one PostgreSQL step after step (Chronos and the broker "
     "restarted between steps)", (0, 1)),
    ("firing with 10 million far-future rows waiting", "fire rate of one firer, 100,000 due rows", (0,)),
    ("200,000 messages due at the same instant", "200,000 messages due at the same instant", (0,)),
]


def _source(path: str) -> str:
    return f"`{path}`"


def _code(path: str) -> str:
    """The commit of the service a result file measured (another checkout's, when the run names one), and
    whether it had changes not yet committed; `-` for a run from before results named their code."""
    code = _result(path).get("code") or {}
    if isinstance(code, str):  # a benchmark that records its commit alone
        return f"`{code[:7]}`"
    own = "service_commit" not in code
    commit = code.get("git_commit" if own else "service_commit")
    if not commit:
        return "-"
    return f"`{commit[:7]}`" + (" and changes not committed" if code.get("git_dirty" if own else "service_dirty") else "")


def glance_page() -> str:
    """The latest figure of every benchmark, each read from its result file, with the date and the code of its run."""
    rows = []
    for figure, target, lines in FIGURES:
        for i, (what, read, path) in enumerate(lines):
            date = str(_result(path).get("date") or path.split("/")[0])  # a run without its date: its directory's
            rows.append((figure if i == 0 else "", target if i == 0 else "", what, read(path), _day(date),
                         _code(path), _source(path)))
    return _table(("figure", "target", "run", "result", "date (UTC)", "code", "result file (benchmarks/results/)"),
                  rows)


def readme_table() -> str:
    """The README's performance table: the headline figures, read from the same result files."""
    by_name = {figure: lines for figure, _, lines in FIGURES}
    rows = []
    for label, name, which in README_FIGURES:
        lines = [by_name[name][i] for i in which]
        rows.append((label, "; ".join(f"{what}: {read(path)}" for what, read, path in lines),
                     ", ".join(_source(path) for path in dict.fromkeys(path for _, _, path in lines))))
    return _table(("figure", "result", "result files (benchmarks/results/)"), rows)


def _cell_ms(value: Any) -> str:
    return "-" if value is None else f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"


def _slowest_cell(statement: dict[str, Any] | None) -> str:
    """A phase's slowest statement: exact, or the bucket bound it stayed under ("≤")."""
    if not statement:
        return "-"
    over = f" ({statement['over_1s']}>1s)" if statement.get("over_1s") else ""
    return f"{'' if statement.get('exact') else '≤'}{statement['slowest_s']:.3f}{over}"


def day_table(result: str) -> str:
    """One run of benchmarks/day.py (a stack aged phase after phase), a row per phase, from its result file."""
    rows = []
    for p in _result(result)["phases"]:
        j, pub, floor, st = (p.get("jitter_ms") or {}), (p.get("publish_lateness_ms") or {}), \
            (p.get("broker_floor_ms") or {}), p["statements"]
        notes = []
        if p.get("spike"):
            notes.append(f"drained in {p['spike']['drain_s']:.1f} s at {p['spike']['fire_rate']:,.0f}/s")
        if p.get("far_rows"):
            notes.append(f"{p['far_rows']:,} rows in {p['far_fill_s']:.1f} s")
        event = p.get("event") or {}
        if event.get("vacuum_s") is not None:
            notes.append(f"VACUUM {event['vacuum_s']:.1f} s")
        missed = [k for k, ok in (p.get("targets") or {}).items() if not ok]
        if missed:
            notes.append("missed: " + ", ".join(missed))
        rows.append((p["name"], "all due at once" if p.get("spike") else f"{p['rate']:,.0f}", f"{p['sent']:,}",
                     " / ".join(_cell_ms(j.get(q)) for q in ("p50", "p99", "p999")), _cell_ms(pub.get("p999")),
                     _cell_ms(floor.get("p999")), _slowest_cell(st.get("claim")), _slowest_cell(st.get("delete")),
                     _slowest_cell(st.get("scan")), p["duplicates"], f"{p['late_over_60s']:,}", f"{p['lost']:,}",
                     "; ".join(notes)))
    return _table(("phase", "msg/s", "sent", "jitter p50 / p99 / p99.9 ms", "publish lateness p99.9 ms",
                   "floor p99.9 ms", "slowest claim s", "slowest delete s", "slowest scan s", "dup", ">60 s late",
                   "not received by the reader", "notes"), rows)


DAY_MARKER = re.compile(r"<!-- generated: day (?P<result>[\w./-]+) -->")

#: The targets of a comparison (benchmarks.sla --target), in the order shown, and their names.
_TARGETS = {"chronos": "Chronos", "pgqueuer": "pgqueuer", "graphile": "graphile-worker"}


def _work_cores(cpu: dict[str, Any]) -> tuple[float, float]:
    """(the scheduler's processes and PostgreSQL, PostgreSQL alone) in cores: Chronos's roles, or a job
    queue's workers; not the broker, nor the harness's own producer, reader and probe."""
    cores = {name: (v["cores"] if isinstance(v, dict) else v) for name, v in cpu.items()}
    work = sum(c for name, c in cores.items() if name.startswith(("consumer", "firer", "detector", "postgres"))
               or ("worker" in name and "reader" not in name))
    return work, cores.get("postgres", 0.0)


def compare_table(folder: str) -> str:
    """One run of every target of a comparison (`benchmarks.sla --target ...`, a result file each in
    `folder`), by rate, then target and layout, from their result files."""
    runs = [(path.relative_to(RESULTS).as_posix(), _result(path.relative_to(RESULTS).as_posix()))
            for path in sorted((RESULTS / folder).glob("*.json"))]
    runs = [(path, r) for path, r in runs if r.get("target") in _TARGETS and "find_max" not in r]
    runs.sort(key=lambda pr: (pr[1]["offered_rate"], list(_TARGETS).index(pr[1]["target"]), pr[1]["layout"]))
    rows = []
    for path, r in runs:
        j, floor, late = r["jitter_ms"], r.get("broker_floor_ms") or {}, r.get("publish_lateness_ms") or {}
        work, pg = _work_cores(r["cpu"])
        broker = r["cpu"].get("broker")
        rows.append((f"{_TARGETS[r['target']]} {r['layout']}", f"{r['offered_rate']:,.0f}",
                     " / ".join(_cell_ms(j[q]) for q in ("p50", "p99", "p999")), _cell_ms(floor.get("p999")),
                     _cell_ms(late.get("p999")), f"{r['fire_rate']:,.0f} / {r['due_rate']:,.0f}",
                     f"{r['backlog']['max']:,}", f"{work:.2f} (PostgreSQL {pg:.2f})",
                     "-" if broker is None else f"{broker['cores'] if isinstance(broker, dict) else broker:.2f}",
                     "pass" if r["sla_pass"] else "fail", _code(path)))
    return _table(("target, layout", "rate", "jitter p50 / p99 / p99.9 (ms)", "broker floor p99.9 (ms)",
                   "publish lateness p99.9 (ms)", "fire / due (msg/s)", "backlog max",
                   "CPU, scheduler + PostgreSQL (cores)", "the broker's CPU (cores)", "SLA", "code"), rows)


COMPARE_MARKER = re.compile(r"<!-- generated: compare (?P<folder>[\w./-]+) -->")


# -- a sampled profile of PostgreSQL under load (perf) ------------------------------------------------

PROFILE_MARKER = re.compile(r"<!-- generated: profile (?P<result>[\w./-]+) -->")


def profile_table(path: str) -> str:
    """A sampled profile of PostgreSQL's processes under load (perf, all CPUs): each process's share of
    PostgreSQL's samples and its leading functions."""
    r = _result(path)
    machine = {name: share for share, name in r["samples_by_command_percent"]}
    rows = [(f"`{p['process']}` ({p['sessions']} session{'s' if p['sessions'] > 1 else ''})", f"{p['share']:.0f} %",
             ", ".join(f"`{name.split('] ', 1)[-1]}` {share:.0f} %" for share, name in p["symbols_percent"][:6]))
            for p in r["postgres_by_process_percent"]]
    return (f"`{r['command']}` {r['when']} of `{r['during']}`, {_day(r['date'])} UTC, code `{r['code'][:7]}`; "
            f"PostgreSQL had {machine.get('postgres', 0):.0f} % of the machine's samples (result file "
            f"`benchmarks/results/{path}`).\n\n"
            + _table(("process", "share of PostgreSQL's samples", "its leading functions (share of its own samples)"),
                     rows))


# -- a key many messages share (benchmarks/hot_key.py) ------------------------------------------------

HOT_KEY_MARKER = re.compile(r"<!-- generated: hot-key (?P<result>[\w./-]+) -->")
_HOT_KEY_INDEXES = {"hash": "hash index on `key` (migrations 6-14)", "btree": "B-tree of the key's hash (migration 15)"}


def hot_key_table(path: str) -> str:
    """`benchmarks.hot_key`'s run: a batch's time early and late, and the whole time, per index and kind of key."""
    r = _result(path)
    rows = [f"| index | keys | a batch, first tenth | a batch, last tenth | {r['rows']:,} rows in all |",
            "| --- | --- | ---: | ---: | ---: |"]
    for index, name in _HOT_KEY_INDEXES.items():
        for keys, said in (("hot", "one key for every row"), ("unique", "a key of its own per row")):
            a = r["arms"][f"{index}-{keys}"]
            rows.append(f"| {name} | {said} | {a['first_tenth_batch_ms']:.0f} ms | {a['last_tenth_batch_ms']:.0f} ms "
                        f"| {a['total_s']:.1f} s |")
    rounds = min(a["rounds"] for a in r["arms"].values())
    return "\n".join(rows) + (f"\n\n{rounds} rounds of each arm, code `{r['code']['git_commit'][:7]}`, "
                              f"load average {r['load_average_1m']} at the end.")


# -- capacity planning (benchmarks/capacity.py) ---------------------------------------------------

#: The run of `python -m benchmarks.capacity` that docs/operations/capacity.md shows.
CAPACITY_RESULT = "2026-11-30/capacity-1x1x1-one-due-index.json"
#: The key-search index, which a database has only where an operator builds it (`chronos key-search on`), under
#: each name it has had.
KEY_SEARCH_INDEXES = ("chronos_messages_key", "chronos_messages_key_hash")


def _mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MB" if n >= 2**20 else f"{n / 2**10:,.0f} kB"


_INDEX_DDL = re.compile(r"\bDROP INDEX (?:CONCURRENTLY )?(?:IF EXISTS )?(?P<dropped>\w+)"
                        r"|\bCREATE (?:UNIQUE )?INDEX (?:CONCURRENTLY )?(?:IF NOT EXISTS )?(?P<made>\w+)\s+ON\s+(?P<table>\w+)")


def schema_indexes(table: str = "chronos_messages") -> dict[str, str]:
    """The indexes the shipped migrations leave on `table` (its primary key apart): name -> the migration
    (its file) that makes it."""
    return _index_history(table)[0]


def _index_history(table: str) -> tuple[dict[str, str], dict[str, str]]:
    """(the indexes the shipped migrations leave on `table`, those they made and dropped since): name -> the
    migration that makes it, and name -> the migration that drops it."""
    from chronos.adapters.postgres.migrations import migrations
    found: dict[str, str] = {}
    dropped: dict[str, str] = {}
    for migration in migrations():
        for m in _INDEX_DDL.finditer(re.sub(r"--[^\n]*", "", migration.sql)):
            if m["dropped"]:
                if found.pop(m["dropped"], None) is not None:
                    dropped[m["dropped"]] = f"migration {migration.version}"
            elif m["table"] == table:
                found[m["made"]] = f"migration {migration.version}"
                dropped.pop(m["made"], None)
    return found, dropped


def capacity_page(result: str = CAPACITY_RESULT) -> str:
    """Disk per million waiting messages, WAL per 10,000 msg/s and sessions per process, from one result file,
    with the date and code of its run, and the indexes the schema has gained since it, which it did not measure."""
    data = _result(result)
    disk, load = data["disk"], data["load"]
    per = disk["bytes_per_million"]
    disk_rows = [("all of it", _mb(per["total"])), ("the table (heap)", _mb(per["heap"])),
                 *((f"index `{name}`", _mb(size)) for name, size in per["indexes"].items()), ("TOAST", _mb(per["toast"]))]
    since = {name: where for name, where in schema_indexes().items() if name not in per["indexes"]}
    stale = "" if not since else (
        "\n\nThe schema has gained indexes since this run, which neither its disk nor its WAL figures include: "
        + ", ".join(f"`{name}` ({where})" for name, where in since.items()) + ".")
    made, dropped = _index_history("chronos_messages")
    gone = [name for name in per["indexes"] if name not in made and name != "chronos_messages_pkey"]
    optional = [name for name in gone if name in KEY_SEARCH_INDEXES]
    replaced = [name for name in gone if name not in KEY_SEARCH_INDEXES]
    if optional:
        stale += ("\n\nThis run's schema had indexes that a database has since only where an operator builds them, which "
                  "its disk and WAL figures include: " + ", ".join(f"`{name}`" for name in optional)
                  + " (the key-search index: [Search by key](inspect-and-steer.md#search-by-key)).")
    if replaced:
        stale += ("\n\nThis run's schema had indexes that a later migration dropped, which its disk and WAL figures "
                  "include: " + ", ".join(f"`{name}` ({dropped.get(name, 'dropped')})" for name in replaced) + ".")
    sessions = "; ".join(f"{role}: {', '.join(map(str, counts))}" for role, counts in load["sessions"].items())
    wal_s = load["wal_mb_per_s_at_10000"]
    load_rows = [
        ("WAL per message (insert, claim, delete and the vacuum of its row)", f"{load['wal_bytes_per_message']:,} bytes"),
        ("WAL at 10,000 msg/s", f"{wal_s:g} MB/s, {wal_s * 3600 / 1024:,.1f} GB an hour"),
        ("of the WAL, full-page images", f"{load['wal_full_page_images']:,} of {load['wal_records']:,} records "
         f"(checkpoint_timeout {load['checkpoint_timeout']}, max_wal_size {load['max_wal_size']})"),
        ("PostgreSQL sessions per process, by role", sessions),
    ]
    head = (f"Run of {_day(data['date'])} UTC, code {_code(result)} (`{data['command'].strip()}`; result file "
            f"`benchmarks/results/{result}`): {disk['rows']:,} waiting messages (36-character ids, "
            f"{disk.get('payload_bytes', 100)}-byte values, "
            f"a key, one 16-byte header) written through the consumer's own write path; then {load['rate']:,.0f} msg/s "
            f"for {load['duration_s']:g} s (delays 3-10 s), layout {load['layout']}, on a fresh `chronos up`.\n\n")
    return (head + "Disk per million waiting messages:\n\n" + _table(("part", "size"), disk_rows)
            + stale + "\n\nUnder load:\n\n" + _table(("figure", "measured"), load_rows))


# -- the design's limit (benchmarks/design_limit.py) against Chronos -----------------------------

DESIGN_LIMIT = "2026-11-28/design-limit"
CPU_10000 = {"1/1/1": "2026-11-28/cpu-ab/now-111-1.json", "2/2/2": "2026-11-28/cpu-ab/now-222-1.json"}
FIND_MAX = "2026-11-28/find-max"


def design_limit_page(folder: str = DESIGN_LIMIT) -> str:
    """The hot path's own SQL with no Kafka and no Python per message, as fast as the machine allows and
    at 10,000 msg/s, beside Chronos at 10,000 msg/s in the same hour and its highest rate within the SLA."""
    limit, at_rate = _result(f"{folder}/max.json"), _result(f"{folder}/rate-10000.json")
    by_layout = {r["layout"]: r for r in limit["rows"]}
    rated = {r["layout"]: r for r in at_rate["rows"]}
    rows = []
    for layout, find_max in (("1/1/1", "chronos-1x1x1.json"), ("2/2/2", "chronos-2x2x2.json")):
        chronos = _result(CPU_10000[layout])
        cpu = {k: (v["cores"] if isinstance(v, dict) else v) for k, v in chronos["cpu"].items()}
        pg, total = cpu["postgres"], _scheduler_cores(chronos["cpu"])
        design, design_10k = by_layout[layout], rated[layout]
        design_total = design_10k["postgres_cores"] + design_10k["driver_cores"]
        best = _result(f"{FIND_MAX}/{find_max}")["find_max"]["max_sustained_rate"]
        rows.append((layout, f"{design['rate_per_s']:,} msg/s ({design['postgres_cores']:.2f} cores of PostgreSQL)",
                     f"{best:,.0f} msg/s", f"{best / design['rate_per_s']:.2f}",
                     f"{design_10k['postgres_cores']:.2f}", f"{pg:.2f}", f"{pg / design_10k['postgres_cores']:.2f}",
                     f"{design_total:.2f}", f"{total:.2f}", f"{total / design_total:.2f}"))
    runs = " and ".join(f"`benchmarks/results/{path}`" for path in CPU_10000.values())
    head = (f"`{limit['command']}` and `{at_rate['command']}`, then `python -m benchmarks.sla --rate 10000 --duration 60`"
            f" in each layout, one after the other on the quiet machine ({limit['date']}; result files in "
            f"`benchmarks/results/{folder}/`, Chronos's runs in {runs}; the highest rates "
            f"within the SLA from `benchmarks/results/{FIND_MAX}/`, the same hour). CPU in cores: all of PostgreSQL's "
            f"processes, and for the totals Chronos's processes or the driver's.\n\n")
    return head + _table(("layout", "the design's limit", "Chronos within the SLA", "ratio",
                          "PostgreSQL at 10,000 msg/s: the design", "Chronos", "ratio",
                          "all at 10,000 msg/s: the design", "Chronos", "ratio"), rows)


# -- MkDocs -------------------------------------------------------------------------------------

GENERATED: dict[str, Callable[[], str]] = {
    "reference/settings.md": settings_page,
    "reference/commands.md": lambda: commands_page() + "\n\n## Exit codes\n\n" + exit_codes_page(),
    "reference/metrics.md": metrics_page,
    "reference/reason-codes.md": reason_codes_page,
    "operations/postgresql-ha.md": lambda: ha_page() + "\n\nThe same primary cut off by a network partition, and "
                                         "its packets dropped one way only, on a fleet of hosts ([all the "
                                         "partitions](failure-behaviour.md#network-partitions-on-a-fleet-of-hosts)):"
                                         "\n\n" + fleet_page(keys=("primary", "primary-out")),
    "operations/failure-behaviour.md": fleet_page,
    "operations/upgrading.md": upgrade_page,
    "observability/dashboard-and-alerts.md": alerts_page,
    "operations/capacity.md": capacity_page,
    "benchmarks/latest.md": glance_page,
    "benchmarks/hot-path.md": design_limit_page,
}


def on_files(files: Any, config: Any) -> Any:
    """Publish the benchmark figures the pages show, from where the benchmarks wrote them."""
    from mkdocs.structure.files import File
    for figure in RESULT_FIGURES:
        files.append(File.generated(config, f"benchmarks/results/{figure}",
                                    abs_src_path=str(ROOT / "benchmarks" / "results" / figure)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Fill in a page's generated parts: its own table, and the tables of day-in-the-life runs it names."""
    markdown = DAY_MARKER.sub(lambda m: day_table(m["result"]), markdown)
    markdown = COMPARE_MARKER.sub(lambda m: compare_table(m["folder"]), markdown)
    markdown = HOT_KEY_MARKER.sub(lambda m: hot_key_table(m["result"]), markdown)
    markdown = PROFILE_MARKER.sub(lambda m: profile_table(m["result"]), markdown)
    make = GENERATED.get(page.file.src_uri)
    if make is None:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{page.file.src_uri} lost its {MARKER} marker")
    return markdown.replace(MARKER, make())
