"""The container tests' kit: the containers page and the image's tag; the Kubernetes manifests (deploy/kubernetes)
as the tests read them, and a pod of theirs run by podman as far as podman goes: each container of a pod's spec
becomes a `podman run` with the same image, arguments, environment, secret files, user, read-only root, dropped
capabilities and memory limit; what a kubelet would do besides (probes, the grace period on stop) the tests do
themselves."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import yaml

from chronos import __version__

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "operations" / "containers.md"
TAG = f"localhost/chronos:{__version__}"  # what `make image` tags this release's image
MANIFESTS = ROOT / "deploy" / "kubernetes"
ROLES = ("consumer", "firer", "detector")
CRD_GROUP = "monitoring.coreos.com/"  # the Prometheus Operator's kinds, which the API's own schemas do not cover


def documents() -> Iterator[tuple[str, dict[str, Any]]]:
    """(file name, resource) of every manifest, in file order."""
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            yield path.name, doc


def resource(kind: str, name: str) -> dict[str, Any]:
    (found,) = [doc for _, doc in documents() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    return found


def deployment(role: str) -> dict[str, Any]:
    return resource("Deployment", f"chronos-{role}")


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def grace_s(role: str) -> int:
    return int(pod_spec(deployment(role))["terminationGracePeriodSeconds"])


def _quantity_mb(quantity: str) -> int:
    units = {"Mi": 1, "Gi": 1024}
    return int(quantity[:-2]) * units[quantity[-2:]]


def podman_options(workload: dict[str, Any], secret_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The `podman run` options and environment of the (one) container of `workload`'s pod: its environment from the
    ConfigMap and the Secret it names (the Secret's files written under `secret_dir`, mounted where the spec mounts
    them), its user, its memory limit. The read-only root, the capabilities dropped and no privilege escalation it
    asks for are what `kits.podman.run` gives every container. The image and arguments are
    `container_of`'s."""
    pod = pod_spec(workload)
    (container,) = pod["containers"]
    config = resource("ConfigMap", "chronos")["data"]
    secret = resource("Secret", "chronos")["stringData"]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(resource("ConfigMap", source["configMapRef"]["name"])["data"])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "secretKeyRef" in var["valueFrom"]:
            env[var["name"]] = secret[var["valueFrom"]["secretKeyRef"]["key"]]
        else:
            env[var["name"]] = config[var["valueFrom"]["configMapKeyRef"]["key"]]
    user = pod["securityContext"]
    options = ["--user", f"{user['runAsUser']}:{user['runAsGroup']}"]
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] and context["capabilities"]["drop"] == ["ALL"]
    assert context["allowPrivilegeEscalation"] is False
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "secret" in volume:
            where = secret_dir / mount["name"]
            where.mkdir(parents=True, exist_ok=True)
            for item in volume["secret"]["items"]:
                (where / item["path"]).write_text(secret[item["key"]])
                (where / item["path"]).chmod(0o444)
            options += ["--volume", f"{where}:{mount['mountPath']}:ro"]
        else:
            size = volume["emptyDir"]["sizeLimit"]
            options += ["--tmpfs", f"{mount['mountPath']}:size={_quantity_mb(size)}m"]
    memory = container.get("resources", {}).get("limits", {}).get("memory")
    if memory:
        options += ["--memory", f"{_quantity_mb(memory)}m"]
    return options, env


def container_of(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod_spec(workload)["containers"]
    return container
