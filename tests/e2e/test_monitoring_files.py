"""The shipped Grafana dashboard and Prometheus alert rules (monitoring/) name only metrics and labels that
the running processes export, and the rules pass promtool."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from chronos.adapters.postgres.store import Store
from chronos.embedded.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "monitoring" / "grafana-dashboard.json"
RULES = ROOT / "monitoring" / "prometheus-rules.yml"
SCRAPE = ROOT / "monitoring" / "prometheus-scrape.yml"

# PromQL words that are not label names when they stand before a parenthesised label list
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_MATCHERS = re.compile(r"\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_METRIC = re.compile(r"\bchronos_[a-zA-Z0-9_]+\b|\bup(?=\{)")
PROMETHEUS_OWN = {"up": {"job", "instance"}}  # the series Prometheus itself makes of every scrape
_LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")     # Grafana: {{label}}
_ANNOTATION = re.compile(r"\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)")           # Prometheus: {{ $labels.label }}


def promtool() -> str:
    """promtool from the venv (the Makefile puts it there) or PATH; missing is a failure, not a skip."""
    here = Path(sys.executable).parent / "promtool"
    found = str(here) if here.exists() else shutil.which("promtool")
    if not found:
        pytest.fail("promtool not found: `make test` fetches it into .venv/bin (from Debian's prometheus package)")
    return found


def expressions() -> list[tuple[str, str, list[str]]]:
    """(where, PromQL, label names its legend or annotations use) of every dashboard query and rule."""
    found = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            legend = _LEGEND.findall(target.get("legendFormat", ""))
            found.append((f"dashboard panel {panel['title']!r}", target["expr"], legend))
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            text = " ".join(str(v) for v in rule.get("annotations", {}).values())
            found.append((f"rule {rule['alert']}", rule["expr"], _ANNOTATION.findall(text)))
    return found


def names_used(expr: str, legend: list[str]) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression and its legend refer to."""
    metrics = set(_METRIC.findall(expr))
    labels = {m for body in _MATCHERS.findall(expr) for m in _MATCHER.findall(body)}
    labels |= {n.strip() for body in _GROUPING.findall(expr) for n in body.split(",") if n.strip()}
    return metrics, labels | set(legend)


def unknown_names(exported: dict[str, set[str]]) -> list[str]:
    exported = {**exported, **PROMETHEUS_OWN}
    problems = []
    for where, expr, legend in expressions():
        metrics, labels = names_used(expr, legend)
        if not metrics:
            problems.append(f"{where}: names no chronos metric: {expr}")
        for m in sorted(metrics - exported.keys()):
            problems.append(f"{where}: metric {m} is exported by no process")
        known = set().union(*(exported.get(m, set()) for m in metrics))
        for label in sorted(labels - known):
            problems.append(f"{where}: label {label!r} is on none of {sorted(metrics)}")
    return problems


