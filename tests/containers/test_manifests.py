"""The Kubernetes manifests (deploy/kubernetes), checked without a cluster: the core resources against the
Kubernetes API's schemas (kubernetes-validate), the alert rules against the shipped rules file and promtool, and
what Chronos needs of them (probes, ports, secrets, the image of this release). The pod that runs them is
tests/containers/test_pod.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from chronos import __version__
from chronos.config import OPTIONS
from containerkit import CRD_GROUP, PAGE, ROLES, ROOT, container_of, deployment, documents, pod_spec, resource

RULES = ROOT / "monitoring" / "prometheus-rules.yml"
MEASURED = ROOT / "benchmarks" / "results" / "2026-11-28" / "containers"
PROMTOOL = Path(sys.executable).parent / "promtool"
# the oldest release whose schemas have every field the manifests use, and the newest the validator knows
KUBERNETES = ("1.29.0", kubernetes_validate.latest_version())


@pytest.mark.parametrize("version", KUBERNETES)
def test_the_core_resources_are_valid_against_the_kubernetes_schemas(version):
    checked = []
    for name, doc in documents():
        if doc["apiVersion"].startswith(CRD_GROUP):
            continue
        # strict: a misspelt or misplaced field is an error, not a field Kubernetes would silently drop
        kubernetes_validate.validate(doc, version, strict=True)
        checked.append((name, doc["kind"]))
    kinds = {kind for _, kind in checked}
    assert {"ConfigMap", "Secret", "Job", "Deployment", "PodDisruptionBudget", "NetworkPolicy"} <= kinds, checked


def test_a_misspelt_field_fails_the_validation():
    broken = deployment("firer")
    pod_spec(broken)["terminationGracePeriod"] = 60
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES[-1], strict=True)


def test_the_prometheus_rule_is_the_shipped_rules_file_and_passes_promtool(tmp_path):
    rule = resource("PrometheusRule", "chronos")
    assert rule["spec"] == yaml.safe_load(RULES.read_text()), \
        "deploy/kubernetes/monitoring.yaml's PrometheusRule must hold monitoring/prometheus-rules.yml's groups as they are"
    extracted = tmp_path / "rules.yml"
    extracted.write_text(yaml.safe_dump(rule["spec"]))
    done = subprocess.run([str(PROMTOOL), "check", "rules", str(extracted)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_pod_monitor_scrapes_every_role_as_the_job_the_rules_name():
    monitor = resource("PodMonitor", "chronos")
    port = int(resource("ConfigMap", "chronos")["data"]["CHRONOS_METRICS_PORT"])
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert 'up{job="chronos"}' in RULES.read_text()
    for role in ROLES:
        labels = deployment(role)["spec"]["template"]["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items(), role
        assert labels[monitor["spec"]["jobLabel"]] == "chronos"
        ports = {p["name"]: p["containerPort"] for p in container_of(deployment(role))["ports"]}
        assert ports[endpoint["port"]] == port and endpoint["path"] == "/metrics"


def test_every_role_runs_twice_with_probes_a_budget_and_the_image_of_this_release():
    for role in ROLES:
        workload = deployment(role)
        container = container_of(workload)
        assert workload["spec"]["replicas"] == 2 and container["args"] == [role]
        assert container["image"] == f"chronos:{__version__}"
        assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
        assert container["startupProbe"]["httpGet"] == {"path": "/livez", "port": "metrics"}
        assert {"requests", "limits"} <= container["resources"].keys()
        budget = resource("PodDisruptionBudget", f"chronos-{role}")
        assert budget["spec"]["selector"] == workload["spec"]["selector"] and budget["spec"]["maxUnavailable"] == 1
    job = resource("Job", "chronos-migrate")
    assert container_of(job)["args"] == ["migrate"] and container_of(job)["image"] == f"chronos:{__version__}"


def test_no_password_is_in_the_settings_or_on_a_command_line():
    settings = resource("ConfigMap", "chronos")["data"]
    known = {option.env for option in OPTIONS}
    assert set(settings) <= known, set(settings) - known  # every key a setting Chronos reads
    assert not any(word in key for key in settings for word in ("PASSWORD", "TOKEN", "SECRET"))
    workloads = [deployment(role) for role in ROLES] + [resource("Job", "chronos-migrate")]
    for workload in workloads:
        container = container_of(workload)
        assert not container.get("command") and all("password" not in arg.lower() for arg in container["args"])
        urls = [settings["CHRONOS_DATABASE_URL"]] + [e["value"] for e in container.get("env", [])
                                                     if e["name"] == "CHRONOS_DATABASE_URL"]
        assert all(urlsplit(url).password is None for url in urls), urls
        secrets = {e["name"] for e in container.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}
        assert secrets == {"PGPASSWORD"}, secrets


def test_the_network_policy_lets_prometheus_in_on_the_metrics_port_alone():
    policy = resource("NetworkPolicy", "chronos")
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "chronos"}
    (ingress,) = policy["spec"]["ingress"]
    assert ingress["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}


def test_the_requests_cover_the_measured_figures_the_page_gives():
    """Each role's requests are at least what one container of it used under the measured load (CPU on average,
    memory at its highest), and the page's table gives those figures as the result file has them."""
    measured = json.loads((MEASURED / "resources.json").read_text())
    page = PAGE.read_text()
    for role in ROLES:
        figures = measured["roles"][role]
        resources = container_of(deployment(role))["resources"]
        cpu, memory = resources["requests"]["cpu"], resources["requests"]["memory"]
        limit = resources["limits"]["memory"]
        assert int(cpu.removesuffix("m")) / 1000 >= figures["cpu_cores_mean"], role
        # procstat's MB are 2**20 bytes, as Kubernetes's Mi
        assert int(memory.removesuffix("Mi")) >= figures["rss_mb_max"] and int(limit.removesuffix("Mi")) > int(
            memory.removesuffix("Mi")), role
        row = (f"| {role} | {figures['cpu_cores_mean']:.3f} cores | {figures['cpu_cores_max_5s']:.3f} cores | "
               f"{figures['rss_mb_max']:.1f} MB | {cpu}, {memory} | {limit} |")
        assert row in page, row
    assert measured["sent"] == measured["delivered"] and f"{measured['rate']:,.0f} msg/s" in page


def test_the_page_gives_the_image_sizes_and_build_times_of_the_result_file():
    page = " ".join(PAGE.read_text().split())
    for layer in json.loads((MEASURED / "image.json").read_text()):
        assert layer["built"], layer  # every layer made, none found up to date
        assert f"{layer['size'] / 1e6:.0f} MB in {layer['seconds']:.0f} s" in page, layer