def scrape(port: int) -> dict[str, set[str]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body = response.read().decode()
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def exported_families(port: int) -> set[str]:
    """The names of the chronos_* metric families a process serves, as the reference names them."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body = response.read().decode()
    return {f.name + "_total" if f.type == "counter" else f.name
            for f in text_string_to_metric_families(body) if f.name.startswith("chronos_")}


def docs_hooks() -> Any:
    """docs/hooks.py, which generates the reference pages."""
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


def documented_metrics() -> set[str]:
    """The metrics of the generated reference page (docs/hooks.py)."""
    return set(docs_hooks().metric_families())


def test_the_checker_catches_a_wrong_metric_and_a_wrong_label():
    exported = {"chronos_rows_due": {"role", "node"}}
    assert names_used('sum by (reason) (rate(chronos_x_total{topic="a"}[5m]))', ["node"]) == (
        {"chronos_x_total"}, {"reason", "topic", "node"})
    problems = [p for p in unknown_names(exported) if "chronos_rows_due" not in p.split("metric ")[-1]]
    assert any("exported by no process" in p for p in problems)
    assert not [p for p in unknown_names({**exported, **{m: {"role", "node", "le", "reason", "step", "action",
                                                                     "topic", "partition", "server", "cell"}
                                                        for _, e, _ in expressions() for m in _METRIC.findall(e)}})]


# chronos_* words of the rules' annotations that are not metrics: a table, the docs' external label
NOT_METRICS = {"chronos_parked", "chronos_docs"}


def test_every_metric_an_alert_watches_or_points_to_has_a_dashboard_panel():
    """What a rule's expression reads, and every metric its description or confirm line sends the operator
    to, has a dashboard query naming it; an annotation naming a metric no process exports is a mistake."""
    documented = documented_metrics() | {"up"}

    def family(name: str) -> str:  # a histogram's series are its family's
        base = re.sub(r"_(bucket|count|sum)$", "", name)
        return base if base in documented else name
    panels = {family(m) for where, expr, _ in expressions() if where.startswith("dashboard")
              for m in _METRIC.findall(expr)}
    missing, unknown = [], []
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            notes = rule["annotations"]
            words = {family(m) for m in _METRIC.findall(" ".join((rule["expr"], notes["description"],
                                                                   notes["confirm"])))}
            unknown += [(rule["alert"], m) for m in sorted(words - documented - NOT_METRICS)]
            missing += [(rule["alert"], m) for m in sorted((words & documented) - panels)]
    assert unknown == [], "annotations naming no exported metric"
    assert missing == [], "metrics an alert reads or points to with no dashboard panel"


# what one cell's detectors and firers report, and the consumers per cell: a query over them keeps the cell apart
PER_CELL = re.compile(r"\bchronos_(rows_\w+|oldest_overdue_seconds|recurring_schedules|store_gauges_timestamp_seconds|"
                      r"throttled_\w+|fire_lateness_seconds\w*|messages_(reset|vanished|released)_total|firer_\w+|"
                      r"consumer_cell_paused)\b")
_AGGREGATION = re.compile(r"\b(sum|max|min|avg|count)\s*(?:by\s*\(([^)]*)\))?\s*\(")


def test_what_is_per_cell_stays_per_cell_in_every_panel_and_rule():
    """Every dashboard query and rule over a cell's store, firers or detectors groups by cell, so that with
    cells each cell is shown apart and each alert names its cell (without cells, there is no cell label and
    `by (cell)` is one group, as before)."""
    merged = []
    for where, expr, legend in expressions():
        if not PER_CELL.search(expr):
            continue
        for op, by in _AGGREGATION.findall(expr):
            if "cell" not in [label.strip() for label in by.split(",")]:
                merged.append(f"{where}: {op}({by}) in {expr}")
        if where.startswith("dashboard") and "cell" not in legend:
            merged.append(f"{where}: its legend does not name the cell: {expr}")
    assert merged == []


def test_rules_pass_promtool_and_dashboard_queries_parse(tmp_path):
    tool = promtool()
    checked = subprocess.run([tool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # the shipped scrape configuration, with the rules it loads; its job is the one ChronosTargetDown watches
    checked = subprocess.run([tool, "check", "config", str(SCRAPE)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    jobs = [job["job_name"] for job in yaml.safe_load(SCRAPE.read_text())["scrape_configs"]]
    assert jobs == ["chronos"] and 'up{job="chronos"}' in RULES.read_text()
    # every rule says what to look at, not only what happened, how to confirm it, and links to its section
    rules = [r for group in yaml.safe_load(RULES.read_text())["groups"] for r in group["rules"]]
    assert [r["alert"] for r in rules if not r["annotations"].get("description")] == []
    assert [r["alert"] for r in rules if not r["annotations"].get("confirm")] == []
    page = docs_hooks().alerts_page()
    for rule in rules:
        assert rule["annotations"]["runbook_url"] == ("{{ $externalLabels.chronos_docs }}/observability/"
                                                      f"dashboard-and-alerts/#{rule['alert'].lower()}")
        assert f"### {rule['alert']}\n" in page  # the section the URL's anchor names
    # the targets files the shipped configuration discovers: what `chronos targets` prints for each example host
    files = sorted((SCRAPE.parent / "chronos-targets").glob("*.yml"))
    assert [f.name for f in files] == ["chronos-1.yml", "chronos-2.yml"]
    for f in files:
        text = f.read_text()
        layout = re.match(r"# Host (\S+): (\d+) consumers?, (\d+) firers?, (\d+) detectors?, "
                          r"CHRONOS_METRICS_PORT=(\d+) \(chronos targets\)\n", text)
        assert layout, text
        host, consumers, firers, detectors, port = layout.groups()
        printed = targets_of({"CHRONOS_CONSUMERS": consumers, "CHRONOS_FIRERS": firers, "CHRONOS_DETECTORS": detectors,
                              "CHRONOS_METRICS_PORT": port}, "--address", host)
        assert text == printed
    # the dashboard's queries, as recording rules, go through the same PromQL parser
    records = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"chronos:dashboard:{i}", "expr": expr}
        for i, (where, expr, _) in enumerate(expressions()) if where.startswith("dashboard")]}]}
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(records))
    checked = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def targets_of(env: dict[str, str], *args: str) -> str:
    """What `chronos targets` prints with these variables (a host's environment file) and flags."""
    done = subprocess.run([sys.executable, "-m", "chronos", "targets", *args], capture_output=True, text=True,
                          timeout=60, env={k: v for k, v in os.environ.items() if not k.startswith("CHRONOS_")} | env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_alert_fires_on_its_condition_and_is_silent_on_healthy_series(tmp_path):
    """`promtool test rules` with the cases of prometheus-rules.test.yml, on the shipped rules without their
    annotations (templates `promtool check rules` checks, which the cases would otherwise have to copy)."""
    cases_file = Path(__file__).with_name("prometheus-rules.test.yml")
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    (tmp_path / "cases.yml").write_text(cases_file.read_text())
    tested = subprocess.run([promtool(), "test", "rules", "cases.yml"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=120)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    checks = [check for case in yaml.safe_load(cases_file.read_text())["tests"] for check in case["alert_rule_test"]]
    alerts = {r["alert"] for group in rules["groups"] for r in group["rules"] if "alert" in r}
    fires = {c["alertname"] for c in checks if c["exp_alerts"]}
    silent = {c["alertname"] for c in checks if not c["exp_alerts"]}
    assert alerts - fires == set(), "alerts with no case where they fire"
    assert alerts - silent == set(), "alerts with no case where they stay silent"


def test_dashboard_and_rules_name_only_what_running_processes_export(chronos_env, two_cells, tmp_path):
    """The processes of a deployment with cells, whose series are those of one without and the cell labels."""
    for cell, share in (("a", [0, 1]), ("b", [2, 3])):
        store = Store(two_cells[cell])
        store.open_partitions(share, 1)
        store.close()
    cells = {"CHRONOS_CELLS": " ".join(f"{cell}={url}" for cell, url in two_cells.items()), "CHRONOS_CELL": "a",
             "CHRONOS_DATABASE_URL": ""}
    # a topic under a fire-rate limit, as a firer leaves its bucket: the throttled gauges are per topic
    with psycopg.connect(two_cells["a"], autocommit=True) as conn:
        conn.execute("INSERT INTO chronos_rate_limits (topic, rate, tokens, refilled_at) VALUES (%s, 5, 5, now())",
                     (chronos_env["CHRONOS_OUTPUT_TOPIC"],))
    # the embedded broker's figures, as `chronos up` writes them for its detector to export
    stats = tmp_path / "broker-stats.json"
    stats.write_bytes(orjson.dumps({"pid": 1, "rss_bytes": 1, "messages": 1, "input_unread": 0, "sampled_at": 1.0,
                                    "warning_bytes": 2, "restarts": 0, "lost_input": 0}))
    procs, ports = [], []
    try:
        for role in ("consumer", "firer", "detector"):
            port = free_port()
            log = tmp_path / f"{role}.log"
            procs.append((subprocess.Popen([sys.executable, "-m", "chronos", role],
                                           env={**os.environ, **chronos_env, **cells, "CHRONOS_METRICS_PORT": str(port),
                                                "CHRONOS_EMBEDDED_BROKER_STATS": str(stats)},
                                           stdout=open(log, "wb"), stderr=subprocess.STDOUT), log))
            ports.append(port)
        deadline = time.monotonic() + 60
        for (proc, log), port in zip(procs, ports):
            while f"serving /metrics and /healthz on port {port}" not in log.read_text(errors="replace"):
                assert proc.poll() is None, log.read_text(errors="replace")
                assert time.monotonic() < deadline, log.read_text(errors="replace")
                time.sleep(0.1)
        # serving starts before a process's first pass: the detector's per-topic gauges appear after its
        # first refresh of the store gauges, so scrape until every name is there (or the deadline says not)
        while True:
            exported: dict[str, set[str]] = {}
            for port in ports:
                for name, labels in scrape(port).items():
                    exported.setdefault(name, set()).update(labels)
            if not unknown_names(exported) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert "chronos_operator_actions_total" in exported, sorted(exported)
        assert "cell" in exported["chronos_rows_due"] and "cell" in exported["chronos_consumer_cell_paused"]
        assert "chronos_embedded_broker_rss_bytes" in exported, sorted(exported)
        assert unknown_names(exported) == []
        # and the metrics reference of the docs lists every family they serve
        assert set().union(*(exported_families(port) for port in ports)) - documented_metrics() == set()
    finally:
        for proc, _ in procs:
            proc.terminate()
        for proc, _ in procs:
            proc.wait(15)


def prometheus() -> str:
    """prometheus from the venv (the Makefile puts it there) or PATH; missing is a failure, not a skip."""
    here = Path(sys.executable).parent / "prometheus"
    found = str(here) if here.exists() else shutil.which("prometheus")
    if not found:
        pytest.fail("prometheus not found: `make test` fetches it into .venv/bin (from Debian's prometheus package)")
    return found


def test_prometheus_finds_every_program_of_a_host_up_from_the_targets_chronos_targets_prints(chronos_env, tmp_path):
    """A host of one consumer and one firer and no detector, each program on its supervisord port (base + the
    role's offset + its number): the shipped scrape configuration with the host's file from `chronos targets`
    scrapes both, and has nothing down."""
    base = free_port()
    layout = {"CHRONOS_CONSUMERS": "1", "CHRONOS_FIRERS": "1", "CHRONOS_DETECTORS": "0", "CHRONOS_METRICS_PORT": str(base)}
    procs = []
    try:
        for role in ("consumer", "firer"):
            log = tmp_path / f"{role}.log"
            procs.append(subprocess.Popen([sys.executable, "-m", "chronos", role],
                                          env={**os.environ, **chronos_env, **layout, "CHRONOS_PROCESS_NUM": "0",
                                               "CHRONOS_METRICS_ADDRESS": "127.0.0.1"},
                                          stdout=open(log, "wb"), stderr=subprocess.STDOUT))
        monitoring = tmp_path / "monitoring"
        shutil.copytree(SCRAPE.parent, monitoring)
        for old in (monitoring / "chronos-targets").glob("*.yml"):
            old.unlink()
        (monitoring / "chronos-targets" / "host.yml").write_text(
            targets_of({**layout, "CHRONOS_METRICS_ADDRESS": "127.0.0.1"}))
        config = yaml.safe_load((monitoring / "prometheus-scrape.yml").read_text())
        config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
        (monitoring / "prometheus-scrape.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        procs.append(subprocess.Popen([prometheus(), f"--config.file={monitoring / 'prometheus-scrape.yml'}",
                                       f"--storage.tsdb.path={tmp_path / 'tsdb'}", "--log.level=warn",
                                       f"--web.listen-address=127.0.0.1:{port}"],
                                      stdout=open(tmp_path / "prometheus.log", "wb"), stderr=subprocess.STDOUT))

        def targets() -> dict[str, str]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/targets", timeout=5) as answer:
                    active = json.loads(answer.read())["data"]["activeTargets"]
            except OSError:
                return {}
            return {t["labels"]["program"]: t["health"] for t in active}
        deadline = time.monotonic() + 60
        while targets() != {"consumer": "up", "firer": "up"}:
            assert all(p.poll() is None for p in procs), (tmp_path / "prometheus.log").read_text()
            assert time.monotonic() < deadline, targets()
            time.sleep(0.5)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(15)
